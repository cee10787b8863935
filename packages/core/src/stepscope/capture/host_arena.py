"""Reused host memory for the snapshots of save steps.

A save step copies its tensors out of the model (the optimizer updates them in place right
after). Copied into fresh arrays, every large snapshot is memory the C library has just
asked the kernel for (its allocations of 128 KiB and more are mappings of their own, given
back when freed), so each save faults in and zeroes every page again before the copy can
write it: 3.2 MB of weights and gradients cost 2.4 ms of the training thread here where
the copy itself costs 0.7 (bench/bench_vs_smdebug.py; on virtual machines whose memory the
host backs lazily, each fault is also one on the host). The arena hands out views of a few
page-aligned blocks that stay mapped from one save to the next.

A block is reused only once no array refers to it any more: each view holds its block (a
numpy view keeps its base alive), so the block's reference count says whether anything,
the writer's queue, a step listener, a user's callback, still holds a snapshot of it.
Nothing has to hand a block back, and nothing that keeps an array can see it overwritten.

Small values (losses, reductions, small layers) keep numpy's own allocation: below
`ARENA_FROM` bytes they come from the heap the C library keeps, already mapped. The arena
keeps at most `KEEP_BYTES` of idle blocks: a save larger than that takes fresh memory for
the rest, as before, rather than holding gigabytes of a large model's snapshots for the
process's life.

`copy_of` copies a snapshot into the arena and, where the writers' C encoders are built,
takes the CRC-32C of its bytes and whether its floats are finite in the same pass
(`_encode.copy_scan`): the writer thread then frames the record without reading the
megabytes again (`Scanned`). With training on every core, that read was one more pass over
memory the training threads share, and 0.23-0.25 ms of the writer's CPU per 3.2 MB save here
(`python bench/ab_writer_parts.py copy_scan`); in the copy, the CRC instructions run while
the loads wait on memory."""

from __future__ import annotations

import math
import mmap
import sys
import threading
from typing import Any

import numpy as np

from ..compiled import load_extension
from ..store.direct_io import ALIGN, device_memory

# The copy that also takes the CRC (`_encode.copy_scan`), or None: not built, or $STEPSCOPE_PURE_PYTHON.
_copy_scan = getattr(load_extension(__package__, "_encode"), "copy_scan", None)

ARENA_FROM = 64 * 1024  # bytes: smaller snapshots come from numpy's allocation
BLOCK_BYTES = 4 << 20  # the least a block holds: a small model's whole save in one block
KEEP_BYTES = 256 << 20  # the most the arena keeps mapped (in use or idle)
# Each view starts on a block boundary: written around the page cache, a large snapshot's
# bytes then go to its file from where they are, with no staging copy (store/direct_io.py).
_ALIGN = ALIGN
_PAGE = mmap.PAGESIZE


# The itemsize `_encode.copy_scan` checks finiteness by: native floats of 2, 4 or 8 bytes
# (bfloat16 is a kind "V" to numpy: it gets the CRC alone, as before).
_SCANNED_FLOATS = {np.dtype(t): np.dtype(t).itemsize for t in (np.float16, np.float32, np.float64)}


def _round_up(n: int, to: int) -> int:
    return -(-n // to) * to


class _Block:
    """One mapping, filled from the start by the views of one or more steps."""

    __slots__ = ("memory", "size", "fill", "_unused_refs")

    def __init__(self, size: int) -> None:
        self.memory = device_memory(size)
        self.size = size
        self.fill = 0
        # The mapping's reference count with no array over it, counted the way idle()
        # counts (interpreters differ in the temporary references a call adds).
        self._unused_refs = self._refs()

    def _refs(self) -> int:
        return sys.getrefcount(self.memory)

    def idle(self) -> bool:
        # Each numpy array made over the mapping holds a reference to it (and each view of
        # that array holds the array).
        return self._refs() <= self._unused_refs


class HostArena:
    """`empty(shape, dtype)`: an uninitialised array to copy a snapshot into, from reused
    memory where it is large enough to matter. Thread-safe (gradient hooks may run on the
    autograd engine's threads)."""

    def __init__(self, keep_bytes: int = KEEP_BYTES, block_bytes: int = BLOCK_BYTES, arena_from: int = ARENA_FROM) -> None:
        self._keep_bytes = keep_bytes
        self._block_bytes = block_bytes
        self._arena_from = arena_from
        self._blocks: list[_Block] = []  # kept: each counts towards keep_bytes
        self._current: _Block | None = None  # the block views are cut from now
        self._lock = threading.Lock()

    @property
    def kept_bytes(self) -> int:
        return sum(b.size for b in self._blocks)

    def empty(self, shape: tuple[int, ...], dtype: Any) -> np.ndarray:
        dtype = np.dtype(dtype)
        nbytes = math.prod(shape) * dtype.itemsize
        if nbytes < self._arena_from:
            return np.empty(shape, dtype)
        return self._view(shape, dtype, nbytes)

    def _view(self, shape: tuple[int, ...], dtype: np.dtype, nbytes: int) -> np.ndarray:
        """An uninitialised array of `nbytes` in a block (fresh memory when the arena is full)."""
        with self._lock:
            block = self._block_for(nbytes)
            if block is None:
                return np.empty(shape, dtype)
            start = block.fill
            block.fill = _round_up(start + nbytes, _ALIGN)
            view = np.frombuffer(block.memory, dtype=np.uint8, count=nbytes, offset=start)
        return view.view(dtype).reshape(shape)

    def copy_of(self, source: np.ndarray, scan: bool = True) -> np.ndarray | Scanned:
        """A copy of `source` in the arena's memory (as `empty` gives it): with `scan`, as a
        `Scanned` where the copy also took its CRC (a contiguous array of `ARENA_FROM` bytes
        or more, the extension built), else as the array. (No scan for a snapshot that only
        feeds reductions: no record of its bytes is framed.) A save step runs this for each
        large tensor inside backward, whose data has the caches: it asks each thing once."""
        nbytes = source.nbytes
        if nbytes < self._arena_from:
            return source.copy()
        dtype = source.dtype
        copy = self._view(source.shape, dtype, nbytes)
        if scan and _copy_scan is not None and source.flags.c_contiguous and copy.flags.c_contiguous:
            itemsize = _SCANNED_FLOATS.get(dtype, 0)  # (0: the CRC alone, no finiteness check)
            try:
                scanned = _copy_scan(copy, source, itemsize)
            except (TypeError, ValueError, BufferError):
                scanned = None  # (a dtype without a buffer format: numpy copies it)
            if scanned is not None:
                return Scanned(copy, scanned)
        np.copyto(copy, source)
        return copy

    def _block_for(self, nbytes: int) -> _Block | None:
        current = self._current
        if current is not None:
            if current.fill and current.idle():
                current.fill = 0  # its snapshots are gone: start over, in pages still mapped
            if current.fill + nbytes <= current.size:
                return current
        # The current block is full: start over in an idle block large enough (its views
        # are all gone, the current one's too), else map a new one while the kept total
        # allows.
        for block in self._blocks:
            if block.size >= nbytes and block.idle():
                block.fill = 0
                self._current = block
                return block
        size = max(self._block_bytes, _round_up(nbytes, _PAGE))
        if self.kept_bytes + size > self._keep_bytes:
            self._drop_idle(size)
            if self.kept_bytes + size > self._keep_bytes:
                return None
        block = _Block(size)
        self._blocks.append(block)
        self._current = block
        return block

    def _drop_idle(self, room: int) -> None:
        """Unmap idle blocks too small for what is wanted now, to make `room` bytes."""
        for block in list(self._blocks):
            if self.kept_bytes + room <= self._keep_bytes:
                return
            if block.size < room and block.idle():
                self._blocks.remove(block)
                if block is self._current:
                    self._current = None
                block.memory.close()


class Scanned:
    """A snapshot and what its copy found out: `scan`, `_encode.copy_scan`'s (the raw CRC-32C
    register of the array's bytes, whether its floats are all finite or None). The writer's
    framer hands `scan` to `_encode.frame_array`; everything else takes the array
    (`resolve`, as a PendingValue's, or numpy's `__array__`). The array is the arena's
    private copy: nothing writes it after the scan."""

    __slots__ = ("array", "scan", "nbytes")

    def __init__(self, array: np.ndarray, scan: tuple[int, bool | None]) -> None:
        self.array = array
        self.scan = scan
        self.nbytes = array.nbytes

    def resolve(self) -> np.ndarray:
        return self.array

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        array = self.array if dtype is None else self.array.astype(dtype, copy=False)
        return array.copy() if copy and array is self.array else array

    def __repr__(self) -> str:
        return f"Scanned({self.array.dtype}{list(self.array.shape)})"


__all__ = ["ARENA_FROM", "BLOCK_BYTES", "HostArena", "KEEP_BYTES", "Scanned"]
