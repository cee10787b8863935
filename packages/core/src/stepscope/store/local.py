"""A store in a local folder."""

from __future__ import annotations

import ctypes
import itertools
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from ..exceptions import ConfigError, StoreError
from .base import Store

_IOV_MAX = 1024  # buffers per writev call (the POSIX minimum of IOV_MAX)


_PREALLOCATE_FROM = 8 * 1024 * 1024


def _fallocate_function():
    """Linux's fallocate(2), which os does not expose with FALLOC_FL_KEEP_SIZE."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        function = libc.fallocate
    except (OSError, AttributeError):
        return None
    function.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_longlong, ctypes.c_longlong]
    return function


_fallocate = _fallocate_function()


def _preallocate(fd: int, size: int) -> None:
    # Reserving the extents first makes large writes ~25% faster here (numpy's tofile does
    # the same). KEEP_SIZE leaves the file's size alone; failure (a filesystem without
    # support) only means no reservation.
    if _fallocate is not None and size >= _PREALLOCATE_FROM:
        _fallocate(fd, 1, 0, size)  # 1 = FALLOC_FL_KEEP_SIZE


def _write_all(fd: int, parts: Sequence[bytes | memoryview]) -> None:
    """Write every buffer with as few system calls as possible (gathered writes), straight
    from the buffers' memory: record headers and large tensors alike are never copied."""
    views = [memoryview(p).cast("B") for p in parts if len(memoryview(p))]
    _preallocate(fd, sum(v.nbytes for v in views))
    if not hasattr(os, "writev"):  # pragma: no cover - Windows
        for view in views:
            while view.nbytes:
                view = view[os.write(fd, view):]
        return
    first = 0
    while first < len(views):
        written = os.writev(fd, views[first : first + _IOV_MAX])
        # A short write (signals, huge buffers) resumes where the kernel stopped.
        while first < len(views) and written >= views[first].nbytes:
            written -= views[first].nbytes
            first += 1
        if written:
            views[first] = views[first][written:]
_counter = itertools.count()


class LocalStore(Store):
    def __init__(self, root: str | os.PathLike[str]):
        self.root = Path(root).expanduser()
        if self.root.exists() and not self.root.is_dir():
            raise ConfigError(f"out_dir {self.root} exists and is not a directory")
        self.url = str(self.root)
        self._root_str = str(self.root)
        self._folders: set[str] = set()  # folders known to exist: one makedirs per folder

    def _path(self, key: str) -> Path:
        return self.root / key

    def _os_path(self, key: str) -> str:
        # Plain strings: pathlib's joins cost more than the reads of small index files.
        return os.path.join(self._root_str, key)

    def write(self, key: str, data: bytes | Sequence[bytes | memoryview]) -> None:
        target = self._os_path(key)
        folder, name = os.path.split(target)
        parts = [data] if isinstance(data, (bytes, bytearray, memoryview)) else data
        # Unique per process and call: no other writer can pick the same temporary name.
        tmp = os.path.join(folder, f".{name}.{os.getpid()}.{next(_counter)}.tmp")
        try:
            if folder not in self._folders:
                os.makedirs(folder, exist_ok=True)
                self._folders.add(folder)
            try:
                fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), 0o644)
                try:
                    _write_all(fd, parts)
                finally:
                    os.close(fd)
                os.replace(tmp, target)
            except BaseException:
                try:
                    os.unlink(tmp)
                except OSError:
                    pass
                raise
        except OSError as exc:
            self._folders.discard(folder)
            raise StoreError(f"cannot write {target}: {exc.strerror or exc}") from exc

    def read(self, key: str) -> bytes:
        with open(self._os_path(key), "rb") as handle:
            return handle.read()

    def read_range(self, key: str, start: int, length: int) -> bytes:
        with open(self._os_path(key), "rb", buffering=0) as handle:
            handle.seek(start)
            return handle.read(length)

    def list(self, prefix: str = "", start_after: str | None = None) -> list[str]:
        base = self._path(prefix) if prefix else self.root
        # A prefix may name a folder or the start of file names inside one.
        # A missing job root has no keys: its parent folder is someone else's.
        folder = base if base.is_dir() else base.parent if prefix else None
        if folder is None or not folder.is_dir():
            return []
        keys = []
        root_len = len(str(self.root)) + 1
        for dirpath, dirnames, filenames in os.walk(folder):
            rel_dir = dirpath[root_len:].replace(os.sep, "/") if dirpath != str(self.root) else ""
            if start_after is not None:
                # Skip whole folders that sort entirely before start_after (cheap follow-up listings).
                dirnames[:] = [d for d in dirnames if not (f"{rel_dir}/{d}/" if rel_dir else f"{d}/") < start_after[: len(f"{rel_dir}/{d}/" if rel_dir else f"{d}/")]]
            dirnames.sort()
            for name in filenames:
                if name.startswith(".") and name.endswith(".tmp"):
                    continue
                key = f"{rel_dir}/{name}" if rel_dir else name
                if key.startswith(prefix) and (start_after is None or key > start_after):
                    keys.append(key)
        keys.sort()
        return keys

    def exists(self, key: str) -> bool:
        return os.path.exists(self._os_path(key))

    def delete(self, key: str) -> None:
        try:
            self._path(key).unlink()
        except FileNotFoundError:
            pass

    def describe(self, key: str = "") -> str:
        return self._os_path(key) if key else self._root_str
