"""A store in a local folder."""

from __future__ import annotations

import builtins
import ctypes
import itertools
import os
import stat
import sys
from collections.abc import Sequence
from pathlib import Path

from ..exceptions import ConfigError, StoreError
from .base import Store, check_key

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
        self._real_root = os.path.realpath(self._root_str)
        self._safe_folders: set[str] = set()  # folders checked to lie inside the job

    def _path(self, key: str) -> Path:
        return self.root / key

    def _os_path(self, key: str) -> str:
        # Plain strings: pathlib's joins cost more than the reads of small index files.
        return os.path.join(self._root_str, key)

    def write(self, key: str, data: bytes | Sequence[bytes | memoryview]) -> None:
        target = self._os_path(check_key(key))
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

    def _open_regular(self, key: str) -> int:
        """A descriptor for reading `key`, which must be a regular file inside the job:
        no symbolic link (at the name or in a folder above it), no FIFO or device (opening
        one could block forever or read without end)."""
        path = self._os_path(check_key(key))
        self._check_folder(os.path.dirname(path), key)
        flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
        try:
            fd = os.open(path, flags)
        except FileNotFoundError:
            raise
        except OSError as exc:
            if os.path.islink(path):
                raise StoreError(f"{path} is a symbolic link; stepscope reads only regular files inside the job") from None
            if isinstance(exc, (IsADirectoryError, NotADirectoryError)):
                raise StoreError(f"cannot read {path}: not a regular file") from None
            raise StoreError(f"cannot read {path}: {exc.strerror or exc}") from exc
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            raise StoreError(f"{path} is not a regular file; stepscope reads only regular files")
        return fd

    def _check_folder(self, folder: str, key: str) -> None:
        if folder in self._safe_folders:
            return
        real = os.path.realpath(folder)
        if real != self._real_root and not real.startswith(self._real_root + os.sep):
            if os.path.lexists(folder):
                raise StoreError(f"{self._os_path(key)} lies outside the job (a symbolic link in its path); not read")
            raise FileNotFoundError(self._os_path(key))
        expected = os.path.normpath(os.path.join(self._real_root, os.path.relpath(folder, self._root_str)))
        if real != expected:
            raise StoreError(f"{self._os_path(key)}: a folder on its path is a symbolic link; not read")
        self._safe_folders.add(folder)

    def read(self, key: str, max_size: int | None = None) -> bytes:
        fd = self._open_regular(key)
        try:
            size = os.fstat(fd).st_size
            if max_size is not None and size > max_size:
                raise StoreError(f"{self._os_path(key)} is {size} bytes, more than the {max_size} a file of its kind may have")
            chunks = []
            while True:
                chunk = os.read(fd, max(size, 1 << 16))
                if not chunk:
                    break
                chunks.append(chunk)
                if max_size is not None and sum(len(c) for c in chunks) > max_size:
                    raise StoreError(f"{self._os_path(key)} grew past {max_size} bytes while being read")
            return b"".join(chunks)
        finally:
            os.close(fd)

    def read_range(self, key: str, start: int, length: int) -> bytes:
        if start < 0:
            raise StoreError(f"cannot read {self._os_path(key)} from byte {start}")
        if length <= 0:
            return b""
        fd = self._open_regular(key)
        try:
            # Never allocate more than the file holds (a crafted index may ask for a terabyte).
            length = min(length, max(0, os.fstat(fd).st_size - start))
            return os.pread(fd, length, start) if length else b""
        finally:
            os.close(fd)

    def list(self, prefix: str = "", start_after: str | None = None) -> list[str]:
        base = self._path(prefix) if prefix else self.root
        # A prefix may name a folder or the start of file names inside one.
        # A missing job root has no keys: its parent folder is someone else's.
        folder = base if base.is_dir() and not base.is_symlink() else base.parent if prefix else None
        if folder is None or not folder.is_dir() or folder.is_symlink():
            return []
        keys: builtins.list[str] = []
        rel = os.path.relpath(folder, self.root).replace(os.sep, "/")
        self._walk(str(folder), "" if rel == "." else rel, prefix, start_after, keys)
        keys.sort()
        return keys

    def _walk(self, folder: str, rel_dir: str, prefix: str, start_after: str | None, keys: builtins.list[str]) -> None:
        # Only regular files and real folders (d_type: no extra system call per entry);
        # symbolic links, FIFOs and sockets are not part of a job.
        try:
            entries = list(os.scandir(folder))
        except OSError:
            return
        for entry in entries:
            name = entry.name
            key = f"{rel_dir}/{name}" if rel_dir else name
            if entry.is_dir(follow_symlinks=False):
                sub = key + "/"
                # Skip whole folders that sort entirely before start_after (cheap follow-up listings).
                if start_after is not None and sub < start_after[: len(sub)]:
                    continue
                if not (sub.startswith(prefix) or prefix.startswith(sub)):
                    continue
                self._walk(entry.path, key, prefix, start_after, keys)
            elif entry.is_file(follow_symlinks=False):
                if name.startswith(".") and name.endswith(".tmp"):
                    continue
                if key.startswith(prefix) and (start_after is None or key > start_after):
                    keys.append(key)

    def remove_stale_temporaries(self, marker: str, max_folders: int = 100_000) -> int:
        """Delete temporary files (".NAME.PID.N.tmp") whose NAME contains `marker` (a worker's
        own files) left by a process that died before renaming them. Returns how many."""
        removed = 0
        pid = f".{os.getpid()}."
        seen = 0
        for dirpath, _dirnames, filenames in os.walk(self._root_str):
            seen += 1
            if seen > max_folders:
                break
            for name in filenames:
                if name.startswith(".") and name.endswith(".tmp") and marker in name and pid not in name:
                    try:
                        os.unlink(os.path.join(dirpath, name))
                        removed += 1
                    except OSError:
                        pass
        return removed

    def exists(self, key: str) -> bool:
        return os.path.exists(self._os_path(key))

    def delete(self, key: str) -> None:
        try:
            self._path(key).unlink()
        except FileNotFoundError:
            pass

    def describe(self, key: str = "") -> str:
        return self._os_path(key) if key else self._root_str
