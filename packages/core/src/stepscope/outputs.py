"""Files the command line writes outside a job (`report -o`, `--pdf`, `timeline -o`,
`export --hdf5`, TensorBoard event files): written whole or not at all.

Each goes to a temporary beside its target and is renamed over it only once complete
and flushed to disk, so a full disk, a crash or an interrupt leaves the earlier file as
it was and no temporary behind. A target that exists and is not a regular file (a
symbolic link, a device such as /dev/full, a FIFO, a folder) is refused: replacing it
would destroy something that is not ours, writing through it would land elsewhere."""

from __future__ import annotations

import contextlib
import itertools
import os
import stat
from collections.abc import Iterator
from typing import IO, Any

from .exceptions import OutputError, StepscopeError

_counter = itertools.count()
_FLAGS = os.O_RDWR | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)


def check_output_target(path: str | os.PathLike[str]) -> str:
    """`path` as a string when it is absent or a regular file (which will be replaced);
    OutputError naming it otherwise."""
    path = os.fspath(path)
    if not path or path.endswith(os.sep) or os.path.basename(path) in (".", ".."):
        raise OutputError(f"{path!r} names a folder; give the path of a file")
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return path
    except OSError as exc:
        raise OutputError(f"cannot write {path}: {exc.strerror or exc}") from None
    if stat.S_ISLNK(mode):
        raise OutputError(f"{path} is a symbolic link; stepscope does not write through or replace links (give the path it points to)")
    if not stat.S_ISREG(mode):
        kind = "a folder" if stat.S_ISDIR(mode) else "a FIFO" if stat.S_ISFIFO(mode) else "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode) else "a socket" if stat.S_ISSOCK(mode) else "not a regular file"
        raise OutputError(f"{path} is {kind}; stepscope writes only regular files")
    return path


@contextlib.contextmanager
def atomic_output(path: str | os.PathLike[str], text: bool = False, encoding: str = "utf-8") -> Iterator[IO[Any]]:
    """A file object to write `path` through: what is written appears at `path` only when
    the block ends without an exception (renamed from `.NAME.PID.N.tmp` beside it)."""
    path = check_output_target(path)
    folder, name = os.path.split(os.path.abspath(path))
    try:
        os.makedirs(folder, exist_ok=True)
    except OSError as exc:
        raise OutputError(f"cannot create the folder of {path}: {exc.strerror or exc}") from None
    tmp = os.path.join(folder, f".{name}.{os.getpid()}.{next(_counter)}.tmp")
    try:
        fd = os.open(tmp, _FLAGS, 0o666)  # the umask applies, as for open()
    except OSError as exc:
        raise OutputError(f"cannot write {path}: {exc.strerror or exc}") from None
    try:
        with contextlib.suppress(FileNotFoundError):
            os.fchmod(fd, os.stat(path, follow_symlinks=False).st_mode & 0o7777)  # keep a replaced file's mode
        handle: IO[Any] = os.fdopen(fd, "w", encoding=encoding, newline="") if text else os.fdopen(fd, "r+b")  # h5py reads back what it wrote
    except BaseException:
        os.close(fd)
        os.unlink(tmp)
        raise
    try:
        with handle:
            yield handle
            handle.flush()
            os.fsync(handle.fileno())  # a filesystem that reports a full disk only now
        check_output_target(path)  # still not a link or device (it may have changed meanwhile)
        os.replace(tmp, path)
    except BaseException as exc:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        if isinstance(exc, OSError) and not isinstance(exc, StepscopeError):  # not a reading error
            raise OutputError(f"cannot write {path}: {exc.strerror or exc}; the earlier file (if any) is unchanged") from exc
        raise


__all__ = ["atomic_output", "check_output_target"]
