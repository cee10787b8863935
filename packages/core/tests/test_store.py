import sys

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


# --- the interface callers use instead of reaching into a backend ----------------------------


def _fill(store):
    keys = ["a.json", "index/000000000/000000000001_worker_0.json", "index/000000000/000000000002_worker_0.json",
            "index/000000001/000000001000_worker_0.json", "stepscope-traces/r0/t.parquet", "stepscope-traces/r1/t.parquet"]
    for n, key in enumerate(keys):
        store.write(key, b"x" * (n + 1))
    return keys


def test_size_folders_prefix_removal_on_both_backends(store):
    keys = _fill(store)
    assert [store.size(k) for k in keys] == list(range(1, len(keys) + 1))
    with pytest.raises(FileNotFoundError):
        store.size("index/none.json")
    top = store.list_folder("")
    assert (top.files, top.folders) == (["a.json"], ["index", "stepscope-traces"])
    index = store.list_folder("index/")
    assert (index.files, index.folders) == ([], ["000000000", "000000001"])
    leaf = store.list_folder("index/000000000")
    assert leaf.files == ["000000000001_worker_0.json", "000000000002_worker_0.json"] and leaf.folders == []
    assert store.list_folder("nothing") == type(top)()
    # The backend's one-level listing agrees with the one derived from a full listing.
    from stepscope.store import Store

    for folder in ("", "index", "index/000000000", "stepscope-traces"):
        assert store.list_folder(folder) == Store.list_folder(store, folder), folder
    assert store.root_exists()
    store.probe()
    assert store.delete_prefix("stepscope-traces/") == 2
    assert store.list("") == keys[:4]
    assert store.delete_prefix("nothing/") == 0
    with pytest.raises(StoreError, match="whole|everything"):
        store.delete_prefix("/")
    assert store.remove_stale_temporaries("worker_0") == 0


def test_local_path_where_there_is_one(store, tmp_path):
    if store.url.startswith("s3://"):
        assert store.local_path() is None and store.local_path("a.json") is None
        return
    assert store.local_path() == str(tmp_path / "job")
    store.write("index/a.json", b"{}")
    assert open(store.local_path("index/a.json"), "rb").read() == b"{}"
    with pytest.raises(StoreError):
        store.local_path("../outside")


def test_s3_prefix_removal_in_batches(s3_url):
    store = open_store(s3_url)
    for n in range(1005):  # DeleteObjects takes 1,000 keys a request: two requests
        store.write(f"stepscope-traces/{n:05d}.parquet", b"")
    store.write("kept.json", b"{}")
    assert store.delete_prefix("stepscope-traces") == 1005
    assert store.list("") == ["kept.json"]


def test_root_existence_and_probe(tmp_path, s3_endpoint):
    missing = open_store(str(tmp_path / "not-yet"))
    assert not missing.root_exists() and missing.list_folder("") == type(missing.list_folder(""))()
    with pytest.raises(StoreError, match="not-yet"):
        missing.probe()
    assert not (tmp_path / "not-yet").exists()  # asking created nothing
    # An S3 prefix exists once its bucket does; a missing bucket fails the probe, named.
    no_bucket = open_store("s3://no-such-bucket-for-probe/job")
    assert no_bucket.root_exists() and no_bucket.local_path() is None
    with pytest.raises(StoreError, match="s3://no-such-bucket-for-probe/job"):
        no_bucket.probe()


def test_local_folder_listing_leaves_links_out(tmp_path):
    import os

    store = LocalStore(tmp_path / "job")
    store.write("index/a.json", b"{}")
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / "secret.json").write_bytes(b"{}")
    os.symlink(tmp_path / "elsewhere", tmp_path / "job" / "rule-output")
    os.symlink(tmp_path / "elsewhere" / "secret.json", tmp_path / "job" / "index" / "b.json")
    os.mkfifo(tmp_path / "job" / "index" / "fifo")
    assert store.list_folder("").folders == ["index"]
    assert store.list_folder("index").files == ["a.json"]
    assert store.list_folder("rule-output") == type(store.list_folder(""))()  # through a link: nothing


def test_reopenable_url_opens_the_same_store(store):
    store.write("a/b.json", b"{}")
    again = open_store(store.reopenable_url())
    assert again.read("a/b.json") == b"{}" and type(again) is type(store)
    from stepscope.testing.large_jobs import MemoryStore

    assert MemoryStore().reopenable_url() is None  # nothing another process could open


def test_nothing_reaches_around_the_store():
    # Outside store/, code goes through the Store interface: no backend type checks, no
    # private attribute of a backend, no getattr probing for a method.
    import ast
    from pathlib import Path

    import stepscope

    core = Path(stepscope.__file__).parent
    roots = [core, core.parents[2] / "torch_plugin" / "src", core.parents[2] / "tf_plugin" / "src"]
    private = {"_client", "_os_path", "_root_str", "_folder_fd", "_with_folder", "_open_regular", "_key"}
    store_methods = {name for name in dir(open_store.__globals__["Store"]) if not name.startswith("__")}
    found = []
    for root in roots:
        for path in sorted(root.rglob("*.py")):
            if path.is_relative_to(core / "store"):
                continue
            for node in ast.walk(ast.parse(path.read_text())):
                where = f"{path.relative_to(root)}:{getattr(node, 'lineno', 0)}"
                if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "isinstance" and len(node.args) == 2:
                    if any(isinstance(n, ast.Name) and n.id in ("LocalStore", "S3Store") for n in ast.walk(node.args[1])):
                        found.append(f"{where}: isinstance(..., {ast.unparse(node.args[1])})")
                elif isinstance(node, ast.Attribute) and node.attr in private and "store" in ast.unparse(node.value).lower():
                    found.append(f"{where}: {ast.unparse(node)}")
                elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "getattr" and len(node.args) >= 2:
                    target, name = ast.unparse(node.args[0]).lower(), node.args[1]
                    if "store" in target and isinstance(name, ast.Constant) and (name.value in store_methods or name.value in private or name.value == "root"):
                        found.append(f"{where}: {ast.unparse(node)}")
    assert found == [], "use the Store interface (store/base.py):\n" + "\n".join(found)


def test_is_empty_stops_at_the_first_object(store, tmp_path):
    assert store.is_empty()
    store.write("index/000000000/000000000001_worker_0.json", b"{}")
    assert not store.is_empty()
    store.delete("index/000000000/000000000001_worker_0.json")
    assert store.is_empty() == (store.list("") == [])
    if store.url.startswith("s3://"):
        return
    import os

    # Locally, what a listing leaves out does not count: a temporary file, a link, a folder.
    root = tmp_path / "job"
    (root / "deep" / "er").mkdir(parents=True)
    (root / "index" / ".x.json.1.1.tmp").write_bytes(b"")
    os.symlink(tmp_path, root / "link")
    assert store.is_empty() and store.list("") == []
    (root / "deep" / "er" / "f.json").write_bytes(b"{}")
    assert not store.is_empty() and LocalStore(tmp_path / "missing").is_empty()


def test_write_many_publishes_in_order_and_says_which(store):
    items = [("events/000000000005/e.tfevents", [b"rec", memoryview(b"ords")])]
    items += [(f"index/000000000/{s:012d}_worker_0.json", f'{{"step": {s}}}'.encode()) for s in range(5, 9)]
    items += [("index/000000001/000000001000_worker_0.json", b"{}"), ("index/000000000/000000000009_worker_0.json", b"[]")]
    published = []
    store.write_many(items, published.append)
    assert published == list(range(len(items)))
    assert [store.read(key) for key, _ in items] == [b"records", *(f'{{"step": {s}}}'.encode() for s in range(5, 9)), b"{}", b"[]"]
    store.write_many([])  # nothing to do, no callback needed


def test_a_folder_walk_opens_each_folder_once_and_keeps_only_the_last(tmp_path, monkeypatch):
    # A save walks two folders (its event file's, its index file's): each system call of
    # the walk is the writer's CPU, which training on every core loses. The root and each
    # component are opened once, nothing else is asked of the kernel on the way, and every
    # descriptor but the folder's own is closed.
    import os

    store = LocalStore(tmp_path / "job")
    store.write("events/000000000010/a.tfevents", b"x")  # (the folders exist now)
    calls = []
    for name in ("open", "close", "dup", "stat", "mkdir"):
        real = getattr(os, name)
        monkeypatch.setattr(os, name, lambda *a, _real=real, _name=name, **k: calls.append(_name) or _real(*a, **k))
    fd = store._folder_fd("events/000000000010", create=True)
    monkeypatch.undo()
    try:
        assert os.path.samestat(os.fstat(fd), os.stat(tmp_path / "job" / "events" / "000000000010"))
    finally:
        os.close(fd)
    assert calls == ["open", "open", "open", "close", "close"]  # root, events, the step's; events and root closed
    # A new step's folder: made where the walk finds it missing, then opened.
    calls.clear()
    for name in ("open", "close", "dup", "stat", "mkdir"):
        real = getattr(os, name)
        monkeypatch.setattr(os, name, lambda *a, _real=real, _name=name, **k: calls.append(_name) or _real(*a, **k))
    fd = store._folder_fd("events/000000000020", create=True)
    monkeypatch.undo()
    os.close(fd)
    assert calls == ["open", "open", "open", "mkdir", "open", "close", "close"]
    # The root alone is the root's descriptor; a missing root is made when writing, and
    # not when reading.
    os.close(store._folder_fd("", create=False))
    missing = LocalStore(tmp_path / "new" / "job")
    with pytest.raises(FileNotFoundError):
        missing._folder_fd("events", create=False)
    os.close(missing._folder_fd("events", create=True))
    assert (tmp_path / "new" / "job" / "events").is_dir()


def test_local_write_many_walks_each_folder_once_and_keeps_the_path_policy(tmp_path, monkeypatch):
    import os

    from stepscope.store import local

    store = LocalStore(tmp_path / "job")
    walks = []
    real = local._open_folder
    monkeypatch.setattr(local, "_open_folder", lambda *a, **k: walks.append(a[2]) or real(*a, **k))
    store.write_many([(f"index/000000000/{s:012d}_worker_0.json", b"{}") for s in range(50)] + [("other/x.json", b"1")])
    assert walks == ["index/000000000", "other"]  # a run of keys in one folder: one walk
    assert len(store.list("index/")) == 50 and store.read("other/x.json") == b"1"
    # A link planted on a later item's way: the items before it are published, the error
    # names the refused folder, nothing after it is tried, no temporary is left behind.
    (tmp_path / "elsewhere").mkdir()
    os.symlink(tmp_path / "elsewhere", tmp_path / "job" / "linked")
    published = []
    items = [("index/000000000/a.json", b"a"), ("linked/b.json", b"b"), ("index/000000000/c.json", b"c")]
    with pytest.raises(local.PathRefused, match="linked is a symbolic link"):
        store.write_many(items, published.append)
    assert published == [0] and store.exists("index/000000000/a.json") and not store.exists("index/000000000/c.json")
    assert list((tmp_path / "elsewhere").iterdir()) == []
    assert not [p for p in (tmp_path / "job").rglob("*.tmp")]
    # A file where a name's folder should be: a StoreError naming that file.
    (tmp_path / "job" / "blocker").write_bytes(b"")
    with pytest.raises(StoreError, match="blocker"):
        store.write_many([("blocker/child.json", b"{}")])


def test_write_many_keeps_a_subclass_s_own_write(tmp_path):
    class Recording(LocalStore):
        def __init__(self, root):
            super().__init__(root)
            self.keys = []

        def write(self, key, data):
            self.keys.append(key)
            super().write(key, data)

    store = Recording(tmp_path)
    store.write_many([("a/1.json", b"1"), ("a/2.json", b"2")])
    assert store.keys == ["a/1.json", "a/2.json"] and store.read("a/2.json") == b"2"


def test_a_forked_child_names_its_temporaries_by_its_own_pid(tmp_path):
    # Temporary names carry the pid (asked once, not per file): a child that inherits the
    # parent's must not share its names, or two processes could write one temporary.
    import os

    from stepscope.store import local

    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report, write a file, and leave without pytest's cleanup
        try:
            LocalStore(tmp_path).write_many([("child/a.json", b"{}")])
            os.write(write, f"{local._process['pid']} {os.getpid()}".encode())
        finally:
            os._exit(0)
    os.close(write)
    os.waitpid(pid, 0)
    seen, actual = os.read(read, 100).decode().split()
    os.close(read)
    assert seen == actual == str(pid) and local._process["pid"] == os.getpid()
    assert LocalStore(tmp_path).read("child/a.json") == b"{}"


@pytest.mark.parametrize("compiled", [True, False], ids=["compiled", "python"])
def test_a_run_of_small_files_is_published_whole_and_an_error_stops_it_naming_the_file(tmp_path, monkeypatch, compiled):
    # A batch's index files (one `bytes` each, one folder) go through _publish.c's
    # publish_small with the GIL released once; the same files, order, callbacks and
    # errors as the Python path, file for file.
    import os

    from stepscope.store import local

    if compiled and local._publish_small is None:
        pytest.skip("stepscope.store._publish is not built here")
    if not compiled:
        monkeypatch.setattr(local, "_publish_small", None)
    calls = []
    if compiled:
        real = local._publish_small
        monkeypatch.setattr(local, "_publish_small", lambda fd, run: calls.append(len(run)) or real(fd, run))
    job = tmp_path / "job"
    store = LocalStore(job)
    folder = "index/000000000"
    items = [(f"{folder}/{s:012d}_worker_0.json", f'{{"step": {s}}}'.encode()) for s in range(20)]
    items.insert(10, (f"{folder}/large.json", [b"x" * 10, b"y"]))  # not one bytes: the Python way, the run goes on after
    published = []
    store.write_many(items, published.append)
    assert published == list(range(21)) and calls == ([10, 10] if compiled else [])
    assert [store.read(key) for key, _ in items] == [data if isinstance(data, bytes) else b"x" * 10 + b"y" for _, data in items]
    # A link at a name is replaced by the file, never written through.
    (tmp_path / "target").write_bytes(b"keep")
    os.unlink(job / folder / "000000000003_worker_0.json")
    os.symlink(tmp_path / "target", job / folder / "000000000003_worker_0.json")
    store.write_many([(f"{folder}/000000000003_worker_0.json", b"new")])
    assert (tmp_path / "target").read_bytes() == b"keep" and not (job / folder / "000000000003_worker_0.json").is_symlink()
    # A folder in the way of the third file: the first two are published, the error names
    # the third, nothing after it is tried, no temporary is left behind.
    (job / folder / "blocked.json").mkdir()
    (job / folder / "blocked.json" / "inside").write_bytes(b"")
    published = []
    batch = [(f"{folder}/a.json", b"a"), (f"{folder}/b.json", b"b"), (f"{folder}/blocked.json", b"c"), (f"{folder}/d.json", b"d")]
    with pytest.raises(StoreError, match="blocked.json"):
        store.write_many(batch, published.append)
    assert published == [0, 1] and store.read(f"{folder}/b.json") == b"b" and not store.exists(f"{folder}/d.json")
    assert not [p for p in job.rglob("*.tmp")]


def test_small_files_are_published_unnamed_where_the_file_system_allows_and_a_taken_name_is_replaced(tmp_path):
    """Where the folder's file system has unnamed files (O_TMPFILE), publish_small writes
    each file unnamed and links it in: the switch stays on through a run of new names and
    through a name that is taken (that file goes the temporary-name way, which alone may
    replace what is there; a link is replaced, not written through). No temporary is
    left, each file holds its bytes."""
    import os

    from stepscope.store import local

    if local._publish_small is None:
        pytest.skip("stepscope.store._publish is not built here")
    publisher = sys.modules["stepscope.store._publish"]
    try:
        os.close(os.open(tmp_path, os.O_WRONLY | os.O_TMPFILE))
    except (OSError, AttributeError):  # (no O_TMPFILE outside Linux)
        pytest.skip(f"{tmp_path}'s file system has no unnamed files")
    if not publisher.unnamed_files():
        pytest.skip("an earlier test's folder refused unnamed files in this process")
    (tmp_path / "target").write_bytes(b"keep")
    os.symlink(tmp_path / "target", tmp_path / "taken.json")
    (tmp_path / "replaced.json").write_bytes(b"old")
    fd = os.open(tmp_path, os.O_RDONLY)
    try:
        files = [(f".{i}.tmp", f"{i}.json", b"%d" % i) for i in range(5)]
        files[2:2] = [(".t.tmp", "taken.json", b"new"), (".r.tmp", "replaced.json", b"newer")]
        assert local._publish_small(fd, files) == (7, None)
    finally:
        os.close(fd)
    assert publisher.unnamed_files(), "a new name or a taken one turned the unnamed way off"
    assert (tmp_path / "target").read_bytes() == b"keep" and not (tmp_path / "taken.json").is_symlink()
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir() if p.name != "target"} == {name: data for _, name, data in files}


def test_publish_small_refuses_what_is_not_a_name_within_its_folder(tmp_path):
    import os

    from stepscope.store import local

    if local._publish_small is None:
        pytest.skip("stepscope.store._publish is not built here")
    fd = os.open(tmp_path, os.O_RDONLY)
    try:
        with pytest.raises(ValueError, match="not a name within the folder"):
            local._publish_small(fd, [(".t.tmp", "../escape.json", b"{}")])
        with pytest.raises(TypeError, match="item 0"):
            local._publish_small(fd, [(".t.tmp", "a.json", "not bytes")])
    finally:
        os.close(fd)
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_writes_follow_the_root_s_path_when_the_job_folder_is_moved_or_made_again(tmp_path):
    """Writes follow the root's path: a job folder moved away, or removed and made again,
    gets the next write at the path, not in the moved folder."""
    import shutil

    root = tmp_path / "job"
    store = LocalStore(root)
    store.write("events/000000000001/a.tfevents", b"1")
    (root).rename(tmp_path / "moved")
    store.write("events/000000000002/a.tfevents", b"2")
    assert (root / "events/000000000002/a.tfevents").read_bytes() == b"2"
    assert not (tmp_path / "moved/events/000000000002").exists()
    shutil.rmtree(root)
    root.mkdir()
    store.write("index/000000000/b.json", b"3")
    assert (root / "index/000000000/b.json").read_bytes() == b"3"
    shutil.rmtree(root / "index")
    store.write("index/000000000/c.json", b"4")  # (a folder below the root removed: made again)
    assert (root / "index/000000000/c.json").read_bytes() == b"4"
