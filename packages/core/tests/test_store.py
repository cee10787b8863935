import numpy as np
import pytest

from stepscope.exceptions import ConfigError, StoreError
from stepscope.store import LocalStore, open_store
from stepscope.store import s3 as s3_module


@pytest.fixture(params=["local", "s3"])
def store(request, tmp_path):
    if request.param == "local":
        return open_store(str(tmp_path / "job"))
    return open_store(request.getfixturevalue("s3_url"))


def test_write_read_list(store):
    store.write("events/000000000001/a.tfevents", [b"abc", memoryview(b"def")])
    store.write("index/000000000/000000000001_worker_0.json", b"{}")
    store.write("index/000000000/000000000002_worker_0.json", b"{}")
    assert store.read("events/000000000001/a.tfevents") == b"abcdef"
    assert store.read_range("events/000000000001/a.tfevents", 2, 3) == b"cde"
    assert store.read_ranges([("events/000000000001/a.tfevents", 0, 1), ("events/000000000001/a.tfevents", 5, 1)]) == [b"a", b"f"]
    assert store.list("index/") == ["index/000000000/000000000001_worker_0.json", "index/000000000/000000000002_worker_0.json"]
    assert store.list("index/", start_after="index/000000000/000000000001_worker_0.json") == ["index/000000000/000000000002_worker_0.json"]
    assert store.list("nothing/") == []
    assert store.exists("index/000000000/000000000001_worker_0.json") and not store.exists("index/nope")
    with pytest.raises(FileNotFoundError):
        store.read("missing")
    store.delete("index/000000000/000000000002_worker_0.json")
    assert not store.exists("index/000000000/000000000002_worker_0.json")


def test_list_after_key_skips_older_folders(tmp_path):
    store = LocalStore(tmp_path)
    for step in range(0, 3000, 500):
        store.write(f"index/{step // 1000:09d}/{step:012d}_worker_0.json", b"{}")
    assert store.list("index/", start_after="index/000000001/000000001500_worker_0.json") == [
        "index/000000002/000000002000_worker_0.json",
        "index/000000002/000000002500_worker_0.json",
    ]


def test_local_write_is_atomic_and_leaves_no_temp_files(tmp_path):
    store = LocalStore(tmp_path)

    class Boom:
        def __buffer__(self, flags):
            raise RuntimeError("disk went away")

    store.write("a/file.bin", b"old")
    with pytest.raises((TypeError, RuntimeError)):  # not a buffer (3.11) / raising buffer (3.12+)
        store.write("a/file.bin", [b"new-part", Boom()])
    assert store.read("a/file.bin") == b"old"
    assert [p.name for p in (tmp_path / "a").iterdir()] == ["file.bin"]


def test_out_dir_that_is_a_file(tmp_path):
    (tmp_path / "f").write_text("x")
    with pytest.raises(ConfigError, match="not a directory"):
        open_store(str(tmp_path / "f"))


def test_unwritable_target_names_the_path(tmp_path):
    (tmp_path / "blocker").write_text("x")
    store = LocalStore(tmp_path)
    with pytest.raises(StoreError, match="blocker"):
        store.write("blocker/child.json", b"{}")


def test_s3_multipart_upload(s3_url, monkeypatch):
    monkeypatch.setattr(s3_module, "MULTIPART_THRESHOLD", 6 * 1024 * 1024)
    monkeypatch.setattr(s3_module, "MULTIPART_CHUNK", 5 * 1024 * 1024)
    store = open_store(s3_url)
    data = np.random.default_rng(0).integers(0, 255, 13 * 1024 * 1024, dtype=np.uint8)
    store.write("big.bin", [memoryview(data[:7_000_000]), memoryview(data[7_000_000:])])
    assert store.read("big.bin") == data.tobytes()
    assert store.read_range("big.bin", 6_999_990, 20) == data[6_999_990:7_000_010].tobytes()


def test_s3_errors_name_the_url(s3_endpoint):
    store = open_store("s3://no-such-bucket-here/job")
    with pytest.raises(StoreError, match="s3://no-such-bucket-here/job/x.json"):
        store.write("x.json", b"{}")
    with pytest.raises(ConfigError, match="no bucket"):
        open_store("s3:///prefix")


def test_gathered_writes_handle_many_parts_and_short_writes(tmp_path, monkeypatch):
    import os

    from stepscope.store import local

    real_writev = os.writev

    def short_writev(fd, buffers):  # the kernel may accept less than asked
        first = memoryview(buffers[0])
        return real_writev(fd, [first[: max(1, first.nbytes // 2)]])

    parts = [bytes([i % 251]) * (i % 7 + 1) for i in range(3000)] + [memoryview(np.arange(1000, dtype=np.int64)).cast("B")]
    expected = b"".join(bytes(p) for p in parts)
    store = LocalStore(tmp_path)
    store.write("many.bin", parts)
    assert store.read("many.bin") == expected
    monkeypatch.setattr(local.os, "writev", short_writev)
    store.write("short.bin", parts[:50] + parts[-1:])
    assert store.read("short.bin") == b"".join(bytes(p) for p in parts[:50] + parts[-1:])


def test_listing_a_missing_root_does_not_walk_its_parent(tmp_path):
    from stepscope.store import open_store

    (tmp_path / "job_sibling").mkdir()
    (tmp_path / "job_sibling" / "a.json").write_text("{}")
    assert open_store(str(tmp_path / "job")).list("") == []
