"""LocalStore writes a file's buffers straight from their memory, no system call writing more
than WRITE_SLICE (large page-cache folios make one big write cost several times the CPU of
the same bytes in slices: store/local.py) where it writes through the page cache, and the
file holds exactly the bytes given, in order, whatever the mix of small and large buffers."""

from __future__ import annotations

import os

import numpy as np
import pytest

from stepscope.store import local
from stepscope.store.local import WRITE_SLICE, LocalStore


@pytest.fixture
def calls(monkeypatch):
    """Bytes each os.write / os.writev call was given (through the page cache: large files
    that would go around it, direct_io.py, are not these tests' subject)."""
    monkeypatch.setenv("STEPSCOPE_DIRECT_IO", "0")
    seen: list[int] = []
    write, writev = os.write, os.writev

    def counted_write(fd, data):
        seen.append(memoryview(data).nbytes)
        return write(fd, data)

    def counted_writev(fd, buffers):
        seen.append(sum(memoryview(b).nbytes for b in buffers))
        return writev(fd, buffers)

    monkeypatch.setattr(local.os, "write", counted_write)
    monkeypatch.setattr(local.os, "writev", counted_writev)
    return seen


def _parts(rng: np.random.Generator) -> list[bytes | memoryview]:
    """Record-like buffers: small headers around tensors of every size class."""
    parts: list[bytes | memoryview] = []
    for n in (3, 70_000, 1, 262_144 // 4, 262_144 // 4 + 1, 800_000, 5, 2_000_000):
        parts.append(rng.bytes(int(rng.integers(1, 40))))
        parts.append(memoryview(rng.standard_normal(n).astype(np.float32)).cast("B"))
        parts.append(b"\x00\x01\x02\x03")
    return parts


def test_every_call_writes_at_most_a_slice_and_the_file_is_exact(tmp_path, calls):
    parts = _parts(np.random.default_rng(0))
    LocalStore(str(tmp_path)).write("events/000000000001/000000000001_worker_0.tfevents", parts)
    written = (tmp_path / "events/000000000001/000000000001_worker_0.tfevents").read_bytes()
    assert written == b"".join(bytes(p) for p in parts)
    assert calls and max(calls) <= WRITE_SLICE
    assert sum(calls) == len(written)
    # Small buffers are gathered: far fewer calls than buffers, about one per slice.
    assert len(calls) <= len(written) // WRITE_SLICE + len(parts) // 3 + 2


def test_a_small_file_is_one_call(tmp_path, calls):
    LocalStore(str(tmp_path)).write("index/000000000/000000000007_worker_0.json", b'{"meta": {}}')
    assert calls == [12]
    assert (tmp_path / "index/000000000/000000000007_worker_0.json").read_bytes() == b'{"meta": {}}'


def test_short_writes_resume_where_the_kernel_stopped(tmp_path, monkeypatch):
    """A write or writev that takes fewer bytes than given (signals) is resumed, not lost."""
    write = os.write

    def short_write(fd, data):
        view = memoryview(data)
        return write(fd, view[: max(1, view.nbytes // 3)])

    def short_writev(fd, buffers):
        return write(fd, memoryview(buffers[0])[: max(1, memoryview(buffers[0]).nbytes // 2)])

    monkeypatch.setattr(local.os, "write", short_write)
    monkeypatch.setattr(local.os, "writev", short_writev)
    parts = _parts(np.random.default_rng(1))
    LocalStore(str(tmp_path)).write("big/file", parts)
    assert (tmp_path / "big/file").read_bytes() == b"".join(bytes(p) for p in parts)
