"""The local store keeps job roots open between reads (a bounded, shared set): a read
opens one file below a held root, and the root is what is at its path when a listing looks."""

from __future__ import annotations

import os
import shutil
import threading

import pytest

from stepscope.store import LocalStore, local
from stepscope.store.local import PathRefused


def _count_root_opens(monkeypatch, root):
    opened = []
    real_open = os.open

    def counting_open(path, flags, *args, **kwargs):
        if os.fspath(path) == str(root):
            opened.append(path)
        return real_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(local.os, "open", counting_open)
    return opened


def _job(root, files=20):
    store = LocalStore(root)
    for i in range(files):
        store.write(f"index/000000000/{i:012d}_worker_0.json", f'{{"i": {i}}}'.encode())
        store.write(f"events/{i:012d}/{i:012d}_worker_0.tfevents", bytes([i]) * 10)
    return store


def test_a_job_root_is_opened_once_per_listing_not_once_per_read(tmp_path, monkeypatch):
    store = _job(tmp_path / "job")
    keys = store.list("index/")
    opened = _count_root_opens(monkeypatch, tmp_path / "job")
    values = [store.read(k) for k in keys] + [store.read_range(f"events/{i:012d}/{i:012d}_worker_0.tfevents", 2, 3) for i in range(20)]
    assert values[:20] == [f'{{"i": {i}}}'.encode() for i in range(20)] and values[20:] == [bytes([i]) * 3 for i in range(20)]
    assert len(opened) <= 1
    store.list("index/")
    opened.clear()
    store.read(keys[0])
    store.read(keys[1])
    assert len(opened) == 1


def test_a_job_deleted_and_written_again_reads_its_new_files(tmp_path):
    store = _job(tmp_path / "job")
    assert store.read("index/000000000/000000000003_worker_0.json") == b'{"i": 3}'
    shutil.rmtree(tmp_path / "job")
    again = LocalStore(tmp_path / "job")
    again.write("index/000000000/000000000003_worker_0.json", b"new")
    assert store.read("index/000000000/000000000003_worker_0.json") == b"new"  # no listing in between
    with pytest.raises(FileNotFoundError):
        store.read("index/000000000/000000000004_worker_0.json")


def test_a_job_moved_away_is_not_read_after_a_listing(tmp_path):
    store = _job(tmp_path / "job")
    assert store.read("index/000000000/000000000001_worker_0.json") == b'{"i": 1}'
    os.rename(tmp_path / "job", tmp_path / "moved")
    _job(tmp_path / "other", files=2)
    os.rename(tmp_path / "other", tmp_path / "job")
    assert store.list("index/") == ["index/000000000/000000000000_worker_0.json", "index/000000000/000000000001_worker_0.json"]
    store.write("index/000000000/000000000001_worker_0.json", b"the new job's")
    assert store.read("index/000000000/000000000001_worker_0.json") == b"the new job's"


def test_a_folder_swapped_for_a_link_below_a_held_root_is_refused(tmp_path):
    store = _job(tmp_path / "job")
    outside = tmp_path / "outside" / "000000000"
    outside.mkdir(parents=True)
    (outside / "000000000001_worker_0.json").write_bytes(b"theirs")
    assert store.read("index/000000000/000000000001_worker_0.json") == b'{"i": 1}'
    os.rename(tmp_path / "job" / "index", tmp_path / "job" / "index.old")
    (tmp_path / "job" / "index").symlink_to(tmp_path / "outside")
    with pytest.raises(PathRefused):
        store.read("index/000000000/000000000001_worker_0.json")


def _open_descriptors():
    return len(os.listdir("/proc/self/fd"))


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="counts descriptors in /proc")
def test_held_roots_are_bounded_and_survive_eviction_during_reads(tmp_path, monkeypatch):
    monkeypatch.setattr(local, "_roots", local._RootDescriptors(capacity=3))
    stores = [_job(tmp_path / f"job{j}", files=3) for j in range(12)]
    before = _open_descriptors()
    errors = []

    def reader(offset):
        try:
            for round_ in range(30):
                for j in range(len(stores)):
                    store = stores[(j + offset + round_) % len(stores)]
                    assert store.read("index/000000000/000000000002_worker_0.json") == b'{"i": 2}'
        except Exception as exc:  # reported below; a thread's exception would be lost
            errors.append(exc)

    threads = [threading.Thread(target=reader, args=(t,)) for t in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert len(local._roots._held) <= 3
    assert _open_descriptors() <= before + 3


def test_check_key_refuses_exactly_the_keys_with_an_empty_dot_or_dot_dot_part():
    import itertools

    from stepscope.exceptions import StoreError
    from stepscope.store.base import check_key

    def by_parts(key):
        return not key.startswith("/") and not any(part in ("", ".", "..") for part in key.rstrip("/").split("/"))

    for length in range(1, 8):
        for letters in itertools.product("a./", repeat=length):
            key = "".join(letters)
            try:
                check_key(key)
                accepted = True
            except StoreError:
                accepted = False
            assert accepted == by_parts(key), key


@pytest.mark.skipif(not hasattr(os, "fork"), reason="fork")
def test_a_forked_child_reads_through_the_held_root(tmp_path):
    store = _job(tmp_path / "job", files=2)
    assert store.read("index/000000000/000000000001_worker_0.json") == b'{"i": 1}'
    local._roots._lock.acquire()  # as if another thread were inside it at the fork
    try:
        pid = os.fork()
        if pid == 0:  # the child: exit status 0 when its read worked
            ok = store.read("index/000000000/000000000001_worker_0.json") == b'{"i": 1}'
            os._exit(0 if ok else 1)
    finally:
        local._roots._lock.release()
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
