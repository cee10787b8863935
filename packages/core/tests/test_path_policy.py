"""The local store's path policy: every read and write stays inside the job's root
without following a symbolic link anywhere on the way, for files and folders alike."""

from __future__ import annotations

import os

import pytest

from stepscope.exceptions import StoreError
from stepscope.store import LocalStore
from stepscope.store.local import PathRefused, resolve_within


@pytest.fixture
def job(tmp_path):
    store = LocalStore(tmp_path / "job")
    store.write("index/000000000/000000000000_worker_0.json", b"{}")
    store.write("rule-output/a.json", b"a")
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.json").write_bytes(b"secret")
    return store, tmp_path / "job", outside


def _outside_names(outside):
    return sorted(p.name for p in outside.rglob("*"))


@pytest.mark.parametrize("key", ["rule-output/x.json", "rule-output/deep/er/x.json", "stepscope-traces/a/b.parquet"])
def test_a_write_through_a_linked_folder_is_refused(job, key):
    store, root, outside = job
    top = key.split("/")[0]
    if (root / top).exists():
        os.rename(root / top, root / (top + ".old"))
    (root / top).symlink_to(outside)
    before = _outside_names(outside)
    with pytest.raises(PathRefused, match=str(root / top)):
        store.write(key, b"x")
    assert _outside_names(outside) == before


def test_a_link_at_any_folder_level_is_refused_for_reads(job):
    store, root, outside = job
    (outside / "sub").mkdir()
    (outside / "sub" / "f.json").write_bytes(b"stolen")
    (root / "index" / "000000000" / "linked").symlink_to(outside / "sub")
    with pytest.raises(PathRefused, match="linked"):
        store.read("index/000000000/linked/f.json")
    with pytest.raises(PathRefused):
        store.read_range("index/000000000/linked/f.json", 0, 3)
    with pytest.raises(PathRefused):
        store.open_file("index/000000000/linked/f.json")
    assert not store.exists("index/000000000/linked/f.json")
    assert store.list("index/000000000/linked/") == []
    assert store.read("index/000000000/000000000000_worker_0.json") == b"{}"  # the rest is readable


def test_a_linked_file_is_refused_and_a_link_at_a_written_name_is_replaced_not_followed(job):
    store, root, outside = job
    (root / "rule-output" / "b.json").symlink_to(outside / "secret.json")
    with pytest.raises(PathRefused, match="b.json"):
        store.read("rule-output/b.json")
    with pytest.raises(PathRefused):
        store.open_file("rule-output/b.json")
    store.write("rule-output/b.json", b"ours")  # rename replaces the link itself
    assert (outside / "secret.json").read_bytes() == b"secret"
    assert not (root / "rule-output" / "b.json").is_symlink() and store.read("rule-output/b.json") == b"ours"


def test_delete_through_a_linked_folder_deletes_nothing(job):
    store, root, outside = job
    (root / "link").symlink_to(outside)
    store.delete("link/secret.json")
    assert (outside / "secret.json").exists()


def test_a_folder_swapped_for_a_link_after_a_read_is_still_refused(job):
    # No cache of checked folders that a later swap could get past.
    store, root, outside = job
    assert store.read("rule-output/a.json") == b"a"
    os.rename(root / "rule-output", root / "moved")
    (root / "rule-output").symlink_to(outside)
    (outside / "a.json").write_bytes(b"theirs")
    with pytest.raises(PathRefused):
        store.read("rule-output/a.json")


def test_a_deep_folder_chain_is_listed_to_a_bound_without_recursion_error(tmp_path):
    store = LocalStore(tmp_path / "job")
    store.write("index/a.json", b"{}")
    deep = str(tmp_path / "job" / "deep")
    fd = os.open(str(tmp_path / "job"), os.O_RDONLY)
    try:  # made relative to each folder (a deeper chain would pass PATH_MAX by path)
        os.mkdir("deep", dir_fd=fd)
        for _ in range(200):  # the bench probe goes to 1,400 (pytest cannot delete that)
            child = os.open("deep", os.O_RDONLY, dir_fd=fd)
            os.close(fd)
            fd = child
            os.mkdir("deep", dir_fd=fd)
    finally:
        os.close(fd)
    assert os.path.isdir(deep)
    assert store.list() == ["index/a.json"]


def test_resolve_within_names_the_link(tmp_path):
    (tmp_path / "team-a").mkdir()
    (tmp_path / "team-b" / "job").mkdir(parents=True)
    (tmp_path / "team-a" / "link").symlink_to(tmp_path / "team-b" / "job")
    assert resolve_within(tmp_path, "team-b/job") == os.path.join(os.path.realpath(tmp_path), "team-b", "job")
    with pytest.raises(PathRefused, match="link"):
        resolve_within(tmp_path, "team-a/link")
    with pytest.raises(FileNotFoundError):
        resolve_within(tmp_path, "team-a/none")
    with pytest.raises(StoreError):
        resolve_within(tmp_path, "../x")


def test_the_root_itself_may_be_a_link(tmp_path):
    (tmp_path / "real").mkdir()
    (tmp_path / "alias").symlink_to(tmp_path / "real")
    store = LocalStore(tmp_path / "alias")
    store.write("index/a.json", b"1")
    assert store.read("index/a.json") == b"1" and store.list() == ["index/a.json"]


def test_an_export_skips_the_step_whose_event_file_is_a_link(tmp_path, write_job):
    import h5py

    from stepscope.export import export_hdf5

    job = tmp_path / "job"
    write_job(str(job), steps=4, eval_steps=0)
    linked = next(p for p in sorted((job / "events").rglob("*.tfevents")) if "000000000002" in p.name)
    outside = tmp_path / "outside.tfevents"
    linked.rename(outside)
    linked.symlink_to(outside)
    export_hdf5(str(job), str(tmp_path / "out.h5"))
    with h5py.File(tmp_path / "out.h5") as h5:
        assert sorted(h5["tensors"]["loss"]["step"][:].tolist()) == [0, 1, 3]
