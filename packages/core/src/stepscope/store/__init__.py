"""Where a job's files live: a local folder or an S3 prefix, behind one interface.

Objects are immutable once published: a local file is written aside and renamed, an S3
object is PUT whole (or as one multipart upload), so a reader never sees half a file."""

from __future__ import annotations

from .base import FolderListing, Store, join_key
from .local import LocalStore


def open_store(url: str | Store) -> Store:
    """A store for a local path (plain or file://) or an s3://bucket/prefix URL."""
    if isinstance(url, Store):
        return url
    url = str(url)
    if url.startswith("s3://"):
        from .s3 import S3Store  # boto3 is imported only when S3 is used

        return S3Store(url)
    if url.startswith("file://"):
        url = url[len("file://") :]
    return LocalStore(url)


__all__ = ["Store", "FolderListing", "LocalStore", "open_store", "join_key"]
