"""A held batch of scalar steps published as a held table and its last step's index file
(Writer._publish_held) instead of an index file per step, and read back by the trial:
opening, following the job as it grows, a table published before its index file, and
index files that name a table they should not."""

import json

import numpy as np
import pytest

from stepscope import create_trial, job_files, layout
from stepscope.capture import step_framing
from stepscope.capture.writer import Writer
from stepscope.exceptions import CorruptRecord
from stepscope.modes import ModeKeys

pytestmark = pytest.mark.skipif(step_framing._encode is None, reason="held batches are framed in C (not built here, or STEPSCOPE_PURE_PYTHON)")


def _loss(step):
    return np.float32(1.0 / (step + 1))


def _held(first, last):
    return [(s, ModeKeys.TRAIN, s, {"loss": _loss(s), "lr": 0.1}, {}) for s in range(first, last + 1)]


def _tensor_step(writer, step):
    assert writer.write_step(step, ModeKeys.TRAIN, step, {"loss": _loss(step), "fc.weight": np.full((4, 3), step, np.float32)})


def _job(tmp_path, close=True, **writer_options):
    """Tensor steps 0 and 50, held batches 1-49 and 51-120, a tensor step 121, a held batch
    122-124 and one of two steps (125-126: too short for a table). Closed, the job also has
    the step table of its block (steps 0-126); else the writer is returned open, flushed."""
    writer = Writer(str(tmp_path), **writer_options)
    _tensor_step(writer, 0)
    assert writer.write_held_steps(_held(1, 49))
    _tensor_step(writer, 50)
    assert writer.write_held_steps(_held(51, 120))
    _tensor_step(writer, 121)
    assert writer.write_held_steps(_held(122, 124))
    assert writer.write_held_steps(_held(125, 126))
    if close:
        assert writer.close() is True
    else:
        assert writer.flush()
    return writer


def _index_steps(tmp_path):
    return sorted(int(p.name[:12]) for p in tmp_path.glob("index/*/*.json"))


def test_a_held_batch_is_a_table_and_one_index_file_and_reads_back_whole(tmp_path):
    _job(tmp_path)
    assert _index_steps(tmp_path) == [0, 49, 50, 120, 121, 124, 125, 126]
    held = sorted(p.name for p in tmp_path.glob(f"{layout.STEP_TABLE_DIR}/worker_0/*{layout.HELD_TABLE_SUFFIX}"))
    assert held == ["000000000001_000000000049.held.json", "000000000051_000000000120.held.json", "000000000122_000000000124.held.json"]
    last = json.loads((tmp_path / layout.index_file_key(120, "worker_0")).read_text())
    assert last["meta"]["step_table"] == layout.held_table_key("worker_0", 51, 120)
    trial = create_trial(str(tmp_path))
    assert trial.steps() == list(range(127)) and trial.problems == []
    assert [float(trial.tensor("loss").value(s)) for s in range(127)] == [float(_loss(s)) for s in range(127)]
    assert trial.tensor("fc.weight").steps() == [0, 50, 121]
    # The same job as smdebug's reader needs it: an index file per step, no held table.
    smdebug = tmp_path / "smdebug"
    _job(smdebug, payload_crc="smdebug")
    assert _index_steps(smdebug) == list(range(127)) and not list(smdebug.glob(f"{layout.STEP_TABLE_DIR}/*/*{layout.HELD_TABLE_SUFFIX}"))
    assert create_trial(str(smdebug)).steps() == list(range(127))


@pytest.mark.parametrize("where", ["local", "s3"])
def test_a_reader_following_the_job_sees_each_batch_once_its_last_index_file_is_there(tmp_path, request, where):
    from stepscope.store import open_store

    job = str(tmp_path) if where == "local" else request.getfixturevalue("s3_url")
    writer = Writer(open_store(job))
    _tensor_step(writer, 0)
    writer.flush()
    trial = create_trial(open_store(job))
    assert trial.steps() == [0]
    for first in range(1, 400, 100):
        assert writer.write_held_steps(_held(first, first + 98))
        _tensor_step(writer, first + 99)
        writer.flush()
        assert trial.refresh() == list(range(first, first + 100))
        assert float(trial.tensor("loss").value(first + 50)) == float(_loss(first + 50))
    assert trial.refresh() == []
    keys = open_store(job).list("")
    assert sum(key.startswith("index/") for key in keys) == 9 and layout.held_table_key("worker_0", 301, 399) in keys
    writer.close()
    assert trial.steps() == list(range(401)) and trial.problems == []
    assert create_trial(open_store(job)).steps() == list(range(401))


def test_a_held_table_published_before_its_index_file_hides_no_step(tmp_path):
    # The writer publishes the held table, then the batch's last index file: a reader
    # between the two must not let the table's steps carry it past the steps before them
    # that it has not listed yet (here 50, published before the table).
    writer = _job(tmp_path, close=False)
    later = [layout.index_file_key(step, "worker_0") for step in (50, 120, 121, 124, 125, 126)]
    hidden = {key: (tmp_path / key).read_bytes() for key in later}
    for key in hidden:
        (tmp_path / key).unlink()
    trial = create_trial(str(tmp_path))
    assert trial.steps() == list(range(50))  # 51-119: their table is not named by an index file yet
    for key, data in hidden.items():
        (tmp_path / key).write_bytes(data)
    assert trial.refresh() == list(range(50, 127))
    writer.close()
    assert trial.refresh() == [] and trial.steps() == list(range(127)) and trial.problems == []


def test_an_index_file_naming_another_worker_s_table_or_a_path_outside_is_refused_by_name(tmp_path):
    writer = _job(tmp_path, close=False)
    key = tmp_path / layout.index_file_key(120, "worker_0")
    index = json.loads(key.read_text())
    other = layout.held_table_key("worker_1", 51, 120)
    (tmp_path / other).parent.mkdir(parents=True)
    (tmp_path / other).write_bytes((tmp_path / index["meta"]["step_table"]).read_bytes().replace(b'"worker_0"', b'"worker_1"'))
    index["meta"]["step_table"] = other
    key.write_text(json.dumps(index))
    (tmp_path / layout.held_table_key("worker_0", 51, 120)).unlink()
    trial = create_trial(str(tmp_path))
    assert 120 in trial.steps() and 51 not in trial.steps()  # the index file's own step stays readable
    assert any("is not one of worker_0's" in problem for problem in trial.problems)
    writer.close()
    for outside in ("../x.held.json", "events/000000000050/000000000050_worker_0.tfevents", f"{layout.STEP_TABLE_DIR}/worker_0/a.json", 7):
        index["meta"]["step_table"] = outside
        with pytest.raises(CorruptRecord, match="step_table"):
            job_files.parse_index(json.dumps(index).encode(), "index.json")


def test_both_index_decoders_read_the_table_a_last_index_file_names(tmp_path):
    _job(tmp_path)
    data = (tmp_path / layout.index_file_key(49, "worker_0")).read_bytes()
    fast = job_files.parse_index(data, "index.json")
    checked = job_files._parse_index_checked(data, "index.json")
    split = job_files.IndexParser().parse(data, "index.json")
    assert fast == checked == split and fast.step_table == layout.held_table_key("worker_0", 1, 49)
    assert job_files.parse_index((tmp_path / layout.index_file_key(50, "worker_0")).read_bytes(), "index.json").step_table == ""


def test_a_held_table_that_could_not_be_read_is_read_again_at_the_next_refresh(tmp_path, monkeypatch):
    writer = _job(tmp_path, close=False)
    table = layout.held_table_key("worker_0", 51, 120)
    real_read = type(create_trial(str(tmp_path)).store).read
    failing = {table}

    def flaky(store, key, max_size=None):
        if key in failing:
            raise OSError("the store did not answer")
        return real_read(store, key, max_size)

    monkeypatch.setattr(type(create_trial(str(tmp_path)).store), "read", flaky)
    trial = create_trial(str(tmp_path))
    assert 51 not in trial.steps() and 120 in trial.steps() and 121 in trial.steps()
    assert any("the store did not answer" in problem for problem in trial.problems)
    failing.clear()
    assert trial.refresh() == list(range(51, 120))
    assert trial.steps() == list(range(127))
    writer.close()



def test_a_malformed_held_table_is_reported_once_and_not_read_again(tmp_path, monkeypatch):
    writer = _job(tmp_path, close=False)
    table = layout.held_table_key("worker_0", 51, 120)
    (tmp_path / table).write_text('{"version": 1, "steps": 5}')
    store_type = type(create_trial(str(tmp_path)).store)
    real_read, reads = store_type.read, []

    def counted(store, key, max_size=None):
        reads.append(key)
        return real_read(store, key, max_size)

    monkeypatch.setattr(store_type, "read", counted)
    trial = create_trial(str(tmp_path))
    assert 51 not in trial.steps() and {50, 120, 121} <= set(trial.steps())
    assert any(table in problem for problem in trial.problems)
    assert reads.count(table) == 1
    assert trial.refresh() == [] and reads.count(table) == 1
    writer.close()
