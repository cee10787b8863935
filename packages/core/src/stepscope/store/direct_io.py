"""Large files written around the page cache (O_DIRECT) on local block file systems.

A save of weights and gradients is megabytes that nothing reads soon. Written through the
page cache, each byte costs the writing thread a copy into freshly allocated cache pages
(on virtual machines whose memory the host backs lazily, a fault on the host per page:
3.2 MB cost 1-8 ms of CPU here), and later a kernel thread's time to write them back:
CPU taken from training that uses every core. Written with O_DIRECT from one reused,
aligned buffer, the same file costs a copy into memory already mapped while the device
does the rest; and a snapshot's bytes, which the host arena keeps in aligned memory and the
framer puts at an aligned file offset behind a padding record (capture/step_framing.py,
docs/format.md), are not copied at all: the device reads them where they are.

Only where it is known to work and to be cheap: Linux, files of `DIRECT_FROM` bytes or
more, and a folder on ext2/3/4, XFS or Btrfs (network and FUSE file systems turn direct
writes into synchronous round trips; tmpfs has no device to write to). Any refusal by the
file system (EINVAL at the open or at a write) turns it off for that folder and the file
is written again the usual way: a file is never left half-written by this path.

It trades the writer's throughput for CPU: a device takes fewer bytes a second than the
page cache (16 MB saves: 1.3 GB/s against 3.5 GB/s here, `STEPSCOPE_DIRECT_IO=1` and `=0
python bench/bench_writer.py --quick`), while the CPU it saves (a whole 3.2 MB file: 0.9-1.6
ms against 1.4-1.9 ms, the same bench's last line) counts where training uses every core
(everything at every step on both cores here: 9.0-10.0 ms of CPU added per step against
16.4, bench/bench_vs_smdebug.py). So by default
(`STEPSCOPE_DIRECT_IO=auto`) a file goes around the page cache only while the writer keeps
up: its publishing thread says, before each large file, whether it is
behind (`set_backlogged`: capture/writer.py decides), and a writer that has fallen behind
takes the page cache's throughput until it has caught up. `STEPSCOPE_DIRECT_IO=1` writes
directly whatever the backlog, `0` never.

Where the C extension is built (Linux), a local store publishes such a file in one call of
`_publish.publish_direct` (store/local.py `_direct_in_c`): the temporary's open, the
staging copy, the gathered writes, the unaligned end, the close and the rename with the GIL
released once, by the same rules as `write_direct` here, which is the path elsewhere. A
writer's files (a save's event file and index file) go in one call of
`_publish.publish_files` (store/local.py `_publish_files_in_c`), their folders walked there too."""

from __future__ import annotations

import ctypes
import errno
import logging
import mmap
import os
import sys
import threading
from collections.abc import Callable, Sequence

import numpy as np

from ..compiled import load_extension

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows, which has no O_DIRECT either
    fcntl = None  # type: ignore[assignment]

logger = logging.getLogger("stepscope")

DIRECT_IO_ENV = "STEPSCOPE_DIRECT_IO"
DIRECT_FROM = 1 << 20  # bytes: smaller files (indexes, scalar batches) stay in the page cache
ALIGN = 4096  # buffer address, file offset and length of each direct write: a page, which
# covers the logical block size of every common device (512 or 4096)
BUFFER_BYTES = 4 << 20  # the staging buffer per writing thread, a multiple of ALIGN
PLACE_FROM = 256 * 1024  # bytes: a view this large, aligned, is written without staging it
# (its record is then padded to an aligned offset, which costs up to ALIGN bytes of file)
O_DIRECT = getattr(os, "O_DIRECT", 0) if fcntl is not None else 0

# statfs(2)'s f_type of the file systems where direct writes are supported and cheap.
_FILE_SYSTEMS = {0xEF53: "ext2/3/4", 0x58465342: "xfs", 0x9123683E: "btrfs"}


def _statfs_type(path: str) -> int | None:
    """statfs(2)'s f_type for `path` (the struct's first word on every Linux ABI), or None."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        statfs = libc.statfs
    except (OSError, AttributeError):
        return None
    buffer = ctypes.create_string_buffer(512)  # larger than struct statfs on any ABI
    if statfs(os.fsencode(path), buffer) != 0:
        return None
    return ctypes.c_long.from_buffer(buffer).value & 0xFFFFFFFF


_ALWAYS, _AUTO, _NEVER = "always", "auto", "never"
_MODES = {"1": _ALWAYS, "on": _ALWAYS, "true": _ALWAYS, "yes": _ALWAYS, "auto": _AUTO, "": _AUTO,
          "0": _NEVER, "off": _NEVER, "false": _NEVER, "no": _NEVER}  # fmt: skip


def direct_io_mode() -> str:
    """STEPSCOPE_DIRECT_IO read: "always", "auto" (the default) or "never"; an unknown
    value is read as the default, with a warning."""
    value = os.environ.get(DIRECT_IO_ENV, "auto").strip().lower()
    mode = _MODES.get(value)
    if mode is None:
        logger.warning("stepscope: %s=%r is not 1, 0 or auto; auto is used", DIRECT_IO_ENV, value)
        return _AUTO
    return mode


def direct_io_allowed(folder: str) -> bool:
    """Whether large files under `folder` may be written with O_DIRECT (module docstring):
    the switch is not off and the folder is on a file system where it is supported."""
    if not O_DIRECT or direct_io_mode() == _NEVER:
        return False
    return _statfs_type(folder) in _FILE_SYSTEMS


_backlog = threading.local()


def set_backlogged(backlogged: bool) -> None:
    """(On a writing thread, before a file.) Whether more is waiting to be written behind
    it: then, under "auto", the file takes the page cache (throughput before CPU)."""
    _backlog.on = backlogged


HUGE_PAGE = 2 << 20  # bytes: a transparent huge page on x86-64 and most arm64 kernels


# madvise(2)'s MADV_WIPEONFORK (Linux 4.14+; Python's mmap module does not name it).
_WIPE_ON_FORK = getattr(mmap, "MADV_WIPEONFORK", 18 if sys.platform.startswith("linux") else None)


def device_memory(size: int) -> mmap.mmap:
    """`size` bytes of page-aligned anonymous memory for buffers that direct writes hand to
    the device (the staging buffer, the host arena's blocks). Private memory that asks for
    transparent huge pages (`madvise`, where most distributions give them; Python's plain
    `mmap(-1, n)` is shared memory, which gets none): a direct write pins a buffer's pages
    for the device, and 2 MiB pages are one entry each to walk instead of 512, physically
    contiguous, so the device gets fewer requests. Wiped in a forked child (a data loader's
    worker, forked again each epoch): the child gets zeros, not ours, and our pages are not
    made copy-on-write by the fork, which would make the next save copy every page again
    and split the huge pages (4 MiB written after a fork: 2.5-3.5 ms, against 0.26)."""
    private = getattr(mmap, "MAP_PRIVATE", 0) | getattr(mmap, "MAP_ANONYMOUS", 0)
    memory = mmap.mmap(-1, size, flags=private) if private else mmap.mmap(-1, size)
    advice = getattr(mmap, "MADV_HUGEPAGE", None)
    for asked in (advice if size >= HUGE_PAGE else None, _WIPE_ON_FORK if private else None):
        if asked is not None:
            try:
                memory.madvise(asked)
            except OSError:  # (a kernel without it: small pages, or copy-on-write at a fork)
                pass
    return memory


_buffers = threading.local()

# The staging copy in C (_publish.c's `stage`), or None: not built, or $STEPSCOPE_PURE_PYTHON.
_stage: Callable[[memoryview, int, list[memoryview], int, int], tuple[int, int, int]] | None = getattr(
    load_extension(__package__, "_publish"), "stage", None
)


def _staging() -> tuple[memoryview, np.ndarray]:
    """This thread's aligned staging buffer (anonymous memory is page aligned), as a view
    to write from and an array to copy into; kept for the thread's life, so that each
    file's copy goes to pages already mapped."""
    staging = getattr(_buffers, "staging", None)
    if staging is None:
        memory = device_memory(BUFFER_BYTES)
        staging = _buffers.staging = (memoryview(memory), np.frombuffer(memory, dtype=np.uint8))
    return staging


def staging_buffer() -> memoryview:
    """This thread's staging buffer (`_staging`) as a writable view: what `_publish.c`'s
    publish_direct copies into."""
    return _staging()[0]


class DirectRefused(Exception):
    """The file system refused a direct write (EINVAL): write the file the usual way."""


def _plain(fd: int) -> None:
    """Turn O_DIRECT off on `fd` (for an unaligned tail, or after a short write)."""
    assert fcntl is not None  # (O_DIRECT is 0 without it: no direct write was begun)
    fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~O_DIRECT)


def _write_out(fd: int, view: memoryview, direct: bool) -> bool:
    """Write all of `view`; returns whether `fd` still writes directly (a short write,
    which leaves the next offset unaligned, turns it off for the rest of the file)."""
    while view.nbytes:
        try:
            written = os.write(fd, view)
        except OSError as exc:
            if direct and exc.errno == errno.EINVAL:
                raise DirectRefused(str(exc)) from exc
            raise
        view = view[written:]
        if view.nbytes and direct:
            _plain(fd)
            direct = False
    return direct


def _buffer_address(buffer: bytes | memoryview) -> int:
    """Where `buffer`'s bytes start in memory (for the alignment checks of direct writes)."""
    return np.frombuffer(buffer, dtype=np.uint8).__array_interface__["data"][0]


# (the same answer from _publish.c where it is built, for a fraction of the numpy view's cost)
buffer_address: Callable[[bytes | memoryview], int] = getattr(load_extension(__package__, "_publish"), "buffer_address", _buffer_address)


class _DirectFile:
    """One file written with O_DIRECT from offset 0, as a list of aligned segments handed to
    one gathered write (`os.writev`, a few calls per file): large views that start on an
    aligned address at an aligned file offset (`place`) are written from where they are,
    everything between them (`stage`) is copied into this thread's staging buffer. Each
    segment starts and ends on an aligned file offset, as the device wants; only the file's
    unaligned end goes through the page cache."""

    _MAX_SEGMENTS = 512  # (os.writev takes at most IOV_MAX buffers, 1024 on Linux)

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.staging, self.into = _staging()
        self.fill = 0  # staged bytes in the buffer
        self.mark = 0  # where the staged bytes not yet in `segments` start
        self.segments: list[memoryview] = []
        self.direct = True

    def place(self, view: memoryview) -> None:
        """Write `view` from its own memory, but for its unaligned end (staged)."""
        self._cut()
        whole = view.nbytes - view.nbytes % ALIGN
        self.segments.append(view[:whole])
        if len(self.segments) >= self._MAX_SEGMENTS:
            self._flush()
        if whole < view.nbytes:
            self.stage([view[whole:]])

    def stage(self, views: list[memoryview]) -> None:
        """Copy `views` into the staging buffer, writing it out each time it is full."""
        if _stage is not None:
            index = offset = 0
            while index < len(views):
                fill, index, offset = _stage(self.staging, self.fill, views, index, offset)
                self.fill = fill
                if fill == BUFFER_BYTES:
                    self._flush()
            return
        for view in views:
            source = np.frombuffer(view, dtype=np.uint8)
            while source.size:
                n = min(source.size, BUFFER_BYTES - self.fill)
                # numpy copies with the GIL released (a memoryview slice assignment holds it:
                # 0.3 ms per 3.2 MB that the training thread would wait out).
                np.copyto(self.into[self.fill : self.fill + n], source[:n])
                self.fill += n
                source = source[n:]
                if self.fill == BUFFER_BYTES:
                    self._flush()

    def finish(self) -> None:
        """Write what is left: the aligned part directly, the unaligned end through the
        page cache."""
        aligned = self.fill - self.fill % ALIGN  # (`mark` is aligned: so is this)
        if aligned > self.mark:
            self.segments.append(self.staging[self.mark : aligned])
        self._write(self.segments)
        self.segments = []
        if self.fill > aligned:
            if self.direct:
                _plain(self.fd)
            _write_out(self.fd, self.staging[aligned : self.fill], False)

    def _cut(self) -> None:
        # The staged bytes so far become a segment (they end on an aligned file offset: a
        # placed view or a full buffer comes next).
        if self.fill > self.mark:
            self.segments.append(self.staging[self.mark : self.fill])
            self.mark = self.fill

    def _flush(self) -> None:
        self._cut()
        self._write(self.segments)
        self.segments = []
        self.fill = self.mark = 0

    def _write(self, segments: list[memoryview]) -> None:
        while segments:
            try:
                written = os.writev(self.fd, segments)
            except OSError as exc:
                if self.direct and exc.errno == errno.EINVAL:
                    raise DirectRefused(str(exc)) from exc
                raise
            if written == sum(s.nbytes for s in segments):
                return
            first = 0  # the first segment not written whole (there is one: the write was short)
            while written >= segments[first].nbytes:
                written -= segments[first].nbytes
                first += 1
            segments = [segments[first][written:], *segments[first + 1 :]]
            if written % ALIGN == 0:
                # Short on a block boundary (Linux writes at most 2 GiB less a page in one
                # call): every segment is still aligned, the rest stays direct.
                continue
            # Short anywhere else (a signal, a full disk): the next offset is unaligned, the
            # rest of the file goes through the page cache, one buffer at a time.
            if self.direct:
                _plain(self.fd)
                self.direct = False
            for segment in segments:
                _write_out(self.fd, segment, False)
            return


def write_direct(fd: int, views: Sequence[memoryview]) -> None:
    """Write `views` (byte views) in order to `fd`, opened with O_DIRECT at offset 0: a
    view of `PLACE_FROM` bytes or more that starts on an aligned address at an aligned file
    offset (a snapshot's bytes behind a padding record: capture/step_framing.py) from
    where it is, the rest copied through this thread's staging buffer (by `_stage` in C
    where it is built: a few calls per file instead of one or two numpy calls per view),
    the unaligned end through the page cache. Raises DirectRefused when the file system
    refuses (the caller starts the file again without O_DIRECT)."""
    out = _DirectFile(fd)
    views = list(views)
    run = 0  # the first view not handed over yet
    offset = 0
    for i, view in enumerate(views):
        size = view.nbytes
        if size >= PLACE_FROM and not offset % ALIGN and not buffer_address(view) % ALIGN:
            out.stage(views[run:i])
            out.place(view)
            run = i + 1
        offset += size
    out.stage(views[run:])
    out.finish()


class DirectPolicy:
    """Whether one folder's large files go around the page cache: the folder's file system
    and the switch read at its first large file (the folder may not exist before), turned
    off for good at a refusal; under "auto", not while the writing thread is backlogged."""

    def __init__(self, folder: str):
        self._folder = folder
        self._allowed: bool | None = None
        self._always = False

    def _decided(self) -> bool:
        if self._allowed is None:
            self._allowed = direct_io_allowed(self._folder)
            self._always = direct_io_mode() == _ALWAYS
        return self._allowed

    def allowed(self) -> bool:
        """Whether the next large file of this thread goes around the page cache."""
        return self._decided() and (self._always or not getattr(_backlog, "on", False))

    def allowed_once_decided(self) -> bool:
        """`allowed()` once decided (at the folder's first large file); False before,
        without deciding: the folder may not exist yet, and deciding then would say no."""
        return self._allowed is not None and self.allowed()

    def alignment(self) -> int:
        """ALIGN where this folder's large files may go around the page cache, else 0: what
        a writer aligns large tensors' bytes to in its files (`write_direct`). (0, and
        nothing decided, while the folder does not exist yet.)"""
        if self._allowed is None and not os.path.isdir(self._folder):
            return 0
        return ALIGN if self._decided() else 0

    def refused(self, exc: BaseException) -> None:
        if self._allowed:
            logger.info("stepscope: %s refused a direct write (%s); its files are written through the page cache", self._folder, exc)
        self._allowed = False


def large_views(parts: Sequence[bytes | memoryview]) -> tuple[list[memoryview], int] | None:
    """`parts` as byte views and their size, when they make a file of DIRECT_FROM bytes or
    more; None for a smaller file (decided without views for one small bytes object, the
    common case: an index file)."""
    if len(parts) == 1 and type(parts[0]) is bytes and len(parts[0]) < DIRECT_FROM:
        return None
    views = [memoryview(p).cast("B") for p in parts]
    size = sum(v.nbytes for v in views)
    return (views, size) if size >= DIRECT_FROM else None
