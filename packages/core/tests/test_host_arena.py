"""HostArena: snapshots of save steps in reused memory. A block is reused only when no
array refers to it any more, so a kept snapshot is never overwritten; small values and
what is over the kept bound take numpy's own memory."""

from __future__ import annotations

import threading

import ml_dtypes
import numpy as np
import pytest

from stepscope.capture.host_arena import ARENA_FROM, HostArena
from stepscope.store.direct_io import ALIGN


def _address(array: np.ndarray) -> int:
    return array.__array_interface__["data"][0]


def test_memory_is_reused_once_the_snapshots_are_gone():
    arena = HostArena(block_bytes=1 << 20)
    first = [arena.empty((256, 256), np.float32) for _ in range(3)]  # 3 x 256 KiB in one block
    addresses = [_address(a) for a in first]
    assert len({a // (1 << 20) for a in addresses}) <= 2  # cut from one mapping (page-rounded)
    assert all(not a.flags.owndata for a in first)
    del first
    # A fourth does not fit the block's rest; the block is idle again, so it starts over.
    again = [arena.empty((256, 256), np.float32) for _ in range(4)]
    assert _address(again[0]) == addresses[0]
    assert arena.kept_bytes == 1 << 20


def test_a_kept_snapshot_is_never_overwritten():
    arena = HostArena(block_bytes=1 << 20)
    kept = arena.empty((512, 256), np.float32)  # half the block
    kept[:] = 7.0
    for round_ in range(20):  # many later saves, each filling more than a block's rest
        for _ in range(3):
            arena.empty((512, 256), np.float32)[:] = round_
    assert np.all(kept == 7.0)
    # Later saves went to other blocks: the kept one holds only that snapshot's block.
    assert arena.kept_bytes >= 2 << 20


def test_views_are_aligned_shaped_and_typed():
    arena = HostArena(block_bytes=1 << 20)
    for shape, dtype in (((300, 301), np.float32), ((99, 1000), ml_dtypes.bfloat16), ((17, 2000), np.int64), ((70000,), np.bool_)):
        a = arena.empty(shape, dtype)
        assert a.shape == shape and a.dtype == np.dtype(dtype)
        assert _address(a) % ALIGN == 0  # (a snapshot can be written from where it is: direct_io.py)
        assert a.flags.c_contiguous and a.flags.writeable
        source = np.arange(int(np.prod(shape))).reshape(shape).astype(dtype)
        np.copyto(a, source)
        np.testing.assert_array_equal(a, source)


def test_small_values_and_what_is_over_the_bound_take_numpy_memory():
    arena = HostArena(keep_bytes=2 << 20, block_bytes=1 << 20)
    small = arena.empty((ARENA_FROM // 4 - 1,), np.float32)
    assert small.flags.owndata  # numpy's own allocation
    empty = arena.empty((0, 5), np.float32)
    assert empty.size == 0
    held = [arena.empty((1 << 20,), np.uint8) for _ in range(2)]  # two whole blocks: the bound
    over = arena.empty((1 << 20,), np.uint8)
    assert over.flags.owndata and arena.kept_bytes == 2 << 20
    big = arena.empty((3 << 20,), np.uint8)  # larger than the bound on its own
    assert big.flags.owndata
    del held
    # Once the kept blocks are idle, a larger snapshot replaces them within the bound.
    larger = arena.empty((2 << 20,), np.uint8)
    assert not larger.flags.owndata and arena.kept_bytes == 2 << 20


def test_threads_get_separate_memory():
    arena = HostArena(block_bytes=1 << 20)
    got: dict[int, list[np.ndarray]] = {}

    def take(i: int) -> None:
        arrays = []
        for _ in range(50):
            a = arena.empty((20000,), np.int32)
            a[:] = i
            arrays.append(a)
        got[i] = arrays

    threads = [threading.Thread(target=take, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for i, arrays in got.items():
        assert all(np.all(a == i) for a in arrays), f"thread {i}'s snapshots were written by another"


@pytest.mark.parametrize("nbytes", [ARENA_FROM, 5 << 20])
def test_a_block_fits_the_snapshot(nbytes):
    arena = HostArena(block_bytes=1 << 20)
    a = arena.empty((nbytes,), np.uint8)
    a[:] = 1
    assert not a.flags.owndata and int(a.sum()) == nbytes
