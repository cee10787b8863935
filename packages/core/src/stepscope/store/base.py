"""The store interface both backends implement."""

from __future__ import annotations

import abc
import builtins
import io
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import BinaryIO

from ..exceptions import StoreError

Buffer = "bytes | bytearray | memoryview"


def join_key(*parts: str) -> str:
    return "/".join(p.strip("/") for p in parts if p and p.strip("/"))


def check_key(key: str) -> str:
    """`key` if it names something inside the job, else StoreError: keys come from job
    files too (an index's event_file_name), and a crafted one must not leave the job."""
    if not isinstance(key, str) or not key or "\x00" in key or "\\" in key or key.startswith("/"):
        raise StoreError(f"invalid key {key!r}: not a relative path inside the job")
    rest = key.rstrip("/")  # an empty, "." or ".." part (string tests: every read checks a key)
    if rest in (".", "..") or rest.startswith(("./", "../")) or rest.endswith(("/.", "/..")) or "//" in rest or "/./" in rest or "/../" in rest:
        raise StoreError(f"invalid key {key!r}: empty, '.' or '..' parts would leave or alias the job's folder")
    return key


@dataclass(frozen=True)
class FolderListing:
    """What sits directly in one folder of a store: file names and sub-folder names (not
    keys: no folder part), each sorted. A local store leaves out links and special files,
    which are no part of a job."""

    files: list[str] = field(default_factory=list)
    folders: list[str] = field(default_factory=list)


class Store(abc.ABC):
    """Keys are relative POSIX paths ("index/000000000/000000000005_worker_0.json").

    Everything a caller needs goes through these methods, for a local folder and S3 alike:
    no caller opens a path, a client or a private attribute of a backend. Where a backend
    has no such thing (a local path on S3), the method says so (None) rather than fails."""

    url: str

    @abc.abstractmethod
    def write(self, key: str, data: bytes | Sequence[bytes | memoryview]) -> None:
        """Publish a whole object atomically. `data` may be several buffers (not joined)."""

    def write_many(self, items: Sequence[tuple[str, bytes | Sequence[bytes | memoryview]]], published: Callable[[int], None] | None = None) -> None:
        """Publish several objects in order, each as `write` would (atomically, whole);
        `published(i)` is called once item `i` is published. A failure raises what `write`
        raises for that item: the items before it are published, the ones after it are not
        tried. A backend may do it with fewer system calls (a local folder opened once for
        all its files); this default writes them one by one."""
        for i, (key, data) in enumerate(items):
            self.write(key, data)
            if published is not None:
                published(i)

    @abc.abstractmethod
    def read(self, key: str, max_size: int | None = None) -> bytes:
        """The whole object; raises FileNotFoundError when absent, StoreError when it is
        not a regular file or (with `max_size`) larger than that."""

    def open_file(self, key: str, max_size: int | None = None) -> BinaryIO:
        """A binary file object of the whole object, for libraries that read files
        themselves (pyarrow, h5py): they get what the store opened under its path policy,
        never a path to open on their own."""
        return io.BytesIO(self.read(key, max_size))

    def size(self, key: str) -> int:
        """The object's size in bytes; FileNotFoundError when absent."""
        return len(self.read(key))

    @abc.abstractmethod
    def read_range(self, key: str, start: int, length: int) -> bytes:
        """`length` bytes from `start` (fewer only if the object is shorter)."""

    @abc.abstractmethod
    def list(self, prefix: str = "", start_after: str | None = None) -> list[str]:
        """Keys under `prefix`, sorted; with `start_after`, only keys sorting after it, so
        that following a growing job costs in proportion to what is new."""

    @abc.abstractmethod
    def exists(self, key: str) -> bool: ...

    @abc.abstractmethod
    def delete(self, key: str) -> None:
        """Remove the object; nothing happens when it is absent."""

    def delete_prefix(self, prefix: str) -> int:
        """Remove every object under `prefix` (a folder: "stepscope-traces/"); returns how
        many. An empty prefix is refused: it would be the whole job."""
        if not prefix.strip("/"):
            raise StoreError(f"refusing to delete everything in {self.describe()}: give a folder")
        keys = self.list(prefix)
        for key in keys:
            self.delete(key)
        return len(keys)

    def list_folder(self, folder: str = "") -> FolderListing:
        """The files and sub-folders directly in `folder` ("" is the root), for walking a
        tree of jobs one level at a time. This default derives it from a full listing; the
        backends list one level only."""
        base = folder.strip("/") + "/" if folder.strip("/") else ""
        files: set[str] = set()
        folders: set[str] = set()
        for key in self.list(base):
            name, sep, _rest = key[len(base) :].partition("/")
            (folders if sep else files).add(name)
        return FolderListing(sorted(files), sorted(folders))

    def is_empty(self) -> bool:
        """Whether nothing at all is stored (a mistyped path, a job not started). The
        backends stop at the first object instead of listing the whole job."""
        return not self.list("")

    def root_exists(self) -> bool:
        """Whether the store's root is there. A local folder may be missing (a mistyped
        path, or a job that has not started); an S3 prefix is no object, only a part of
        keys, so it is there as soon as its bucket is (see `probe`): S3 answers True."""
        return True

    def probe(self) -> None:
        """Nothing when the store can be listed; StoreError naming it when it cannot (a
        missing bucket or folder, no access, an endpoint that does not answer)."""
        self.list_folder("")

    def local_path(self, key: str = "") -> str | None:
        """The local filesystem path of `key` (of the root for ""), or None where the store
        has none (S3). For naming and for caches keyed by location; reading and writing
        still go through the store, whose path policy a plain open() would bypass."""
        return None

    def reopenable_url(self) -> str | None:
        """A URL that `open_store` in another process turns into this same store (a child
        process handed the job), or None where there is none (a store held in memory)."""
        return None

    def remove_stale_temporaries(self, marker: str) -> int:
        """Delete temporary files whose name contains `marker`, left by a process that
        died while publishing; returns how many. Only a local store has any (an S3 object
        is PUT whole)."""
        return 0

    def read_ranges(self, requests: Iterable[tuple[str, int, int]], max_workers: int = 16) -> builtins.list[bytes]:
        """Several ranged reads, concurrently where the backend gains from it."""
        requests = list(requests)
        if len(requests) <= 1 or not self.concurrent_reads:
            return [self.read_range(*r) for r in requests]
        with ThreadPoolExecutor(max_workers=min(max_workers, len(requests))) as pool:
            return list(pool.map(lambda r: self.read_range(*r), requests))

    concurrent_reads = False

    def data_alignment(self) -> int:
        """The file offset (a multiple of it) where a large tensor's bytes are best placed
        in this store's event files, or 0: anywhere. A local folder whose large files are
        written around the page cache says its block alignment (store/direct_io.py)."""
        return 0

    def describe(self, key: str = "") -> str:
        """A human name for a key, for error messages (full path or URL)."""
        return join_key(self.url, key) if key else self.url

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.url!r})"
