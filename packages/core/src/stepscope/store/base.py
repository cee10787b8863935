"""The store interface both backends implement."""

from __future__ import annotations

import abc
import builtins
import io
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
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
    if any(part in ("", ".", "..") for part in key.rstrip("/").split("/")):
        raise StoreError(f"invalid key {key!r}: empty, '.' or '..' parts would leave or alias the job's folder")
    return key


class Store(abc.ABC):
    """Keys are relative POSIX paths ("index/000000000/000000000005_worker_0.json")."""

    url: str

    @abc.abstractmethod
    def write(self, key: str, data: bytes | Sequence[bytes | memoryview]) -> None:
        """Publish a whole object atomically. `data` may be several buffers (not joined)."""

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
    def delete(self, key: str) -> None: ...

    def read_ranges(self, requests: Iterable[tuple[str, int, int]], max_workers: int = 16) -> builtins.list[bytes]:
        """Several ranged reads, concurrently where the backend gains from it."""
        requests = list(requests)
        if len(requests) <= 1 or not self.concurrent_reads:
            return [self.read_range(*r) for r in requests]
        with ThreadPoolExecutor(max_workers=min(max_workers, len(requests))) as pool:
            return list(pool.map(lambda r: self.read_range(*r), requests))

    concurrent_reads = False

    def describe(self, key: str = "") -> str:
        """A human name for a key, for error messages (full path or URL)."""
        return join_key(self.url, key) if key else self.url

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.url!r})"
