"""With STEPSCOPE_DIRECT_IO=1, large files go around the page cache (O_DIRECT) where the
file system supports it:
the file holds exactly the bytes given whatever their sizes and alignment, its pages are
not left in the page cache (mincore), a file system that refuses direct writes (at the
open or at a write) gets the file written the usual way with nothing left behind, and
a small file, the default or STEPSCOPE_DIRECT_IO=0 keeps the page cache."""

from __future__ import annotations

import ctypes
import errno
import fcntl
import json
import mmap
import os
import struct
import sys
import threading

import numpy as np
import pytest

from stepscope.compiled import load_extension
from stepscope.store import direct_io, local
from stepscope.store.direct_io import ALIGN, BUFFER_BYTES, DIRECT_FROM, DirectPolicy, direct_io_allowed
from stepscope.store.local import LocalStore

pytestmark = pytest.mark.skipif(not direct_io.O_DIRECT, reason="no O_DIRECT on this platform")
KEY = "events/000000000010/000000000010_worker_0.tfevents"
_publish = load_extension("stepscope.store", "_publish")  # (its fault injection, where the whole file is written in C)


@pytest.fixture
def allowed(tmp_path, monkeypatch):
    """Direct writes turned on (they are off by default); skip where the test folder's
    file system is not one they are used on."""
    monkeypatch.setenv("STEPSCOPE_DIRECT_IO", "1")
    if not direct_io_allowed(str(tmp_path)):
        pytest.skip(f"{tmp_path} is not on ext4, XFS or Btrfs")


@pytest.fixture
def direct_calls(monkeypatch):
    """The byte counts of each direct write LocalStore makes (a whole file in C, a file
    of a write_many published in C, or write_direct in Python)."""
    seen: list[int] = []
    real = local.write_direct

    def spy(fd, views):
        seen.append(sum(v.nbytes for v in views))
        return real(fd, views)

    monkeypatch.setattr(local, "write_direct", spy)
    real_c = local._publish_direct
    if real_c is not None:

        def spy_c(folder_fd, tmp, name, parts, *args):
            seen.append(sum(memoryview(p).nbytes for p in parts))
            return real_c(folder_fd, tmp, name, parts, *args)

        monkeypatch.setattr(local, "_publish_direct", spy_c)
    real_files = local._publish_files
    if real_files is not None:

        def spy_files(root, files, staging, flags, align, place_from, preallocate_from, direct_from, direct, small_max):
            done, stop = real_files(root, files, staging, flags, align, place_from, preallocate_from, direct_from, direct, small_max)
            for _folder, _tmp, _name, data in files[:done]:
                if not (type(data) is bytes and len(data) <= small_max):  # (what it publishes is small or direct)
                    seen.append(sum(memoryview(p).nbytes for p in (data if isinstance(data, list) else [data])))
            return done, stop

        monkeypatch.setattr(local, "_publish_files", spy_files)
    return seen


@pytest.fixture(params=["whole file in C", "staging in C", "python"])
def staging(request, monkeypatch):
    """Each test of the direct path three ways, the same file each way: the whole file
    published in one call (_publish.c's `publish_direct`), write_direct in Python with the
    staging copy in C (`stage`), and all of it in Python."""
    compiled = {"whole file in C": local._publish_direct, "staging in C": direct_io._stage}.get(request.param, True)
    if compiled is None:
        pytest.skip("stepscope.store._publish is not built here (or STEPSCOPE_PURE_PYTHON)")
    if request.param != "whole file in C":
        monkeypatch.setattr(local, "_publish_direct", None)
        monkeypatch.setattr(local, "_publish_files", None)
    if request.param == "python":
        monkeypatch.setattr(direct_io, "_stage", None)
    return request.param


def _parts(size: int, seed: int = 0) -> list[bytes | memoryview]:
    """Record-like buffers adding up to `size` bytes: odd headers around float tensors."""
    rng = np.random.default_rng(seed)
    parts: list[bytes | memoryview] = []
    left = size
    while left:
        header = rng.bytes(min(left, int(rng.integers(1, 30))))
        parts.append(header)
        left -= len(header)
        n = min(left, int(rng.integers(1, 1_500_000)))
        if n:
            parts.append(memoryview(rng.integers(0, 256, n, dtype=np.uint8)))
            left -= n
    return parts


def _resident_pages(path) -> int:
    """How many of the file's pages are in the page cache: mincore(2) on a mapping of it."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
    size = os.path.getsize(path)
    pages = (size + mmap.PAGESIZE - 1) // mmap.PAGESIZE
    fd = os.open(path, os.O_RDONLY)
    try:
        address = libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
        assert address not in (None, ctypes.c_void_p(-1).value), os.strerror(ctypes.get_errno())
        try:
            vector = (ctypes.c_ubyte * pages)()
            assert libc.mincore(address, size, vector) == 0, os.strerror(ctypes.get_errno())
            return sum(v & 1 for v in vector)
        finally:
            libc.munmap(address, size)
    finally:
        os.close(fd)


def _direct_on(fd: int) -> bool:
    return bool(fcntl.fcntl(fd, fcntl.F_GETFL) & direct_io.O_DIRECT)


@pytest.mark.parametrize("size", [DIRECT_FROM, 3_200_017, BUFFER_BYTES, 2 * BUFFER_BYTES + ALIGN, 2 * BUFFER_BYTES + 1])
def test_a_large_file_is_exact_and_written_directly(tmp_path, allowed, direct_calls, size, staging):
    parts = _parts(size, seed=size)
    LocalStore(str(tmp_path)).write(KEY, parts)
    assert (tmp_path / KEY).read_bytes() == b"".join(bytes(p) for p in parts)
    assert direct_calls == [size]
    assert not [p for p in (tmp_path / KEY).parent.iterdir() if p.name.endswith(".tmp")]


def test_the_direct_part_is_not_left_in_the_page_cache(tmp_path, allowed):
    size = 2 * BUFFER_BYTES + 1000
    LocalStore(str(tmp_path)).write(KEY, _parts(size))
    resident = _resident_pages(tmp_path / KEY)
    # Only the unaligned tail went through the page cache: one page.
    assert resident <= 1, f"{resident} of {size // mmap.PAGESIZE + 1} pages in the page cache"


def test_a_small_file_and_the_switch_keep_the_page_cache(tmp_path, allowed, direct_calls, monkeypatch):
    store = LocalStore(str(tmp_path))
    store.write("index/000000000/000000000010_worker_0.json", b"x" * (DIRECT_FROM - 1))
    assert direct_calls == []
    monkeypatch.setenv("STEPSCOPE_DIRECT_IO", "0")
    parts = _parts(DIRECT_FROM * 2)
    LocalStore(str(tmp_path / "off")).write(KEY, parts)
    assert direct_calls == []
    assert (tmp_path / "off" / KEY).read_bytes() == b"".join(bytes(p) for p in parts)


def _refuse(monkeypatch, where: str) -> list[int]:
    """Make the file system refuse O_DIRECT at the open or at the first direct write."""
    refused: list[int] = []
    real_open, real_write, real_writev = os.open, os.write, os.writev

    def fussy_open(path, flags, *args, **kwargs):
        if where == "open" and flags & direct_io.O_DIRECT:
            refused.append(1)
            raise OSError(errno.EINVAL, "Invalid argument")
        return real_open(path, flags, *args, **kwargs)

    def fussy_write(fd, data):
        if where == "write" and _direct_on(fd):
            refused.append(1)
            raise OSError(errno.EINVAL, "Invalid argument")
        return real_write(fd, data)

    def fussy_writev(fd, buffers):
        if where == "write" and _direct_on(fd):
            refused.append(1)
            raise OSError(errno.EINVAL, "Invalid argument")
        return real_writev(fd, buffers)

    monkeypatch.setattr(os, "open", fussy_open)
    monkeypatch.setattr(os, "write", fussy_write)
    monkeypatch.setattr(os, "writev", fussy_writev)
    return refused


def _fault_in_c(monkeypatch, where: str, error: int = 0, seen: list[int] | None = None) -> list[int]:
    """The whole file in C meets the extension's own fault `where` (its open, its first
    direct write, a short write: the system calls there are not Python's), once; each
    fault is counted in `seen` (returned)."""
    seen = [] if seen is None else seen
    real = local._publish_direct

    def once(*args):
        if not seen:
            seen.append(1)
            _publish.inject_fault(where, error)
        try:
            return real(*args)
        finally:
            _publish.inject_fault("none", 0)

    monkeypatch.setattr(local, "_publish_direct", once)
    return seen


@pytest.mark.parametrize("where", ["open", "write"])
def test_a_refusal_writes_the_file_the_usual_way_and_turns_direct_writes_off(tmp_path, monkeypatch, where, staging):
    store = LocalStore(str(tmp_path))
    store._direct = DirectPolicy(str(tmp_path))
    store._direct._allowed = True  # as on ext4, whatever this folder is on
    if staging == "whole file in C":
        refused = _fault_in_c(monkeypatch, where, errno.EINVAL)
    else:
        refused = _refuse(monkeypatch, where)
    parts = _parts(3_000_001)
    store.write(KEY, parts)
    assert refused == [1]
    assert (tmp_path / KEY).read_bytes() == b"".join(bytes(p) for p in parts)
    assert not [p for p in (tmp_path / KEY).parent.iterdir() if p.name.endswith(".tmp")]
    assert store._direct.allowed() is False
    store.write(KEY, parts)  # no second try
    assert refused == [1]


def test_a_short_direct_write_finishes_through_the_page_cache(tmp_path, allowed, monkeypatch, staging):
    real_writev = os.writev
    shortened: list[int] = []

    def short_writev(fd, buffers):
        views = [memoryview(b).cast("B") for b in buffers]
        if not shortened and _direct_on(fd) and sum(v.nbytes for v in views) > ALIGN:
            shortened.append(sum(v.nbytes for v in views))
            first = b"".join(bytes(v) for v in views)[: ALIGN + 7]
            flags = fcntl.fcntl(fd, fcntl.F_GETFL)
            fcntl.fcntl(fd, fcntl.F_SETFL, flags & ~direct_io.O_DIRECT)  # (to write an unaligned amount here)
            try:
                return os.write(fd, first)  # an unaligned amount (a signal, a full disk)
            finally:
                fcntl.fcntl(fd, fcntl.F_SETFL, flags)
        return real_writev(fd, buffers)

    monkeypatch.setattr(os, "writev", short_writev)
    if staging == "whole file in C":
        _fault_in_c(monkeypatch, "short", seen=shortened)
    parts = _parts(BUFFER_BYTES + 3 * ALIGN + 5)
    store = LocalStore(str(tmp_path))
    store.write(KEY, parts)
    assert shortened
    assert (tmp_path / KEY).read_bytes() == b"".join(bytes(p) for p in parts)
    assert store._direct.allowed()  # (finished, not refused and written again)


def test_a_short_write_on_a_block_boundary_stays_direct(tmp_path, allowed, monkeypatch, staging):
    """Linux writes at most 2 GiB less a page in one call: a save of larger files gets a
    short write of a whole number of blocks. The rest of the file then stays around the
    page cache (every segment is still aligned) instead of going through it."""
    real_writev = os.writev
    shortened: list[int] = []

    def short_writev(fd, buffers):
        views = [memoryview(b).cast("B") for b in buffers]
        if not shortened and _direct_on(fd) and views[0].nbytes > ALIGN:
            shortened.append(1)
            return os.write(fd, views[0][:ALIGN])  # (aligned memory, one block: a direct write)
        return real_writev(fd, buffers)

    monkeypatch.setattr(os, "writev", short_writev)
    if staging == "whole file in C":
        _fault_in_c(monkeypatch, "short_aligned", seen=shortened)
    parts = [_aligned(3 * BUFFER_BYTES // 4, 1), b"h" * 100, _aligned(BUFFER_BYTES, 2), b"tail" * 9]
    LocalStore(str(tmp_path)).write(KEY, parts)
    assert shortened
    assert _resident_pages(tmp_path / KEY) <= 1  # (only the unaligned end went through the page cache)
    assert (tmp_path / KEY).read_bytes() == b"".join(bytes(p) for p in parts)


def test_threads_writing_at_once_each_get_their_file(tmp_path, allowed):
    store = LocalStore(str(tmp_path))
    expected = {}
    errors: list[BaseException] = []

    def write(i: int) -> None:
        try:
            for j in range(3):
                key = f"events/{i:012d}/{j:012d}_worker_{i}.tfevents"
                parts = _parts(DIRECT_FROM + 12_345 * (i + 1) + j, seed=10 * i + j)
                expected[key] = b"".join(bytes(p) for p in parts)
                store.write(key, parts)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=write, args=(i,)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors
    for key, data in expected.items():
        assert (tmp_path / key).read_bytes() == data


def test_only_block_file_systems_are_chosen(tmp_path, monkeypatch):
    if sys.platform.startswith("linux") and os.path.isdir("/proc/self") and direct_io._statfs_type("/proc/self") is not None:
        assert not direct_io_allowed("/proc/self")  # procfs
    if os.path.isdir("/dev/shm") and direct_io._statfs_type("/dev/shm") == 0x01021994:
        assert not direct_io_allowed("/dev/shm")  # tmpfs: no device to write to
    for off in ("off", "0", "no"):
        monkeypatch.setenv("STEPSCOPE_DIRECT_IO", off)
        assert not direct_io_allowed(str(tmp_path))


def test_a_job_saved_with_direct_writes_reads_back_exactly(tmp_path, allowed, direct_calls):
    """Through the writer and the reader: a step of large tensors (its event file goes
    around the page cache) reads back as saved, CRCs checked."""
    from stepscope.capture.writer import Writer
    from stepscope.trial import create_trial

    rng = np.random.default_rng(3)
    saved = {step: {"weights/w": rng.standard_normal((700, 513)).astype(np.float32), "gradients/w": rng.standard_normal(5).astype(np.float64)} for step in (0, 10)}
    writer = Writer(str(tmp_path))
    for step, tensors in saved.items():
        assert writer.write_step(step, "TRAIN", step, tensors)
    assert writer.close()
    assert len(direct_calls) == 2  # one event file per step, each over DIRECT_FROM
    trial = create_trial(str(tmp_path))
    assert trial.steps() == [0, 10]
    for step, tensors in saved.items():
        for name, value in tensors.items():
            np.testing.assert_array_equal(trial.tensor(name).value(step), value)


@pytest.mark.parametrize("switch", [None, "auto", "1"])
def test_a_backlogged_writing_thread_takes_the_page_cache_unless_told_always(tmp_path, monkeypatch, direct_calls, switch):
    if switch is None:
        monkeypatch.delenv("STEPSCOPE_DIRECT_IO", raising=False)  # the default: auto
    else:
        monkeypatch.setenv("STEPSCOPE_DIRECT_IO", switch)
    if not direct_io_allowed(str(tmp_path)):
        pytest.skip(f"{tmp_path} is not on ext4, XFS or Btrfs")
    store = LocalStore(str(tmp_path))
    parts = _parts(DIRECT_FROM + 5)
    try:
        direct_io.set_backlogged(True)
        store.write(KEY, parts)
        assert direct_calls == ([DIRECT_FROM + 5] if switch == "1" else [])
        direct_io.set_backlogged(False)
        store.write(KEY, parts)
        assert len(direct_calls) == (2 if switch == "1" else 1)
    finally:
        direct_io.set_backlogged(False)
    assert (tmp_path / KEY).read_bytes() == b"".join(bytes(p) for p in parts)


def test_a_writer_that_falls_behind_writes_through_the_page_cache_until_it_catches_up(tmp_path, monkeypatch, direct_calls):
    """Thirty 2 MB steps handed over while the store holds the first write: with more
    than BACKLOG_BYTES behind them the first ones go through the page cache, the last
    directly (little behind them: caught up); a step handed over later goes directly;
    every step reads back."""
    from stepscope.capture.writer import BACKLOG_BYTES, Writer
    from stepscope.trial import create_trial

    monkeypatch.delenv("STEPSCOPE_DIRECT_IO", raising=False)
    if not direct_io_allowed(str(tmp_path)):
        pytest.skip(f"{tmp_path} is not on ext4, XFS or Btrfs")
    writer = Writer(str(tmp_path))
    gate = threading.Event()
    write_many = writer.store.write_many

    def held(files, published=None):
        gate.wait(30)
        return write_many(files, published)

    monkeypatch.setattr(writer.store, "write_many", held)
    value = np.arange(1 << 19, dtype=np.float32)  # 2 MiB: a direct-sized event file per step
    steps = 30
    assert steps * value.nbytes > 1.5 * BACKLOG_BYTES
    for step in range(steps):
        assert writer.write_step(step, "TRAIN", step, {"weights/w": value + step})
    gate.set()
    assert writer.flush(60)
    behind_then = steps - len(direct_calls)
    # At least the steps with BACKLOG_BYTES behind them (the first may have been decided
    # before the rest came).
    assert behind_then >= steps - BACKLOG_BYTES // value.nbytes - 1, direct_calls
    assert 1 <= len(direct_calls), "a caught-up writer writes directly"
    assert writer.write_step(steps, "TRAIN", steps, {"weights/w": value + steps})
    assert writer.close()
    assert len(direct_calls) == steps - behind_then + 1
    trial = create_trial(str(tmp_path))
    for step in range(steps + 1):
        np.testing.assert_array_equal(trial.tensor("weights/w").value(step), value + step)


@pytest.mark.skipif(direct_io._stage is None, reason="stepscope.store._publish is not built here (or STEPSCOPE_PURE_PYTHON)")
def test_the_compiled_staging_copy_stops_where_the_buffer_fills_and_resumes_there():
    views = [memoryview(bytes(range(i, i + n))) for i, n in ((0, 5), (10, 0), (20, 7), (40, 3))]
    into = bytearray(6)
    assert direct_io._stage(into, 0, views, 0, 0) == (6, 2, 1)  # the empty view is passed over
    assert into == bytes([0, 1, 2, 3, 4, 20])
    assert direct_io._stage(into, 0, views, 2, 1) == (6, 3, 0)
    assert into == bytes([21, 22, 23, 24, 25, 26])
    assert direct_io._stage(into, 2, views, 3, 0) == (5, 4, 0)  # all copied
    assert into[2:5] == bytes([40, 41, 42])
    with pytest.raises(ValueError, match="out of range"):
        direct_io._stage(into, 7, views, 0, 0)
    with pytest.raises(ValueError, match="past the end of view 0"):
        direct_io._stage(into, 0, views, 0, 9)
    with pytest.raises(TypeError):
        direct_io._stage(bytes(6), 0, views, 0, 0)  # (read-only)


def _aligned(size: int, seed: int) -> memoryview:
    """`size` random bytes in page-aligned memory of their own (as the host arena gives a snapshot)."""
    memory = mmap.mmap(-1, -(-size // mmap.PAGESIZE) * mmap.PAGESIZE)
    array = np.frombuffer(memory, dtype=np.uint8, count=size)
    array[:] = np.random.default_rng(seed).integers(0, 256, size, dtype=np.uint8)
    return memoryview(array)


def test_an_aligned_large_view_at_an_aligned_offset_is_written_from_where_it_is(tmp_path, allowed, monkeypatch, staging):
    """Large views that start on an aligned address at an aligned file offset reach the file
    from their own memory (one gathered write), all but their unaligned end; the bytes
    around them, and a large view at an unaligned address or offset, are staged. The file
    is exact and none of its aligned part stays in the page cache."""
    placed_whole = _aligned(3 * ALIGN * 64, 1)  # (a multiple of ALIGN)
    placed_ragged = _aligned(ALIGN * 100 + 333, 2)
    unaligned_memory = memoryview(np.frombuffer(_aligned(ALIGN * 80 + 8, 3), dtype=np.uint8)[8:])
    parts: list[bytes | memoryview] = [b"h" * (2 * ALIGN), placed_whole, b"t" * 17, b"p" * (ALIGN - 17), placed_ragged,
                                       b"x" * (ALIGN - 333), unaligned_memory, b"y" * 5, _aligned(ALIGN * 70, 4), b"end" * 11]  # fmt: skip
    seen: list[int] = []  # the addresses of the buffers handed to the gathered writes
    real_writev = os.writev

    def spy(fd, buffers):
        seen.extend(np.frombuffer(b, dtype=np.uint8).__array_interface__["data"][0] for b in buffers)
        return real_writev(fd, buffers)

    monkeypatch.setattr(os, "writev", spy)
    staged: list[int] = []
    real_stage = direct_io._DirectFile.stage
    monkeypatch.setattr(direct_io._DirectFile, "stage", lambda self, views: (staged.append(sum(v.nbytes for v in views)), real_stage(self, views))[1])
    placed: list[int] = []  # (the whole file in C: the bytes it says it wrote from where they were)
    if staging == "whole file in C":
        real_c = local._publish_direct
        monkeypatch.setattr(local, "_publish_direct", lambda *args: (placed.append(real_c(*args)), placed[-1])[1])
    LocalStore(str(tmp_path)).write(KEY, parts)
    assert _resident_pages(tmp_path / KEY) <= 1  # (before the file is read back)
    data = (tmp_path / KEY).read_bytes()
    assert data == b"".join(bytes(p) for p in parts)
    address = {name: np.frombuffer(view, dtype=np.uint8).__array_interface__["data"][0] for name, view in
               (("whole", placed_whole), ("ragged", placed_ragged), ("unaligned", unaligned_memory), ("late", parts[8]))}  # fmt: skip
    if staging == "whole file in C":
        # Only the two qualify: the unaligned address and the unaligned offset are staged.
        assert placed == [placed_whole.nbytes + placed_ragged.nbytes - 333]
        return
    assert address["whole"] in seen and address["ragged"] in seen
    assert address["unaligned"] not in seen  # its address is not aligned: staged
    assert address["late"] not in seen  # aligned memory, but at an unaligned file offset (after "y" * 5): staged
    assert sum(staged) == len(data) - placed_whole.nbytes - (placed_ragged.nbytes - 333)


@pytest.mark.parametrize(("switch", "payload_crc"), [("1", "crc32c"), ("0", "crc32c"), ("1", "smdebug")])
def test_large_snapshots_are_padded_to_aligned_offsets_that_every_reader_skips(tmp_path, monkeypatch, switch, payload_crc):
    """Snapshots from the host arena, written where large files go around the page cache:
    each large tensor's bytes start on an aligned file offset, behind a padding record;
    the index points at the tensors' own records; the whole file is still a sequence of
    valid records that TensorBoard reads (the padding Events hold no summary), and the trial
    reads every value back. Where direct writes are off, no padding is written. With
    smdebug's placeholder CRC, every record has it (smdebug's reader checks each one)."""
    from tensorboard.backend.event_processing.event_file_loader import EventFileLoader
    from tensorboard.util import tensor_util

    from stepscope import events, records
    from stepscope.capture.host_arena import HostArena
    from stepscope.capture.writer import Writer
    from stepscope.trial import create_trial

    monkeypatch.setenv("STEPSCOPE_DIRECT_IO", switch)
    if not direct_io_allowed(str(tmp_path)) and switch == "1":
        pytest.skip(f"{tmp_path} is not on ext4, XFS or Btrfs")
    rng = np.random.default_rng(5)
    arena = HostArena()
    values = {"weights/a": rng.standard_normal((512, 256)).astype(np.float32), "gradients/b": rng.standard_normal(7).astype(np.float32),
              "weights/c": rng.standard_normal((300, 301)), "weights/d": rng.standard_normal((129, 1024)).astype(np.float32)}  # fmt: skip
    writer = Writer(str(tmp_path), payload_crc=payload_crc)
    assert writer.write_step(10, "TRAIN", 10, {name: arena.copy_of(value) for name, value in values.items()})
    assert writer.close()
    path = tmp_path / "events/000000000010/000000000010_worker_0.tfevents"
    data = path.read_bytes()
    index = json.loads((tmp_path / "index/000000000/000000000010_worker_0.json").read_text())
    for entry in index["tensor_payload"]:
        value = values[entry["tensorname"]]
        at = data.find(value.tobytes(), entry["start_idx"], entry["start_idx"] + entry["length"])
        assert at > entry["start_idx"]
        if switch == "1" and value.nbytes >= direct_io.PLACE_FROM:
            assert at % ALIGN == 0, entry
    kinds = []
    placeholder = payload_crc == "smdebug"
    for at, payload in records.iter_records(data, allow_placeholder_crc=placeholder):
        end = at + records.HEADER_SIZE + len(payload)
        assert (data[end : end + 4] == struct.pack("<I", records.SMDEBUG_PLACEHOLDER_CRC)) is placeholder
        event = events.Event()
        event.ParseFromString(bytes(payload))
        kinds.append("summary" if event.HasField("summary") else "version" if event.file_version else "padding")
        if kinds[-1] == "padding":
            assert event.step == 10 and len(payload) > 20
    assert kinds.count("padding") == (3 if switch == "1" else 0)  # one before each large tensor
    assert kinds.count("summary") == len(values)
    for entry in index["tensor_payload"]:  # (each entry is one whole record)
        assert records.parse_record(data, entry["start_idx"], allow_placeholder_crc=placeholder)[1] - entry["start_idx"] == entry["length"]
    # (TensorBoard checks CRCs: smdebug's placeholder is not one, whatever the padding)
    loaded = [e for e in EventFileLoader(str(path)).Load() if e.summary.value] if not placeholder else []
    assert {e.summary.value[0].tag for e in loaded} == (set(values) if not placeholder else set())
    for event in loaded:
        np.testing.assert_array_equal(tensor_util.make_ndarray(event.summary.value[0].tensor), values[event.summary.value[0].tag])
    trial = create_trial(str(tmp_path))
    for name, value in values.items():
        np.testing.assert_array_equal(trial.tensor(name).value(10), value)


def test_steps_batched_into_one_file_each_have_their_large_tensors_aligned(tmp_path, allowed):
    """Several steps in one event file (Writer.write_steps): the padding follows the file's
    running offset, so every large tensor of every step starts aligned and reads back."""
    from stepscope.capture.host_arena import HostArena
    from stepscope.capture.writer import Writer
    from stepscope.trial import create_trial

    rng = np.random.default_rng(8)
    arena = HostArena()
    values = {step: {"weights/a": rng.standard_normal((300, 301)).astype(np.float32), "loss": np.float32(step)} for step in (4, 5, 6)}
    writer = Writer(str(tmp_path))
    assert writer.write_steps([(step, "TRAIN", step, {k: arena.copy_of(v) if v.ndim else v for k, v in saved.items()}, {}) for step, saved in values.items()])
    assert writer.close()
    (path,) = tmp_path.glob("events/*/*.tfevents")
    data = path.read_bytes()
    for saved in values.values():
        assert data.find(saved["weights/a"].tobytes()) % ALIGN == 0
    trial = create_trial(str(tmp_path))
    for step, saved in values.items():
        np.testing.assert_array_equal(trial.tensor("weights/a").value(step), saved["weights/a"])
        assert trial.tensor("loss").value(step) == step


def test_the_compiled_buffer_address_is_numpy_s():
    """direct_io.buffer_address (in C where built) gives numpy's answer for every buffer the
    framer and the direct write ask about, and refuses a buffer that is not contiguous."""
    array = np.arange(100_000, dtype=np.uint8)
    for buffer in (b"record head", memoryview(array), memoryview(array)[3:], memoryview(array.view(np.float32))[5:], _aligned(ALIGN * 3, 0)):
        assert direct_io.buffer_address(buffer) == direct_io._buffer_address(buffer)
    with pytest.raises((BufferError, ValueError, TypeError)):
        direct_io.buffer_address(memoryview(array)[::2])


@pytest.mark.skipif(local._publish_direct is None, reason="stepscope.store._publish is not built here (or STEPSCOPE_PURE_PYTHON)")
def test_the_whole_file_in_c_places_exactly_what_qualifies_in_random_layouts(tmp_path, allowed, monkeypatch):
    """Random files of record-like parts (small heads, page-aligned snapshots of every size
    around PLACE_FROM and ALIGN, unaligned views): the file is exact, and the bytes written
    from where they were are those of the parts that start on an aligned address at an
    aligned file offset and hold PLACE_FROM bytes or more, less each one's unaligned end,
    counted here from the rule itself."""
    from stepscope.store.direct_io import PLACE_FROM

    placed: list[int] = []
    real = local._publish_direct
    monkeypatch.setattr(local, "_publish_direct", lambda *args: (placed.append(real(*args)), placed[-1])[1])
    rng = np.random.default_rng(11)
    store = LocalStore(str(tmp_path))
    for trial in range(12):
        parts: list[bytes | memoryview] = []
        expected = offset = 0
        while offset < DIRECT_FROM + ALIGN:
            kind = rng.integers(4)
            if kind == 0:
                part: bytes | memoryview = rng.bytes(int(rng.integers(1, 3 * ALIGN)))
            elif kind == 1:  # a snapshot on a page, sometimes under PLACE_FROM, sometimes ragged
                size = int(rng.choice([PLACE_FROM - ALIGN, PLACE_FROM, PLACE_FROM + 1, 3 * PLACE_FROM + 777, 5 * ALIGN]))
                part = _aligned(size, int(rng.integers(1 << 30)))
            elif kind == 2:  # large but off its page
                shift = int(rng.integers(1, 64))
                part = memoryview(np.frombuffer(_aligned(PLACE_FROM + shift, 0), dtype=np.uint8)[shift:])
            else:  # a head that brings the offset to the next block (as a padding record does)
                part = b"p" * (-offset % ALIGN or ALIGN)
            view = memoryview(part).cast("B")
            if view.nbytes >= PLACE_FROM and not offset % ALIGN and not direct_io._buffer_address(view) % ALIGN:
                expected += view.nbytes - view.nbytes % ALIGN
            parts.append(part)
            offset += view.nbytes
        key = f"events/{trial:012d}/{trial:012d}_worker_0.tfevents"
        store.write(key, parts)
        assert (tmp_path / key).read_bytes() == b"".join(bytes(p) for p in parts), trial
        assert placed[-1] == expected, trial
    assert len(placed) == 12 and any(placed) and not all(p == placed[0] for p in placed)


# --- a write_many's files in one call (_publish.c's publish_files) ----------------------

needs_files_in_c = pytest.mark.skipif(local._publish_files is None, reason="stepscope.store._publish is not built here (or STEPSCOPE_PURE_PYTHON)")


def _tree(root) -> dict[str, bytes]:
    """Every file below `root` (relative path: bytes)."""
    return {os.path.relpath(os.path.join(folder, name), root): open(os.path.join(folder, name), "rb").read()
            for folder, _, names in os.walk(root) for name in names}  # fmt: skip


def _calls_in_c(monkeypatch) -> list[tuple[int, object]]:
    """What each publish_files call returned: (published, stop)."""
    returned: list[tuple[int, object]] = []
    real = local._publish_files

    def spy(*args):
        returned.append(real(*args))
        return returned[-1]

    monkeypatch.setattr(local, "_publish_files", spy)
    return returned


@needs_files_in_c
def test_a_write_many_in_one_call_publishes_what_the_python_path_does(tmp_path, allowed, monkeypatch, direct_calls):
    """A save's files (an event file of many buffers in a new step folder, index files, a
    file at the root) are published in one call, folders walked in C, the event file
    written directly: the same files as the Python path, in order, each told; the call
    stops at the first file it does not write (neither small nor direct-sized, a name it
    does not encode), which the Python path publishes, with the rest."""
    parts = _parts(DIRECT_FROM + 12_000, seed=4) + [b"t" * i for i in range(1, 30)]  # (more buffers than the call holds at first)
    items = [
        (KEY, parts),
        ("index/000000000/000000000010_worker_0.json", b'{"meta": {}}'),
        ("index/000000000/000000000011_worker_0.json", b"{}"),
        ("training_job_end.ts", b""),
        ("collections/000000000/worker_0_collections.json", b"[1]"),
        ("index/000000000/medium.json", bytes(range(256)) * 1200),  # over a small file's size, under a direct one's
        ("index/000000000/after.json", b"after"),
    ]
    jobs = {}
    for way in ("c", "python"):
        job = tmp_path / way
        job.mkdir()
        store = LocalStore(str(job))
        assert store.data_alignment() == ALIGN  # (decided, as a writer's framer decides it)
        published: list[int] = []
        walks: list[str] = []
        with monkeypatch.context() as m:
            m.setattr(local, "_open_folder", lambda *a, _walks=walks, _real=local._open_folder, **k: _walks.append(a[2]) or _real(*a, **k))
            if way == "python":
                m.setattr(local, "_publish_files", None)
            returned = _calls_in_c(m) if way == "c" else []
            store.write_many(items, published.append)
        assert published == list(range(len(items)))
        if way == "c":
            assert returned == [(5, None)]  # (the medium file left to the Python path, with what follows)
            assert walks == ["index/000000000"]
        jobs[way] = _tree(job)
    assert direct_calls == [DIRECT_FROM + 12_435] * 2  # one direct write each way
    assert jobs["c"] == jobs["python"]
    assert jobs["c"][KEY] == b"".join(bytes(p) for p in parts) and jobs["c"]["index/000000000/after.json"] == b"after"
    assert not [name for name in jobs["c"] if name.endswith(".tmp")]
    # A name the call does not encode (not UTF-8: a surrogate from os.fsdecode) is the
    # Python path's, which writes it as os functions do.
    returned = _calls_in_c(monkeypatch)
    odd = "index/000000000/odd\udcff.json"
    LocalStore(str(tmp_path / "c")).write_many([("index/000000000/plain.json", b"1"), (odd, b"2")])
    assert returned == [(1, None)]
    assert (tmp_path / "c" / "index" / "000000000" / os.fsencode("odd\udcff.json").decode("utf-8", "surrogateescape")).read_bytes() == b"2"


@needs_files_in_c
def test_a_write_many_in_one_call_keeps_the_path_policy_and_names_what_failed(tmp_path, monkeypatch):
    """In C as in Python: a link on a folder's way is refused by name (the files before it
    published, nothing written where it points, nothing after it tried); a file where a
    folder should be is refused by name; a link at a file's name is replaced, never
    written through; a file that cannot be published (a folder at its name) stops the
    rest with an error naming its key and leaves no temporary; a missing root is made."""
    from stepscope.exceptions import StoreError

    job = tmp_path / "job"
    store = LocalStore(str(job))
    returned = _calls_in_c(monkeypatch)
    store.write_many([("index/000000000/a.json", b"a")])
    assert returned == [(0, None)] and store.read("index/000000000/a.json") == b"a"  # (the root made by the Python path)
    (tmp_path / "elsewhere").mkdir()
    os.symlink(tmp_path / "elsewhere", job / "linked")
    published: list[int] = []
    items = [("index/000000000/b.json", b"b"), ("linked/deeper/c.json", b"c"), ("index/000000000/d.json", b"d")]
    with pytest.raises(local.PathRefused, match="linked is a symbolic link"):
        store.write_many(items, published.append)
    assert returned[-1] == (1, None) and published == [0]
    assert store.read("index/000000000/b.json") == b"b" and not store.exists("index/000000000/d.json")
    assert list((tmp_path / "elsewhere").iterdir()) == []
    (job / "blocker").write_bytes(b"")
    with pytest.raises(StoreError, match="blocker"):
        store.write_many([("blocker/child.json", b"{}")])
    assert returned[-1] == (0, None)
    # An invalid key: the items before it are published, then it is refused.
    published = []
    with pytest.raises(StoreError, match="invalid key"):
        store.write_many([("index/000000000/k.json", b"k"), ("index/../escape.json", b"x")], published.append)
    assert returned[-1] == (1, None) and published == [0] and store.read("index/000000000/k.json") == b"k"
    assert not (tmp_path / "escape.json").exists()
    # A link at a name, small file and large: replaced by the file.
    (tmp_path / "target").write_bytes(b"keep")
    large = [b"x" * 100, np.arange(DIRECT_FROM, dtype=np.uint8).data]
    os.makedirs(job / "events" / "000000000010")
    for key in ("index/000000000/e.json", KEY):
        os.symlink(tmp_path / "target", job / key)
    store._direct._allowed = True  # (as on ext4: the large file goes the direct way here)
    store.write_many([("index/000000000/e.json", b"new"), (KEY, large)])
    assert returned[-1] == (2, None)
    assert (tmp_path / "target").read_bytes() == b"keep"
    assert store.read("index/000000000/e.json") == b"new" and store.read(KEY) == b"".join(bytes(p) for p in large)
    assert not (job / KEY).is_symlink()
    # A folder at the third file's name: the first two published, the error names the
    # third's key, the fourth is not tried, no temporary is left.
    (job / "index" / "000000000" / "blocked.json" / "inside").mkdir(parents=True)
    published = []
    batch = [("index/000000000/f.json", b"f"), ("events/000000000020/g.tfevents", large), ("index/000000000/blocked.json", b"c"),
             ("index/000000000/h.json", b"h")]  # fmt: skip
    with pytest.raises(StoreError, match="index/000000000/blocked.json"):
        store.write_many(batch, published.append)
    assert returned[-1][0] == 2 and isinstance(returned[-1][1], OSError) and published == [0, 1]
    assert store.read("events/000000000020/g.tfevents") == b"".join(bytes(p) for p in large) and not store.exists("index/000000000/h.json")
    assert not [p for p in job.rglob("*.tmp")] and not [p for p in job.rglob(".*")]


@needs_files_in_c
@pytest.mark.parametrize("where", ["open", "write"])
def test_a_direct_write_refused_in_one_call_goes_the_usual_way_and_a_failed_one_names_its_key(tmp_path, allowed, monkeypatch, where):
    """A refusal (EINVAL) at the event file's open or first direct write: the files before
    it are published, the policy is told (no direct write after), and the Python path
    writes it the usual way with the rest. Another error (a full disk): StoreError naming
    the key, the files before it published, nothing left behind."""
    from stepscope.exceptions import StoreError

    store = LocalStore(str(tmp_path))
    assert store.data_alignment() == ALIGN
    returned = _calls_in_c(monkeypatch)
    parts = _parts(DIRECT_FROM + 3, seed=7)
    items = [("index/000000000/a.json", b"a"), (KEY, parts), ("index/000000000/b.json", b"b")]
    published: list[int] = []
    _publish.inject_fault(where, errno.EINVAL)
    try:
        store.write_many(items, published.append)
    finally:
        _publish.inject_fault("none", 0)
    assert returned[-1][0] == 1 and isinstance(returned[-1][1], str) and published == [0, 1, 2]
    assert store.read(KEY) == b"".join(bytes(p) for p in parts) and store.read("index/000000000/b.json") == b"b"
    assert store._direct.allowed() is False
    store._direct._allowed = True
    key = "events/000000000020/000000000020_worker_0.tfevents"
    published = []
    _publish.inject_fault(where, errno.ENOSPC)
    try:
        with pytest.raises(StoreError, match=key):
            store.write_many([("index/000000000/c.json", b"c"), (key, parts), ("index/000000000/d.json", b"d")], published.append)
    finally:
        _publish.inject_fault("none", 0)
    assert published == [0] and not store.exists(key) and not store.exists("index/000000000/d.json")
    assert not [p for p in tmp_path.rglob("*.tmp")]


@needs_files_in_c
def test_a_step_s_event_and_index_files_reach_the_store_in_one_call(tmp_path, allowed, monkeypatch):
    """Through the writer: each step of large tensors is one publish_files call that
    publishes both of its files (the event file directly), and the job reads back."""
    from stepscope.capture.writer import Writer
    from stepscope.trial import create_trial

    returned = _calls_in_c(monkeypatch)
    rng = np.random.default_rng(5)
    saved = {step: {"weights/w": rng.standard_normal((600, 512)).astype(np.float32), "weights/b": rng.standard_normal(512).astype(np.float32)}
             for step in (0, 10, 20)}  # fmt: skip
    writer = Writer(str(tmp_path))
    for step, tensors in saved.items():
        assert writer.write_step(step, "TRAIN", step, tensors)
        assert writer.flush(30)
    assert writer.close()
    assert returned[:3] == [(2, None)] * 3
    trial = create_trial(str(tmp_path))
    for step, tensors in saved.items():
        for name, value in tensors.items():
            np.testing.assert_array_equal(trial.tensor(name).value(step), value)


def _vm_flags(address: int) -> list[str]:
    """The VmFlags of the mapping holding `address` (/proc/self/smaps)."""
    lines = open("/proc/self/smaps").read().splitlines()
    inside = False
    for line in lines:
        head = line.split(" ", 1)[0]
        if "-" in head and all(c in "0123456789abcdef-" for c in head):
            start, end = (int(x, 16) for x in head.split("-"))
            inside = start <= address < end
        elif inside and line.startswith("VmFlags:"):
            return line.split()[1:]
    raise AssertionError(f"no mapping holds {address:#x}")


def _address(buffer) -> int:
    return int(np.frombuffer(buffer, dtype=np.uint8).ctypes.data)


@pytest.mark.skipif(not os.path.exists("/proc/self/smaps"), reason="no /proc/self/smaps (not Linux)")
def test_memory_handed_to_the_device_is_private_and_asks_for_huge_pages():
    """The staging buffer and the host arena's blocks are private anonymous memory that
    asks for transparent huge pages (MADV_HUGEPAGE: VmFlags `hg`), so that a direct write
    pins fewer, physically contiguous pages, and is wiped in a forked child (WIPEONFORK:
    `wf`): the child reads zeros and its writes stay its own. Whether the kernel backs
    them with huge pages is its choice (none where THP is off)."""
    from stepscope.capture.host_arena import HostArena

    memory = direct_io.device_memory(4 << 20)
    small = direct_io.device_memory(64 << 10)
    arena = HostArena()
    snapshot = arena.empty((1 << 20,), np.float32)
    buffers = {"device_memory": _address(memory), "a staging buffer": _address(direct_io.staging_buffer()), "an arena block": int(snapshot.ctypes.data)}
    for what, address in buffers.items():
        flags = _vm_flags(address)
        assert address % mmap.PAGESIZE == 0 and "sh" not in flags, (what, flags)
        if hasattr(mmap, "MADV_HUGEPAGE"):
            assert "hg" in flags, (what, flags)
        assert "wf" in flags, (what, flags)
    assert "hg" not in _vm_flags(_address(small))  # (under a huge page: not worth asking)
    memory[:5] = b"mine!"
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.write(write, memory[:5])
            memory[:5] = b"kid's"
        finally:
            os._exit(0)
    os.close(write)
    os.waitpid(pid, 0)
    seen = os.read(read, 5)
    os.close(read)
    assert seen == bytes(5) and memory[:5] == b"mine!"


@needs_files_in_c
def test_the_one_call_leaves_a_folder_s_first_large_file_to_the_path_that_decides(tmp_path, allowed, monkeypatch, direct_calls):
    """Before the folder's first large file, the one call writes no large file (deciding
    needs the folder, which may not exist yet: decided then, it would say no for good);
    the Python path decides at that file, and the next large files go through the call."""
    returned = _calls_in_c(monkeypatch)
    store = LocalStore(str(tmp_path / "not yet"))
    parts = _parts(DIRECT_FROM + 1, seed=9)
    store.write_many([("index/000000000/a.json", b"a"), (KEY, parts)])
    assert returned == [(0, None)]  # (no root yet: all of it the Python path's)
    key = "events/000000000020/000000000020_worker_0.tfevents"
    store.write_many([(key, parts), ("index/000000000/b.json", b"b")])
    assert store._direct.allowed() and returned[-1] == (2, None)
    assert direct_calls == [DIRECT_FROM + 1] * 2  # (the first in Python's call, the second in the one call)
    assert store.read(KEY) == store.read(key) == b"".join(bytes(p) for p in parts)
