import json
import shutil
import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import pytest

from stepscope import ModeKeys, create_trial, layout
from stepscope.capture.writer import Writer
from stepscope.exceptions import CorruptRecord, StepNotYetAvailable, StepUnavailable, TensorUnavailable, TensorUnavailableForStep
from stepscope.reductions import reduction_tensor_name


def test_trial_reads_what_was_written(tmp_path, write_job):
    written, _ = write_job(tmp_path / "job", steps=5, eval_steps=2)
    trial = create_trial(str(tmp_path / "job"))
    assert trial.steps() == list(range(7))
    assert trial.steps(ModeKeys.TRAIN) == [0, 1, 2, 3, 4] and trial.steps("eval") == [0, 1]
    assert trial.modes() == [ModeKeys.TRAIN, ModeKeys.EVAL]
    assert trial.workers() == ["worker_0"] and trial.is_complete()
    assert trial.tensor_names() == ["fc.weight", "loss"]
    assert trial.tensor_names(regex="^fc") == ["fc.weight"]
    assert trial.tensor_names(collection="losses") == ["loss"]
    assert trial.tensor_names(step=1, mode="eval") == ["fc.weight", "loss"]
    weight = trial.tensor("fc.weight")
    for step, tensors in written.items():
        np.testing.assert_array_equal(weight.value(step), tensors["fc.weight"])
    np.testing.assert_array_equal(weight.value(1, mode=ModeKeys.EVAL), written[6]["fc.weight"])
    assert trial.global_step(ModeKeys.EVAL, 1) == 6 and trial.mode_of(6) == (ModeKeys.EVAL, 1)
    values = trial.tensor("loss").values(mode=ModeKeys.TRAIN)
    assert sorted(values) == [0, 1, 2, 3, 4] and all(values[s] == written[s]["loss"] for s in values)
    assert weight.shape(3) == (4, 3)
    expected_l2 = float(np.sqrt(np.sum(written[2]["fc.weight"].astype(np.float64) ** 2)))
    assert weight.reduction_value(2, "l2") == pytest.approx(expected_l2)
    assert weight.reduction_value(2, "mean", abs=True) == pytest.approx(float(np.mean(np.abs(written[2]["fc.weight"]))))
    with pytest.raises(TensorUnavailable, match="'nope'"):
        trial.tensor("nope")
    with pytest.raises(StepUnavailable):
        weight.value(99)


def test_saved_reductions_are_preferred(tmp_path):
    writer = Writer(str(tmp_path))
    raw = np.array([3.0, -4.0], dtype=np.float32)
    writer.write_step(0, ModeKeys.TRAIN, 0, {reduction_tensor_name("w", "l2"): np.float32(42.0), reduction_tensor_name("w", "max", abs=True): np.float32(7.0)})
    writer.write_step(1, ModeKeys.TRAIN, 1, {"w": raw})
    writer.close()
    w = create_trial(str(tmp_path)).tensor("w")
    assert w.reduction_value(0, "l2") == 42.0 and w.reduction_value(0, "l2_norm") == 42.0
    assert w.reduction_value(0, "max", abs=True) == 7.0
    assert w.reduction_values(0) == {("l2", False): 42.0, ("max", True): 7.0}
    assert w.reduction_value(1, "l2") == pytest.approx(5.0)
    with pytest.raises(TensorUnavailableForStep, match="neither the raw value nor its min"):
        w.reduction_value(0, "min")


def test_step_is_complete_only_when_every_worker_published(tmp_path, write_job):
    write_job(tmp_path, steps=3, eval_steps=0, worker="worker_0", num_workers=2, close=False)
    trial = create_trial(str(tmp_path))
    assert trial.steps() == [] and trial.steps(show_incomplete=True) == [0, 1, 2]
    write_job(tmp_path, steps=2, eval_steps=0, worker="worker_1", num_workers=2, close=False, seed=1)
    assert trial.refresh() == [0, 1]
    assert trial.steps() == [0, 1] and trial.workers() == ["worker_0", "worker_1"]
    w = trial.tensor("fc.weight")
    assert w.workers(1) == ["worker_0", "worker_1"]
    assert not np.array_equal(w.value(1, worker="worker_0"), w.value(1, worker="worker_1"))


def test_reader_follows_a_writer_in_another_thread(tmp_path):
    writer = Writer(str(tmp_path))
    trial = create_trial(str(tmp_path))
    seen_new = []

    def produce():
        for step in range(20):
            writer.write_step(step, ModeKeys.TRAIN, step, {"x": np.full(3, step, np.float32)})
            time.sleep(0.01)
        writer.close()

    thread = threading.Thread(target=produce)
    thread.start()
    with pytest.raises(StepNotYetAvailable):
        trial.wait_for_steps([10_000], timeout=0.05)
    trial.wait_for_steps(range(20), timeout=30)
    deadline = time.monotonic() + 30
    while not trial.is_complete() and time.monotonic() < deadline:
        seen_new.append(trial.refresh())
        time.sleep(0.01)
    thread.join()
    assert trial.steps() == list(range(20))
    assert all(step not in range(20) for batch in seen_new for step in batch)  # refresh lists only new steps
    assert [trial.tensor("x").value(s)[0] for s in (0, 19)] == [0, 19]
    with pytest.raises(StepUnavailable):
        trial.wait_for_steps([25], timeout=1)


@pytest.mark.heavy
def test_reader_follows_a_writer_process(tmp_path):
    script = textwrap.dedent(
        f"""
        import time, numpy as np
        from stepscope.capture.writer import Writer
        from stepscope.modes import ModeKeys
        w = Writer({str(tmp_path)!r})
        for step in range(30):
            w.write_step(step, ModeKeys.TRAIN, step, {{"x": np.full(2, step, np.float64)}})
            w.flush()
            time.sleep(0.02)
        w.close()
        """
    )
    process = subprocess.Popen([sys.executable, "-c", script])
    try:
        trial = create_trial(str(tmp_path))
        observed = []
        deadline = time.monotonic() + 60
        while not trial.is_complete() and time.monotonic() < deadline:
            observed.append(len(trial.steps()))
            time.sleep(0.02)
            trial.refresh()
        assert process.wait(30) == 0
        assert trial.steps() == list(range(30))
        assert observed == sorted(observed) and len(set(observed)) > 2  # it watched steps arrive
        assert trial.tensor("x").value(29).tolist() == [29.0, 29.0]
    finally:
        process.kill()


def test_corrupt_files_are_named_and_the_rest_stays_readable(tmp_path, write_job, caplog):
    written, _ = write_job(tmp_path, steps=5, eval_steps=0)
    event_2 = tmp_path / "events/000000000002/000000000002_worker_0.tfevents"
    data = bytearray(event_2.read_bytes())
    data[-10] ^= 0x40
    event_2.write_bytes(bytes(data))
    event_3 = tmp_path / "events/000000000003/000000000003_worker_0.tfevents"
    event_3.write_bytes(event_3.read_bytes()[:-30])
    (tmp_path / "index/000000000/000000000004_worker_0.json").write_text("{ not json")
    shutil.rmtree(tmp_path / "stepscope-index")  # as in a running job, or smdebug's output
    trial = create_trial(str(tmp_path))
    assert "000000000004_worker_0.json" in caplog.text
    assert trial.steps() == [0, 1, 2, 3]
    loss = trial.tensor("loss")
    with pytest.raises(CorruptRecord, match=r"000000000002_worker_0.tfevents at byte \d+: payload CRC mismatch"):
        loss.value(2)
    with pytest.raises(CorruptRecord, match=r"000000000003_worker_0.tfevents at byte \d+: truncated"):
        loss.value(3)
    assert loss.value(1) == written[1]["loss"]
    np.testing.assert_array_equal(trial.tensor("fc.weight").value(2), written[2]["fc.weight"])  # the earlier record is intact


def test_trial_on_s3(s3_url, write_job):
    written, _ = write_job(s3_url, steps=4, eval_steps=1)
    trial = create_trial(s3_url)
    assert trial.steps() == [0, 1, 2, 3, 4] and trial.is_complete()
    values = trial.tensor("fc.weight").values()
    assert all(np.array_equal(values[s], written[s]["fc.weight"]) for s in written)


def test_index_points_at_whole_records(tmp_path, write_job):
    write_job(tmp_path, steps=1, eval_steps=0)
    index = json.loads((tmp_path / "index/000000000/000000000000_worker_0.json").read_text())
    assert index["meta"] == {"mode": "TRAIN", "mode_step": 0, "event_file_name": "events/000000000000/000000000000_worker_0.tfevents"}
    blob = (tmp_path / index["meta"]["event_file_name"]).read_bytes()
    last = index["tensor_payload"][-1]
    assert last["start_idx"] + last["length"] == len(blob)
    assert index["shape_payload"] == [{"tensorname": "fc.weight", "originalname": "fc.weight", "shape": [4, 3]}]


def test_tensorboard_reads_our_event_files(tmp_path, write_job):
    from tensorboard.backend.event_processing.event_file_loader import EventFileLoader

    written, _ = write_job(tmp_path, steps=2, eval_steps=0)
    path = tmp_path / "events/000000000001/000000000001_worker_0.tfevents"
    loaded = list(EventFileLoader(str(path)).Load())
    assert loaded[0].file_version == "brain.Event:2"
    by_tag = {e.summary.value[0].tag: e for e in loaded[1:]}
    assert set(by_tag) == {"fc.weight", "loss"} and by_tag["loss"].step == 1
    from tensorboard.util import tensor_util

    np.testing.assert_array_equal(tensor_util.make_ndarray(by_tag["fc.weight"].summary.value[0].tensor), written[1]["fc.weight"])


@pytest.mark.parametrize("payload_crc", ["crc32c", "smdebug"])
def test_tensorboard_and_the_indexes_read_every_step_of_batched_scalar_steps(tmp_path, payload_crc):
    """Steps that save only scalars share one event file per batch (held_steps.py): TensorBoard
    reads every step's loss from those files; each step's entry points at exactly its own
    records: in an index file of its own where smdebug's reader may read the job (its
    placeholder CRC), else in the batch's held table, which the batch's last index file names
    (Writer._publish_held); and the trial reads the same values."""
    from tensorboard.backend.event_processing.event_file_loader import EventFileLoader
    from tensorboard.util import tensor_util

    from stepscope.capture.held_steps import HeldSteps
    from stepscope.events import decode_tensor_event
    from stepscope.records import parse_record

    losses = {step: np.float32(1.0 / (step + 1)) for step in range(250)}
    writer = Writer(str(tmp_path), payload_crc=payload_crc)
    held = HeldSteps(writer, max_steps=100, max_s=3600)
    for step, loss in losses.items():
        held.hand_over(step, ModeKeys.TRAIN, step, {"CrossEntropyLoss_output_0": loss}, {}, scalars=True)
    held.close()
    assert writer.close() is True

    event_files = sorted(tmp_path.glob("events/*/*.tfevents"))
    assert len(event_files) == 3  # 100 + 100 + 50 steps
    read = {}
    for path in event_files:
        events = list(EventFileLoader(str(path)).Load())
        if payload_crc == "smdebug":  # (every record has smdebug's placeholder, the first too:
            assert events == []  # TensorBoard's reader checks payload CRCs and stops at it)
            continue
        assert events[0].file_version == "brain.Event:2"
        for event in events[1:]:
            (value,) = event.summary.value
            assert value.tag == "CrossEntropyLoss_output_0" and event.step not in read
            read[event.step] = tensor_util.make_ndarray(value.tensor)
    if payload_crc == "crc32c":
        assert sorted(read) == sorted(losses) and all(read[s] == losses[s] for s in losses)

    entries = {}  # step -> (event file, start, length)
    for path in tmp_path.glob("index/*/*.json"):
        index = json.loads(path.read_text())
        (entry,) = index["tensor_payload"]
        entries[index["meta"]["mode_step"]] = (index["meta"]["event_file_name"], entry["start_idx"], entry["length"])
        if "step_table" in index["meta"]:
            table = json.loads((tmp_path / index["meta"]["step_table"]).read_text())
            assert table["steps"][-1]["step"] == index["meta"]["mode_step"]
            for row in table["steps"]:
                event_file = row.get("event", layout.event_file_key(row["step"], "worker_0"))  # (none: the step's own name)
                entries.setdefault(row["step"], (event_file, row["starts"][0], row["lengths"][0]))
    if payload_crc == "smdebug":
        assert len(list(tmp_path.glob("index/*/*.json"))) == 250 and not list(tmp_path.glob("stepscope-index/*/*.held.json"))
    else:  # the last step of each batch has an index file; its held table holds the batch
        assert sorted(int(p.name[:12]) for p in tmp_path.glob("index/*/*.json")) == [99, 199, 249]
        assert sorted(p.name for p in tmp_path.glob("stepscope-index/*/*.held.json")) == [
            "000000000000_000000000099.held.json", "000000000100_000000000199.held.json", "000000000200_000000000249.held.json",
        ]  # fmt: skip
    assert sorted(entries) == sorted(losses)
    for step, loss in losses.items():
        event_file, start, length = entries[step]
        payload, end = parse_record((tmp_path / event_file).read_bytes(), start, allow_placeholder_crc=payload_crc == "smdebug")
        assert end == start + length
        decoded = decode_tensor_event(payload)
        assert (decoded.name, decoded.step, decoded.mode_step, decoded.value) == ("CrossEntropyLoss_output_0", step, step, loss)
    trial = create_trial(str(tmp_path))
    assert trial.steps() == sorted(losses)
    assert all(trial.tensor("CrossEntropyLoss_output_0").value(s) == losses[s] for s in (0, 99, 100, 249))


def test_step_tables_open_long_jobs_and_a_bad_one_falls_back(tmp_path, write_job, caplog):
    written, _ = write_job(tmp_path, steps=5, eval_steps=2)
    tables = sorted((tmp_path / "stepscope-index/worker_0").iterdir())
    assert [t.name for t in tables] == ["000000000000_000000000006.json"]
    reference = create_trial(str(tmp_path))
    table = json.loads(tables[0].read_text())
    assert [s["step"] for s in table["steps"]] == list(range(7)) and table["layouts"] == [["fc.weight", "loss"]]
    tables[0].write_text(tables[0].read_text()[:40])
    fallback = create_trial(str(tmp_path))
    assert "skipping unreadable step table" in caplog.text
    for trial in (reference, fallback):
        assert trial.steps() == list(range(7)) and trial.steps(ModeKeys.EVAL) == [0, 1]
        np.testing.assert_array_equal(trial.tensor("fc.weight").value(4), written[4]["fc.weight"])
        assert trial.tensor("fc.weight").shape(6) == (4, 3)


def test_the_trial_is_a_facade_over_parts_of_one_job_each():
    """Issue 23's bound: no class of the read side's trial over ~450 lines (Trial was 659);
    the public API stays on the facade."""
    import ast
    import inspect

    from stepscope import trial as package
    from stepscope.trial import Trial, collections, files, status, steps, values

    sizes = {}
    for module in (package, collections, files, status, steps, values):
        for node in ast.parse(inspect.getsource(module)).body:
            if isinstance(node, ast.ClassDef):
                sizes[f"{module.__name__}.{node.name}"] = node.end_lineno - node.lineno + 1
    assert {"stepscope.trial.Trial", "stepscope.trial.steps.StepCatalog", "stepscope.trial.values.ValueReader", "stepscope.trial.collections.JobCollections"} <= set(sizes)
    assert max(sizes.values()) <= 450, sizes
    public = {"refresh", "steps", "modes", "mode_of", "global_step", "workers", "num_workers", "is_complete", "last_complete_step", "wait_for_steps", "collections", "collection", "module_class", "scopes", "scope_map", "status", "status_in", "failed_workers", "failed_workers_in", "tensor_names", "tensor", "has_tensor", "read_many", "profiler", "problems"}
    assert public <= set(dir(Trial))
