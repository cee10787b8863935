"""What opening and refreshing a trial lists and reads: one listing per folder to open,
one collections file read until collections are asked for, step tables read only where they
replace index reads, and a refresh that lists only what can be new."""

from __future__ import annotations

import json

import numpy as np
import pytest

from stepscope import ModeKeys, create_trial, job_files
from stepscope.capture.collection_manager import CollectionManager
from stepscope.capture.writer import Writer
from stepscope.store.local import LocalStore


class RecordingStore(LocalStore):
    """A local store that records each listing, whole read and existence check, as
    ("list" | "read" | "exists", the job's top-level folder or file)."""

    def __init__(self, root):
        super().__init__(root)
        self.calls: list[tuple[str, str]] = []

    def list(self, prefix="", start_after=None):
        self.calls.append(("list", prefix.split("/")[0]))
        return super().list(prefix, start_after)

    def read(self, key, max_size=None):
        self.calls.append(("read", key.split("/")[0]))
        return super().read(key, max_size)

    def exists(self, key):
        self.calls.append(("exists", key))
        return super().exists(key)

    def take(self) -> list[tuple[str, str]]:
        calls, self.calls = self.calls, []
        return calls


def _value(worker: int, step: int) -> np.ndarray:
    return np.array([worker, step], dtype=np.int64)


def _write(writer: Writer, worker: int, steps) -> None:
    for step in steps:
        writer.write_step(step, ModeKeys.TRAIN, step, {"x": _value(worker, step)})


def _writer(tmp_path, worker: int, steps, num_workers: int = 1) -> Writer:
    """A worker's writer that published its collections file and `steps` (flushed, open)."""
    writer = Writer(str(tmp_path), f"worker_{worker}")
    writer.write_collections(CollectionManager().dumps(num_workers))
    _write(writer, worker, steps)
    assert writer.flush()
    return writer


def _job(tmp_path, workers: int, steps: int, num_workers: int | None = None) -> None:
    for worker in range(workers):
        assert _writer(tmp_path, worker, range(steps), num_workers or workers).close()


def test_opening_reads_one_collections_file_and_the_others_when_asked(tmp_path):
    _job(tmp_path, workers=3, steps=4)
    late = tmp_path / "collections/000000000/worker_2_collections.json"
    body = json.loads(late.read_text())
    body["collections"]["losses"]["tensor_names"] = ["loss_only_on_worker_2"]
    late.write_text(json.dumps(body))

    store = RecordingStore(tmp_path)
    trial = create_trial(store)
    opening = store.take()
    assert trial.num_workers == 3 and trial.steps() == [0, 1, 2, 3]
    assert opening.count(("read", "collections")) == 1
    assert opening.count(("read", "stepscope-index")) == 3 and ("read", "index") not in opening
    # The tables name the workers, so their collections files are known without a listing.
    assert sorted(c for c in opening if c[0] != "read") == [("exists", "training_job_end.ts"), ("list", "index"), ("list", "stepscope-index")]

    # The tensor names each worker recorded, united, once collections are asked for.
    assert "loss_only_on_worker_2" in trial.collection("losses").tensor_names
    assert store.take().count(("read", "collections")) == 2
    trial.collections()
    assert store.take() == []  # read once
    np.testing.assert_array_equal(trial.tensor("x").value(3, worker="worker_1"), _value(1, 3))


def test_a_bad_collections_file_read_later_is_still_reported(tmp_path, caplog):
    _job(tmp_path, workers=2, steps=2)
    (tmp_path / "collections/000000000/worker_1_collections.json").write_text("[1, 2]")
    trial = create_trial(str(tmp_path))
    assert trial.steps() == [0, 1]
    assert any("worker_1_collections.json" in p and "JSON object" in p for p in trial.problems), trial.problems


@pytest.mark.parametrize("edit", ["more_files_than_workers", "not_ours", "first_unreadable", "first_missing"])
def test_collections_files_are_all_read_at_opening_when_the_first_does_not_settle_the_job(tmp_path, edit):
    _job(tmp_path, workers=2, steps=3, num_workers=2)
    first = tmp_path / "collections/000000000/worker_0_collections.json"
    body = json.loads(first.read_text())
    if edit == "more_files_than_workers":
        body["_meta"]["num_workers"] = 1  # the other file says 2: the job has 2
    elif edit == "not_ours":
        body["_meta"].pop("writer", None)  # smdebug's: whether any file is ours decides the CRC check
    if edit == "first_missing":
        first.unlink()
    else:
        first.write_text("{" if edit == "first_unreadable" else json.dumps(body))
    store = RecordingStore(tmp_path)
    trial = create_trial(store)
    calls = store.take()
    assert calls.count(("read", "collections")) == 2
    assert calls.count(("list", "collections")) == (1 if edit in ("first_missing", "first_unreadable") else 0)
    assert trial.num_workers == 2 and trial.steps() == [0, 1, 2]
    np.testing.assert_array_equal(trial.tensor("x").value(2, worker="worker_1"), _value(1, 2))


def test_a_refresh_lists_only_what_can_be_new(tmp_path):
    writer = _writer(tmp_path, 0, range(3))
    store = RecordingStore(tmp_path)
    trial = create_trial(store)
    assert trial.steps() == [0, 1, 2] and store.take().count(("read", "index")) == 3  # no table yet

    # Nothing new: the end marker and the index files after the last step, nothing else.
    assert trial.refresh() == []
    assert store.take() == [("exists", "training_job_end.ts"), ("list", "index")]

    # One new step: its index file (a table could not save a read).
    _write(writer, 0, [3])
    assert writer.flush()
    assert trial.refresh() == [3]
    assert store.take() == [("exists", "training_job_end.ts"), ("list", "index"), ("read", "index")]

    # Three new steps and the writer closed (its table covers steps 0-6): the table is read
    # instead of three index files.
    _write(writer, 0, range(4, 7))
    assert writer.close()
    assert trial.refresh() == [4, 5, 6] and trial.is_complete()
    assert store.take() == [("exists", "training_job_end.ts"), ("list", "index"), ("list", "stepscope-index"), ("read", "stepscope-index")]
    assert [int(trial.tensor("x").value(s)[1]) for s in range(7)] == list(range(7))

    # Complete and nothing new: the table is not listed again.
    assert trial.refresh() == []
    assert store.take() == [("exists", "training_job_end.ts"), ("list", "index")]


def test_the_last_table_is_read_when_the_job_completes(tmp_path):
    writer = _writer(tmp_path, 0, range(3))
    store = RecordingStore(tmp_path)
    trial = create_trial(store)
    _write(writer, 0, range(3, 5))
    assert writer.flush()
    assert trial.refresh() == [3, 4]  # listed the tables: none yet, so two index files
    store.take()
    # The block's table is published at close, covering steps 0-5, and step 5 is new: the
    # table is read for it (steps 0-4 stay as their index files said).
    _write(writer, 0, [5])
    assert writer.close()
    assert trial.refresh() == [5]
    calls = store.take()
    assert ("read", "stepscope-index") in calls and ("read", "index") not in calls
    assert trial.steps() == list(range(6))
    np.testing.assert_array_equal(trial.tensor("x").value(5), _value(0, 5))


def test_a_worker_beyond_what_the_job_said_makes_the_collections_read(tmp_path):
    _open_writer = _writer(tmp_path, 0, range(2))  # (left open, as a running job is)
    store = RecordingStore(tmp_path)
    trial = create_trial(store)
    assert trial.steps() == [0, 1] and trial.num_workers == 1
    store.take()
    assert trial.refresh() == [] and ("list", "collections") not in store.take()  # every worker's file is known

    # A second worker (its file says 2) publishes steps 0-3; 2 and 3 lie past what was
    # listed, and the trial looks for the new worker's collections file.
    writer_1 = Writer(str(tmp_path), "worker_1")
    writer_1.write_collections(CollectionManager().dumps(2))
    _write(writer_1, 1, range(4))
    assert writer_1.flush()
    trial.refresh()
    calls = store.take()
    assert ("list", "collections") in calls and ("read", "collections") in calls
    assert trial.num_workers == 2 and trial.steps() == []
    # No step is complete for two workers now: the next refresh lists from the start.
    trial.refresh()
    assert trial.steps() == [0, 1] and trial.workers() == ["worker_0", "worker_1"]
    np.testing.assert_array_equal(trial.tensor("x").value(1, worker="worker_1"), _value(1, 1))


@pytest.mark.parametrize("gap", ["step_missing_from_a_table", "a_worker_without_tables"])
def test_opening_lists_again_when_the_tables_end_earlier_than_their_names_say(tmp_path, gap):
    # Opening lists the index files after the last step the tables' names reach, while the
    # tables are read; when the steps every worker published end earlier, it lists again.
    _job(tmp_path, workers=2, steps=7)
    if gap == "step_missing_from_a_table":
        table = tmp_path / "stepscope-index/worker_1/000000000000_000000000006.json"
        body = json.loads(table.read_text())
        body["steps"] = [row for row in body["steps"] if row["step"] != 4]
        table.write_text(json.dumps(body))
    else:
        (tmp_path / "stepscope-index/worker_1/000000000000_000000000006.json").unlink()
    store = RecordingStore(tmp_path)
    trial = create_trial(store)
    calls = store.take()
    assert calls.count(("list", "index")) == 2
    assert calls.count(("read", "index")) == (1 if gap == "step_missing_from_a_table" else 7)
    assert trial.steps() == list(range(7)) and not trial.problems
    for step in (3, 4, 6):
        np.testing.assert_array_equal(trial.tensor("x").value(step, worker="worker_1"), _value(1, step))


def test_opening_lists_the_index_files_once_when_the_tables_hold_what_their_names_say(tmp_path):
    _job(tmp_path, workers=2, steps=7)
    store = RecordingStore(tmp_path)
    trial = create_trial(store)
    calls = store.take()
    assert calls.count(("list", "index")) == 1 and ("read", "index") not in calls
    assert trial.steps() == list(range(7))


def test_a_refresh_pauses_the_garbage_collector_and_leaves_it_as_it_was(tmp_path, monkeypatch):
    import gc

    from stepscope.trial.steps import StepCatalog

    _job(tmp_path, workers=1, steps=2)
    seen = []
    original = StepCatalog._load_index_files

    def spy(self, keys):
        seen.append(gc.isenabled())
        return original(self, keys)

    monkeypatch.setattr(StepCatalog, "_load_index_files", spy)
    assert gc.isenabled()
    trial = create_trial(str(tmp_path))
    assert seen == [False] and gc.isenabled()
    gc.disable()
    try:
        trial.refresh()
        assert not gc.isenabled()  # the user's choice stands
    finally:
        gc.enable()
    # Nested pauses (a refresh inside another's pause, as concurrent trials do) end once.
    with job_files.parsing_in_bulk():
        trial.refresh()
        assert not gc.isenabled()
    assert gc.isenabled()
