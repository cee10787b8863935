"""A store in a local folder."""

from __future__ import annotations

import builtins
import ctypes
import errno
import functools
import itertools
import os
import stat
import sys
import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, BinaryIO

from ..compiled import load_extension
from ..exceptions import ConfigError, StoreError
from .base import FolderListing, Store, check_key
from .direct_io import ALIGN, DIRECT_FROM, O_DIRECT, PLACE_FROM, DirectPolicy, DirectRefused, large_views, staging_buffer, write_direct

_IOV_MAX = 1024  # buffers per writev call (the POSIX minimum of IOV_MAX)


_PREALLOCATE_FROM = 8 * 1024 * 1024


def _libc_function(name: str) -> Any:
    """The C library's function `name` (errno kept), or None off Linux or where the library
    does not have it."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        return getattr(ctypes.CDLL(None, use_errno=True), name)
    except (OSError, AttributeError):
        return None


def _fallocate_function():
    """Linux's fallocate(2), which os does not expose with FALLOC_FL_KEEP_SIZE."""
    function = _libc_function("fallocate")
    if function is None:
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


# The most one system call writes. On Linux 6.x with ext4 (large page-cache folios), one
# large write costs several times the CPU of the same bytes in 256 KiB writes (3.2 MB in one
# write: 5-30 ms against 1-3 ms here): the page cache then allocates large folios for it,
# and finding those costs more than the copy. (On this VM a write also costs more once the
# guest runs out of recently freed pages, whatever its size: see store/direct_io.py.) A
# syscall per 256 KiB is nothing next to the copy, on every file system.
WRITE_SLICE = 256 << 10


def _write_all(fd: int, parts: Sequence[bytes | memoryview]) -> None:
    """Write every buffer straight from its memory (record headers and large tensors alike
    are never copied): small buffers gathered into one writev, large ones in WRITE_SLICE
    pieces, no call writing more than WRITE_SLICE."""
    if len(parts) == 1 and type(parts[0]) is bytes and len(parts[0]) <= WRITE_SLICE:  # a small file (an index): no views
        written = os.write(fd, parts[0])
        if written == len(parts[0]):
            return
        parts = [memoryview(parts[0])[written:]]  # a short write: the rest as below
    views = [memoryview(p).cast("B") for p in parts if len(memoryview(p))]
    _preallocate(fd, sum(v.nbytes for v in views))
    gathered: list[memoryview] = []
    size = 0
    for view in views:
        if size + view.nbytes > WRITE_SLICE:
            _write_gathered(fd, gathered)
            gathered, size = [], 0
            while view.nbytes > WRITE_SLICE:
                view = view[os.write(fd, view[:WRITE_SLICE]) :]
        gathered.append(view)
        size += view.nbytes
    _write_gathered(fd, gathered)


def _write_gathered(fd: int, views: list[memoryview]) -> None:
    """Write `views` (at most WRITE_SLICE bytes together) with as few calls as possible."""
    if not hasattr(os, "writev"):  # pragma: no cover - Windows
        for view in views:
            while view.nbytes:
                view = view[os.write(fd, view) :]
        return
    first = 0
    while first < len(views):
        written = os.writev(fd, views[first : first + _IOV_MAX])
        # A short write (signals) resumes where the kernel stopped.
        while first < len(views) and written >= views[first].nbytes:
            written -= views[first].nbytes
            first += 1
        if written:
            views[first] = views[first][written:]


_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
# A folder on a key's way: opened relative to its parent, never through a symbolic link.
_FOLDER_FLAGS = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | _NOFOLLOW | _CLOEXEC
# A file read: no link at the name, and O_NONBLOCK so that a FIFO cannot block the open.
_READ_FLAGS = os.O_RDONLY | _NOFOLLOW | getattr(os, "O_NONBLOCK", 0) | _CLOEXEC
_WRITE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW | _CLOEXEC
MAX_DEPTH = 32  # folders below a job's root; a job writes at most ~6 (deeper: not listed)
_ROOT_FLAGS = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | _CLOEXEC


# A run of small files published with the GIL released (_publish.c), or None: not built (no
# C compiler, Windows) or $STEPSCOPE_PURE_PYTHON.
_publish_small: Callable[[int, list[tuple[str, str, bytes]]], tuple[int, OSError | None]] | None = getattr(
    load_extension(__package__, "_publish"), "publish_small", None
)


# A large file written around the page cache in one call (_publish.c: direct_io.py says why),
# or None: not built, not Linux, or $STEPSCOPE_PURE_PYTHON.
_publish_direct: Callable[..., int | str] | None = getattr(load_extension(__package__, "_publish"), "publish_direct", None)

# The files of one write_many, their folders walked and the files published in one call
# (_publish.c's publish_files: why there), or None where `_publish_direct` is.
_publish_files: Callable[..., tuple[int, str | OSError | None]] | None = getattr(load_extension(__package__, "_publish"), "publish_files", None)

_counter = itertools.count()
# This process's id, for temporary names: asked once (getpid is a system call per file, on
# C libraries that no longer cache it) and again in a forked child.
_process = {"pid": os.getpid()}


def _temporary(name: str) -> str:
    """A temporary name for file `name` in its folder, unique per process and call: no
    other writer can pick it (remove_stale_temporaries reads its parts back)."""
    return f".{name}.{_process['pid']}.{next(_counter)}.tmp"


def _utf8(name: str) -> bool:
    """Whether `name` is what the C publishers take: UTF-8 (os functions also write names
    holding surrogates, os.fsdecode's undecodable bytes; those stay in Python)."""
    if name.isascii():  # (a flag of the string: no scan)
        return True
    try:
        name.encode()
    except UnicodeEncodeError:
        return False
    return True


def _parts(data: bytes | Sequence[bytes | memoryview]) -> Sequence[bytes | memoryview]:
    return [data] if isinstance(data, (bytes, bytearray, memoryview)) else data


def _publish_in(folder_fd: int, name: str, parts: Sequence[bytes | memoryview], direct: DirectPolicy | None = None) -> None:
    """Publish file `name` in the folder `folder_fd` atomically: written whole under a
    temporary name, then renamed over `name`. A large file goes around the page cache
    where `direct` allows it (direct_io.py); refused, it is written again the usual way."""
    if direct is not None and O_DIRECT and direct.allowed():
        large = large_views(parts)
        if large is not None and _publish_direct is not None:
            if _direct_in_c(folder_fd, name, large[0], direct):
                return
            large = None  # (refused: written the usual way below)
        if large is not None:
            views, size = large

            def write(fd: int) -> None:
                _preallocate(fd, size)
                write_direct(fd, views)

            try:
                _publish_with(folder_fd, name, _WRITE_FLAGS | O_DIRECT, write)
                return
            except DirectRefused as exc:
                direct.refused(exc)
    _publish_with(folder_fd, name, _WRITE_FLAGS, functools.partial(_write_all, parts=parts))


def _direct_in_c(folder_fd: int, name: str, views: list[memoryview], direct: DirectPolicy) -> bool:
    """`_publish_in`'s direct write of a large file's `views` (`large_views`) done by
    `_publish_direct` (what `_publish_with` and `write_direct` do, in one call): True when
    the file is published; False when the file system refused (`direct` told), and the
    caller writes it the usual way."""
    assert _publish_direct is not None
    done = _publish_direct(folder_fd, _temporary(name), name, views, staging_buffer(),
                           _WRITE_FLAGS, ALIGN, PLACE_FROM, _PREALLOCATE_FROM)  # fmt: skip
    if type(done) is int:  # (the bytes placed: published)
        return True
    direct.refused(DirectRefused(done))
    return False


def _publish_with(folder_fd: int, name: str, flags: int, write: Callable[[int], None]) -> None:
    """`_publish_in` with the temporary file opened with `flags` and filled by `write`."""
    tmp = _temporary(name)
    try:
        fd = os.open(tmp, flags, 0o644, dir_fd=folder_fd)
    except OSError as exc:
        if flags & O_DIRECT and exc.errno == errno.EINVAL:
            raise DirectRefused(str(exc)) from exc
        raise
    try:
        try:
            write(fd)
        finally:
            os.close(fd)
        # A link or special file at the name is replaced (rename never follows it),
        # never written through.
        os.replace(tmp, name, src_dir_fd=folder_fd, dst_dir_fd=folder_fd)
    except BaseException:
        try:
            os.unlink(tmp, dir_fd=folder_fd)
        except OSError:
            pass
        raise


class _OpenHow(ctypes.Structure):
    _fields_ = [("flags", ctypes.c_uint64), ("mode", ctypes.c_uint64), ("resolve", ctypes.c_uint64)]


_SYS_OPENAT2 = 437  # the same number on every Linux architecture (the unified syscall table)
_RESOLVE = 0x02 | 0x04 | 0x08  # RESOLVE_NO_MAGICLINKS | RESOLVE_NO_SYMLINKS | RESOLVE_BENEATH


def _openat2_function() -> Any:
    """openat2(2) as `f(dir_fd, relative_path, flags) -> fd or -errno`, or None where the
    kernel (before 5.6), the C library or a sandbox does not offer it."""
    syscall = _libc_function("syscall")
    if syscall is None:
        return None
    syscall.restype = ctypes.c_long
    syscall.argtypes = [ctypes.c_long, ctypes.c_int, ctypes.c_char_p, ctypes.c_void_p, ctypes.c_size_t]
    # One `open_how` per set of flags, made once: reads are the hot path.
    hows: dict[int, _OpenHow] = {}
    encoding, errors = sys.getfilesystemencoding(), sys.getfilesystemencodeerrors()  # os.fsencode's

    def openat2(dir_fd: int, rel: str, flags: int) -> int:
        how = hows.get(flags)
        if how is None:
            how = hows[flags] = _OpenHow(flags, 0, _RESOLVE)
        fd = syscall(_SYS_OPENAT2, dir_fd, rel.encode(encoding, errors), ctypes.addressof(how), ctypes.sizeof(how))
        return int(fd) if fd >= 0 else -ctypes.get_errno()

    try:
        probe = os.open("/", _ROOT_FLAGS)
    except OSError:
        return None
    try:
        fd = openat2(probe, ".", _ROOT_FLAGS)
    finally:
        os.close(probe)
    if fd < 0:  # ENOSYS, or EPERM from a seccomp filter
        return None
    os.close(fd)
    return openat2


_openat2 = _openat2_function()


class _HeldRoot:
    __slots__ = ("fd", "users", "retired")

    def __init__(self, fd: int):
        self.fd, self.users, self.retired = fd, 0, False


class _RootDescriptors:
    """Descriptors of job roots kept open between reads, shared by the stores of a process
    and bounded in number (a server holds a store per job: one descriptor each would run
    out). Each read resolves its key below a held root (openat2, or the folder walk), so
    the root is opened once per job instead of once per read, and the folders below it
    are still checked by the kernel on every read (a folder swapped for a link is refused).
    A root evicted while a read uses it is closed when that read is done. A held root
    that no longer is the folder at its path (the job deleted and made again, or moved)
    is noticed on a missing file or a listing, and opened again."""

    def __init__(self, capacity: int):
        self.capacity = capacity
        self._lock = threading.Lock()
        self._held: OrderedDict[str, _HeldRoot] = OrderedDict()

    def acquire(self, root: str) -> _HeldRoot:
        """The held root of `root`, opened if need be (OSError when it cannot be)."""
        with self._lock:
            held = self._held.get(root)
            if held is not None:
                self._held.move_to_end(root)
                held.users += 1
                return held
        fresh = _HeldRoot(os.open(root, _ROOT_FLAGS))
        with self._lock:
            held = self._held.get(root)
            if held is None:  # else another thread opened it meanwhile: use that one
                held = self._held[root] = fresh
                while len(self._held) > self.capacity:
                    self._retire(self._held.popitem(last=False)[1])
            held.users += 1
        if held is not fresh:
            os.close(fresh.fd)
        return held

    def release(self, held: _HeldRoot) -> None:
        with self._lock:
            held.users -= 1
            if held.retired and held.users == 0:
                os.close(held.fd)

    def is_current(self, root: str, held: _HeldRoot) -> bool:
        """Whether `held` is still the folder at `root`; if not, it is let go."""
        try:
            now, then = os.stat(root), os.fstat(held.fd)
            if (now.st_dev, now.st_ino) == (then.st_dev, then.st_ino):
                return True
        except OSError:
            pass
        self.forget(root, held)
        return False

    def forget(self, root: str, held: _HeldRoot | None = None) -> None:
        with self._lock:
            current = self._held.get(root)
            if current is not None and (held is None or current is held):
                del self._held[root]
                self._retire(current)

    def _retire(self, held: _HeldRoot) -> None:  # under the lock
        held.retired = True
        if held.users == 0:
            os.close(held.fd)

    def after_fork_in_child(self) -> None:
        """A forked child has one thread: reads under way in the parent's others never end
        there, and the lock may have been held by one of them."""
        self._lock = threading.Lock()
        for held in self._held.values():
            held.users = 0


_roots = _RootDescriptors(capacity=64)
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=lambda: _roots.after_fork_in_child())
    os.register_at_fork(after_in_child=lambda: _process.update(pid=os.getpid()))


class PathRefused(StoreError):
    """A key whose way from the job's root passes a symbolic link or something that is
    not a folder: reading or writing it could leave the job."""


def _open_folder(root_fd: int, root: str, rel: str, create: bool) -> int:
    """A new descriptor of folder `rel` (below the folder `root_fd`, which stays open),
    reached one component at a time with O_NOFOLLOW (openat-style): a symbolic link
    anywhere on the way is refused, and what is opened is what is used (no window between
    a check and the use)."""
    if not rel:
        return os.dup(root_fd)
    fd = root_fd  # (each step opens the next component relative to the last one opened)
    try:
        for i, part in enumerate(rel.split("/")):
            try:
                child = os.open(part, _FOLDER_FLAGS, dir_fd=fd)
            except FileNotFoundError:
                if not create:
                    raise
                try:
                    os.mkdir(part, 0o777, dir_fd=fd)
                except FileExistsError:
                    pass
                child = os.open(part, _FOLDER_FLAGS, dir_fd=fd)
            except OSError as exc:
                # ELOOP: a symbolic link; ENOTDIR: a file where a folder should be.
                where = os.path.join(root, *rel.split("/")[: i + 1])
                what = "a symbolic link" if os.path.islink(where) else f"not a folder ({exc.strerror or exc})"
                raise PathRefused(f"{where} is {what}; stepscope reads and writes only real folders inside the job") from None
            if fd != root_fd:
                os.close(fd)
            fd = child
        return fd
    except BaseException:
        if fd != root_fd:
            os.close(fd)
        raise


def resolve_within(root: str | os.PathLike[str], rel: str) -> str:
    """The path of folder `rel` (a relative POSIX path) inside `root`, reached without
    following any symbolic link below `root`: PathRefused when one lies on the way,
    FileNotFoundError when it does not exist. What a server authorises when a user names a
    folder of a shared root (a job id): the folder itself, never where a link points."""
    root = os.fspath(root)
    if rel not in ("", "."):
        check_key(rel)
    root_fd = os.open(root, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | _CLOEXEC)
    try:
        os.close(_open_folder(root_fd, root, "" if rel in ("", ".") else rel.strip("/"), create=False))
    finally:
        os.close(root_fd)
    return os.path.join(os.path.realpath(root), *(rel.strip("/").split("/") if rel not in ("", ".") else ()))


class LocalStore(Store):
    """A job in a local folder. Every read and write resolves inside the job's root without
    following symbolic links: each folder on a key's way is opened relative to its parent
    with O_NOFOLLOW and files are opened relative to their folder's descriptor, so a link
    planted anywhere in the job (`rule-output -> /elsewhere`, a linked table or event file)
    is refused with PathRefused naming it. The root itself may be a link (the user chose it)."""

    def __init__(self, root: str | os.PathLike[str]):
        self.root = Path(root).expanduser()
        if self.root.exists() and not self.root.is_dir():
            raise ConfigError(f"out_dir {self.root} exists and is not a directory")
        self.url = str(self.root)
        self._root_str = str(self.root)
        self._direct = DirectPolicy(self._root_str)  # large files around the page cache (direct_io.py)

    def data_alignment(self) -> int:
        return self._direct.alignment()

    def _path(self, key: str) -> Path:
        return self.root / key

    def _os_path(self, key: str) -> str:
        # Plain strings: pathlib's joins cost more than the reads of small index files.
        return os.path.join(self._root_str, key)

    def local_path(self, key: str = "") -> str:
        return self._os_path(check_key(key)) if key else self._root_str

    def reopenable_url(self) -> str:
        return self._root_str

    def root_exists(self) -> bool:
        return os.path.isdir(self._root_str)

    def probe(self) -> None:
        if not os.path.isdir(self._root_str):
            raise StoreError(f"{self._root_str} is not a folder (no such folder, or not one)")
        try:
            os.close(os.open(self._root_str, _ROOT_FLAGS))
        except OSError as exc:
            raise StoreError(f"cannot list {self._root_str}: {exc.strerror or exc}") from exc

    # --- folders ---------------------------------------------------------------------

    def _folder_fd(self, folder: str, create: bool) -> int:
        """A descriptor of `folder` (relative; "" is the root), walked from the root. Not
        cached: a server holds a store per job, and kept descriptors would run out."""
        # (The root is opened first and made only when missing: a save walks two folders,
        # and each system call less is CPU that training on every core does not lose.)
        try:
            root_fd = os.open(self._root_str, _ROOT_FLAGS)
        except FileNotFoundError:
            if not create:
                raise
            try:
                os.makedirs(self._root_str, exist_ok=True)
            except OSError as exc:
                raise StoreError(f"cannot create {self._root_str}: {exc.strerror or exc}") from exc
            root_fd = os.open(self._root_str, _ROOT_FLAGS)
        if not folder:
            return root_fd
        try:
            return _open_folder(root_fd, self._root_str, folder, create)
        finally:
            os.close(root_fd)

    def _with_folder(self, key: str, create: bool, action: Any) -> Any:
        """`action(folder_fd, name)` for `key`, its folder opened by the walk."""
        folder, _, name = check_key(key).rpartition("/")
        try:
            fd = self._folder_fd(folder, create)
        except FileNotFoundError:
            raise FileNotFoundError(self._os_path(key)) from None
        try:
            return action(fd, name)
        finally:
            os.close(fd)

    # --- writing ---------------------------------------------------------------------

    def write(self, key: str, data: bytes | Sequence[bytes | memoryview]) -> None:
        check_key(key)
        try:
            self._with_folder(key, True, functools.partial(_publish_in, parts=_parts(data), direct=self._direct))
        except StoreError:
            raise
        except OSError as exc:
            raise self._cannot_write(key, exc) from exc

    def _cannot_write(self, key: str, exc: OSError) -> StoreError:
        return StoreError(f"cannot write {self._os_path(key)}: {exc.strerror or exc}")

    def write_many(self, items: Sequence[tuple[str, bytes | Sequence[bytes | memoryview]]], published: Callable[[int], None] | None = None) -> None:
        # A run of items in one folder (a batch's index files) is published under one walk
        # of its folders: a small file then costs its own four system calls (open the
        # temporary, write, close, rename) instead of about ten, with the same guarantees
        # as `write` (the walk refuses links; each file is whole under its name or absent).
        # Where the C extension is built, the items go first through one call that walks
        # and publishes as this loop does (`_publish_files_in_c`); the loop goes on from the
        # first item that call left.
        if type(self).write is not LocalStore.write:
            # A subclass that changes how one object is written keeps that for every item.
            super().write_many(items, published)
            return
        first, count = 0, len(items)
        if _publish_files is not None and count:
            first = self._publish_files_in_c(items, published)
        while first < count:
            folder = check_key(items[first][0]).rpartition("/")[0]
            try:
                fd = self._folder_fd(folder, True)
            except StoreError:
                raise
            except OSError as exc:
                raise self._cannot_write(items[first][0], exc) from exc
            try:
                while first < count:
                    if _publish_small is not None:
                        first = self._publish_small_run(fd, folder, items, first, published)
                        if first >= count:
                            break
                    key, data = items[first]
                    in_folder, _, name = check_key(key).rpartition("/")
                    if in_folder != folder:
                        break
                    try:
                        _publish_in(fd, name, _parts(data), self._direct)
                    except OSError as exc:
                        raise self._cannot_write(key, exc) from exc
                    if published is not None:
                        published(first)
                    first += 1
            finally:
                os.close(fd)

    def _publish_files_in_c(self, items: Sequence[tuple[str, Any]], published: Callable[[int], None] | None) -> int:
        """Publish `items` in order with one call of `_publish_files` (a save's event file
        and index file: both folder walks and both files with the GIL released once, by
        the rules of the path below); returns the first item it left to that path (a
        folder it could not walk, which the path below walks again and refuses by name; a
        file neither small nor for a direct write; a refused direct write, `_direct` told)."""
        assert _publish_files is not None
        files = []
        try:
            for key, data in items:
                folder, _, name = check_key(key).rpartition("/")
                files.append((folder, _temporary(name), name, data))
        except StoreError:
            pass  # (the items before an invalid key are published; the path below refuses it)
        # (Before the folder's first large file, which the path below decides it at, no
        # direct writes here: deciding needs the folder, which may not exist yet.)
        direct = bool(O_DIRECT) and self._direct.allowed_once_decided()
        done, stop = _publish_files(self._root_str, files, staging_buffer() if direct else None, _WRITE_FLAGS, ALIGN, PLACE_FROM,
                                    _PREALLOCATE_FROM, DIRECT_FROM, direct, WRITE_SLICE)  # fmt: skip
        if published is not None:
            for i in range(done):
                published(i)
        if isinstance(stop, OSError):
            raise self._cannot_write(items[done][0], stop) from stop
        if stop is not None:  # (what a direct write's refusal says)
            self._direct.refused(DirectRefused(stop))
        return done

    def _publish_small_run(self, fd: int, folder: str, items: Sequence[tuple[str, Any]], first: int, published: Callable[[int], None] | None) -> int:
        """Publish the run of small files (one `bytes` each, a batch's index files) from
        `first` in `folder` with one call that releases the GIL once (_publish.c), not four
        times a file; returns the first item not published (not small, or another folder)."""
        run: list[tuple[str, str, bytes]] = []
        for key, data in items[first:]:
            in_folder, _, name = check_key(key).rpartition("/")
            if in_folder != folder or type(data) is not bytes or len(data) > WRITE_SLICE or not _utf8(name):
                break
            run.append((_temporary(name), name, data))
        publish = _publish_small
        if not run or publish is None:
            return first
        done, exc = publish(fd, run)
        if published is not None:
            for i in range(first, first + done):
                published(i)
        if exc is not None:
            raise self._cannot_write(items[first + done][0], exc) from exc
        return first + done

    # --- reading ---------------------------------------------------------------------

    def _open_regular(self, key: str) -> tuple[int, int]:
        """A descriptor for reading `key` and its size; `key` must be a regular file inside
        the job: no symbolic link (at the name or in a folder above it), no FIFO or device
        (opening one could block forever or read without end). Reads are the hot path (a
        job may have 10^5 index files): where Linux has openat2, one system call resolves
        the key below the job's held root (see _RootDescriptors) refusing every link on the
        way (RESOLVE_NO_SYMLINKS | BENEATH); elsewhere, and to name what is wrong, the
        folders are walked one by one. Either way nothing outside the job is ever opened,
        not even to be checked and closed."""
        check_key(key)
        if _openat2 is not None:
            try:
                held = _roots.acquire(self._root_str)
            except OSError:
                held = None  # the walk below says what is wrong
            if held is not None:
                try:
                    fd = _openat2(held.fd, key, _READ_FLAGS)
                    # A held root may be a folder since deleted or moved: then the walk,
                    # from the folder now at the root's path, answers.
                    if fd == -errno.ENOENT and _roots.is_current(self._root_str, held):
                        raise FileNotFoundError(errno.ENOENT, "No such file or directory", self._os_path(key))
                finally:
                    _roots.release(held)
                if fd >= 0:
                    return self._regular(fd, key)
                # ELOOP (a link on the way), ENOTDIR, EACCES...: the walk names the culprit.
        path = self._os_path(key)
        try:
            fd = self._with_folder(key, False, functools.partial(self._open_in, path))
        except (FileNotFoundError, StoreError):
            raise
        except OSError as exc:
            raise StoreError(f"cannot read {path}: {exc.strerror or exc}") from exc
        return self._regular(fd, key)

    @staticmethod
    def _open_in(path: str, folder_fd: int, name: str) -> int:
        try:
            return os.open(name, _READ_FLAGS, dir_fd=folder_fd)
        except FileNotFoundError:
            raise
        except OSError as exc:
            try:
                is_link = stat.S_ISLNK(os.stat(name, dir_fd=folder_fd, follow_symlinks=False).st_mode)
            except OSError:
                is_link = False
            if is_link:
                raise PathRefused(f"{path} is a symbolic link; stepscope reads only regular files inside the job") from None
            if isinstance(exc, (IsADirectoryError, NotADirectoryError)):
                raise StoreError(f"cannot read {path}: not a regular file") from None
            raise StoreError(f"cannot read {path}: {exc.strerror or exc}") from exc

    def _regular(self, fd: int, key: str) -> tuple[int, int]:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            os.close(fd)
            raise StoreError(f"{self._os_path(key)} is not a regular file; stepscope reads only regular files")
        return fd, info.st_size

    def open_file(self, key: str, max_size: int | None = None) -> BinaryIO:
        fd, size = self._open_regular(key)
        if max_size is not None and size > max_size:
            os.close(fd)
            raise StoreError(f"{self._os_path(key)} is {size} bytes, more than the {max_size} a file of its kind may have")
        return os.fdopen(fd, "rb")

    def size(self, key: str) -> int:
        fd, size = self._open_regular(key)
        os.close(fd)
        return size

    def read(self, key: str, max_size: int | None = None) -> bytes:
        fd, size = self._open_regular(key)
        try:
            if max_size is not None and size > max_size:
                raise StoreError(f"{self._os_path(key)} is {size} bytes, more than the {max_size} a file of its kind may have")
            # One byte more than the size: a short read is the end of a published (never
            # rewritten) file, so a small file costs one read call; a file that grows
            # while read is read on, within its bound.
            data = os.read(fd, size + 1)
            if len(data) <= size:
                return data
            chunks, total = [data], len(data)
            while True:
                if max_size is not None and total > max_size:
                    raise StoreError(f"{self._os_path(key)} grew past {max_size} bytes while being read")
                chunk = os.read(fd, 1 << 16)
                if not chunk:
                    return b"".join(chunks)
                chunks.append(chunk)
                total += len(chunk)
        finally:
            os.close(fd)

    def read_range(self, key: str, start: int, length: int) -> bytes:
        if start < 0:
            raise StoreError(f"cannot read {self._os_path(key)} from byte {start}")
        if length <= 0:
            return b""
        fd, size = self._open_regular(key)
        try:
            # Never allocate more than the file holds (a crafted index may ask for a terabyte).
            length = min(length, max(0, size - start))
            return os.pread(fd, length, start) if length else b""
        finally:
            os.close(fd)

    def list(self, prefix: str = "", start_after: str | None = None) -> list[str]:
        # A prefix may name a folder or the start of file names inside one. A missing job
        # root has no keys: its parent folder is someone else's. (The root may be a link.)
        # A listing starts a new look at the job: the reads after it open its root afresh.
        _roots.forget(self._root_str)
        base = self._path(prefix) if prefix else self.root
        folder = self.root if not prefix else base if base.is_dir() and not base.is_symlink() else base.parent
        if not folder.is_dir():
            return []
        rel = os.path.relpath(folder, self.root).replace(os.sep, "/")
        rel = "" if rel == "." else rel
        if rel.startswith(".."):
            return []
        if rel:
            try:  # the folders above the listing: no link on the way either
                os.close(self._folder_fd(rel, create=False))
            except (OSError, StoreError):
                return []
        keys: builtins.list[str] = []
        self._walk(str(folder), rel, prefix, start_after, keys)
        keys.sort()
        return keys

    def is_empty(self) -> bool:
        _roots.forget(self._root_str)  # a look at the job, as a listing is
        if not os.path.isdir(self._root_str):
            return True
        first: builtins.list[str] = []
        self._walk(self._root_str, "", "", None, first, first_only=True)
        return not first

    def _walk(self, top: str, top_rel: str, prefix: str, start_after: str | None, keys: builtins.list[str], first_only: bool = False) -> None:
        # Only regular files and real folders (d_type: no extra system call per entry);
        # symbolic links, FIFOs and sockets are not part of a job. A stack, not recursion,
        # and a depth bound: a 1,400-deep folder chain is skipped, not a RecursionError.
        # (Listing by path can race a folder swapped for a link; every read of what is
        # listed goes through the descriptor walk, which refuses it.)
        stack = [(top, top_rel, top_rel.count("/") + (1 if top_rel else 0))]
        while stack:
            folder, rel_dir, depth = stack.pop()
            try:
                entries = list(os.scandir(folder))
            except OSError:
                continue
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
                    if depth + 1 > MAX_DEPTH:
                        continue
                    stack.append((entry.path, key, depth + 1))
                elif entry.is_file(follow_symlinks=False):
                    if name.startswith(".") and name.endswith(".tmp"):
                        continue
                    if key.startswith(prefix) and (start_after is None or key > start_after):
                        keys.append(key)
                        if first_only:
                            return

    def list_folder(self, folder: str = "") -> FolderListing:
        # Reached by the descriptor walk: a linked folder on the way lists as empty, and
        # in the folder only regular files and real folders count (as in `list`).
        folder = folder.strip("/")
        if folder:
            check_key(folder)
        try:
            fd = self._folder_fd(folder, create=False)
        except (OSError, StoreError):
            return FolderListing()
        files, folders = [], []
        try:
            with os.scandir(fd) as entries:
                for entry in entries:
                    if entry.is_dir(follow_symlinks=False):
                        folders.append(entry.name)
                    elif entry.is_file(follow_symlinks=False) and not (entry.name.startswith(".") and entry.name.endswith(".tmp")):
                        files.append(entry.name)
        except OSError as exc:
            raise StoreError(f"cannot list {self.describe(folder)}: {exc.strerror or exc}") from exc
        finally:
            os.close(fd)
        return FolderListing(sorted(files), sorted(folders))

    def remove_stale_temporaries(self, marker: str, max_folders: int = 100_000) -> int:
        """Delete temporary files (".NAME.PID.N.tmp") whose NAME contains `marker` (a worker's
        own files) left by a process that died before renaming them. Returns how many."""
        removed = 0
        pid = f".{os.getpid()}."
        seen = 0
        for dirpath, _dirnames, filenames in os.walk(self._root_str):  # os.walk never follows links
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
        """Whether `key` is a regular file or a real folder of the job (a link is not)."""
        if not key.strip("/"):
            return os.path.isdir(self._root_str)
        try:
            mode = self._with_folder(key.rstrip("/"), False, lambda fd, name: os.stat(name, dir_fd=fd, follow_symlinks=False).st_mode)
        except (OSError, StoreError):
            return False
        return stat.S_ISREG(mode) or stat.S_ISDIR(mode)

    def delete(self, key: str) -> None:
        try:
            self._with_folder(key, False, lambda fd, name: os.unlink(name, dir_fd=fd))
        except FileNotFoundError:
            pass
        except PathRefused:
            pass  # nothing of the job's lies there
        except OSError as exc:
            raise StoreError(f"cannot delete {self._os_path(key)}: {exc.strerror or exc}") from exc

    def describe(self, key: str = "") -> str:
        return self._os_path(key) if key else self._root_str
