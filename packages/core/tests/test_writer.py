import json
import struct
import threading
import time

import numpy as np
import pytest

from stepscope import ModeKeys, create_trial
from stepscope.capture.collection_manager import CollectionManager
from stepscope.capture.writer import Deferred, Writer
from stepscope.exceptions import ConfigError, StoreUnavailable
from stepscope.records import SMDEBUG_PLACEHOLDER_CRC
from stepscope.store import LocalStore


class SlowStore(LocalStore):
    def __init__(self, root, delay):
        super().__init__(root)
        self.delay = delay

    def write(self, key, data):
        time.sleep(self.delay)
        super().write(key, data)


def test_queue_is_bounded_and_producer_waits(tmp_path):
    store = SlowStore(tmp_path, 0.05)
    writer = Writer(store, max_queue_bytes=3 * 4000)
    peak = 0
    for step in range(8):
        writer.write_step(step, ModeKeys.TRAIN, step, {"x": np.zeros(1000, np.float32)})
        peak = max(peak, writer._queued_bytes)
    assert peak <= 3 * 4000
    writer.close()
    assert create_trial(str(tmp_path)).steps() == list(range(8))


def test_deferred_values_resolve_on_the_writer_thread(tmp_path):
    threads = []

    def resolve():
        threads.append(threading.current_thread().name)
        return np.arange(3)

    with Writer(str(tmp_path)) as writer:
        writer.write_step(0, ModeKeys.TRAIN, 0, {"d": Deferred(resolve, 24)})
    assert threads and threads[0].startswith("stepscope-writer")
    assert create_trial(str(tmp_path)).tensor("d").value(0).tolist() == [0, 1, 2]


class GatedStore(LocalStore):
    """Records which thread published each file, in order; step 0's event file waits for
    `release`."""

    def __init__(self, root):
        super().__init__(root)
        self.waiting = threading.Event()
        self.release = threading.Event()
        self.published = []

    def write_many(self, items, published=None):
        for key, _data in items:
            if key.startswith("events/000000000000/"):
                self.waiting.set()
                assert self.release.wait(10)
            self.published.append((key, threading.current_thread().name))
        super().write_many(items, published)


def test_steps_are_published_in_order_whichever_thread_publishes_them(tmp_path):
    # An idle writer publishes a step on its own thread (no hand-over to wake the publisher);
    # steps that queue up behind a slow write are handed to the publisher, so that framing
    # the next overlaps publishing this one. Either way, in the order they were handed over.
    store = GatedStore(tmp_path)
    writer = Writer(store)
    writer.write_step(0, ModeKeys.TRAIN, 0, {"x": np.zeros(4)})
    assert store.waiting.wait(10)  # step 0's event file is being written (and waits)
    for step in range(1, 6):
        writer.write_step(step, ModeKeys.TRAIN, step, {"x": np.full(4, step)})
    store.release.set()
    assert writer.flush(10)
    writer.write_step(6, ModeKeys.TRAIN, 6, {"x": np.ones(4)})
    writer.close()
    indexes = [(key, thread) for key, thread in store.published if key.startswith("index/")]
    assert [key.rsplit("/", 1)[1].split("_")[0] for key, _ in indexes] == [f"{step:012d}" for step in range(7)]
    threads = {thread.split("-")[1] for _, thread in indexes}
    assert threads == {"writer", "publisher"}, indexes
    assert indexes[0][1].startswith("stepscope-writer")  # (step 0: nothing queued behind it)
    trial = create_trial(str(tmp_path))
    assert [trial.tensor("x").value(step)[0] for step in range(7)] == [0, 1, 2, 3, 4, 5, 1]


def test_a_failing_store_never_raises_and_records_status(tmp_path, caplog):
    job = tmp_path / "job"
    writer = Writer(str(job))
    writer.write_step(0, ModeKeys.TRAIN, 0, {"x": np.ones(2)})
    writer.flush()
    (job / "events").rename(job / "events-moved")
    (job / "events").write_text("now a file")  # every later event write fails
    accepted = [writer.write_step(s, ModeKeys.TRAIN, s, {"x": np.ones(2)}) for s in range(1, 4)]
    writer.flush()
    assert accepted[0] is True and writer.failed
    assert writer.write_step(9, ModeKeys.TRAIN, 9, {"x": np.ones(2)}) is False
    writer.close()
    status = json.loads((job / "stepscope-status/worker_0.json").read_text())
    assert status["state"] == "failed" and "events" in status["error"]
    assert caplog.text.count("failed and is now disabled") == 1
    assert not (job / "training_job_end.ts").exists()
    (job / "events").unlink()
    (job / "events-moved").rename(job / "events")
    assert create_trial(str(job)).steps(show_incomplete=True) == [0]  # what was saved stays readable


def test_object_arrays_are_dropped_with_a_clear_status(tmp_path, caplog):
    writer = Writer(str(tmp_path))
    writer.write_step(0, ModeKeys.TRAIN, 0, {"o": np.array([object()]), "x": np.arange(3)})
    writer.close()
    status = json.loads((tmp_path / "stepscope-status/worker_0.json").read_text())
    assert status["state"] == "degraded" and status["dropped_tensors"] == ["o"]
    assert "object array" in caplog.text and "'o'" in caplog.text
    assert create_trial(str(tmp_path)).tensor("x").value(0).tolist() == [0, 1, 2]


def test_one_bad_value_never_disables_saving_or_loses_steps(tmp_path, caplog):
    """A value that cannot be encoded (a list of dicts, a name with a lone surrogate) costs
    that tensor only: the steps before and after it and the step's other tensors are saved."""
    writer = Writer(str(tmp_path))
    for step in range(8):
        tensors = {"w": np.full(2, step, np.float32)}
        if step == 3:
            tensors["bad"] = [{"a": 1}, None]
            tensors["bad\udc80name"] = np.ones(1)
        writer.write_step(step, ModeKeys.TRAIN, step, tensors)
    assert writer.close() is True
    assert not writer.failed
    trial = create_trial(str(tmp_path))
    assert trial.steps() == list(range(8))
    assert [trial.tensor("w").value(s)[0] for s in range(8)] == list(range(8))
    assert trial.tensor_names() == ["w"]
    assert writer.dropped_tensors == {3: ["bad", "bad\udc80name"]}
    assert "'bad'" in caplog.text and "udc80name" in caplog.text


class StallingStore(LocalStore):
    """Event files never finish writing (an endpoint that accepts and never answers)."""

    def __init__(self, root):
        super().__init__(root)
        self.release = threading.Event()

    def write(self, key, data):
        if key.startswith("events/") and not key.startswith("events/000000000000/"):
            self.release.wait()
        super().write(key, data)


def test_close_is_bounded_and_reports_what_is_lost(tmp_path, caplog):
    store = StallingStore(tmp_path)
    writer = Writer(store, close_timeout_s=1.0)
    for step in range(4):
        writer.write_step(step, ModeKeys.TRAIN, step, {"w": np.ones(2)})
    started = time.monotonic()
    assert writer.close() is False
    assert time.monotonic() - started < 2.5  # (unbounded, it would wait forever: the store never lets go)
    status = json.loads((tmp_path / "stepscope-status/worker_0.json").read_text())
    assert status["state"] == "incomplete" and status["lost_steps"] == [1, 2, 3]
    assert "1 s" in status["error"] and "3 step(s) lost: 1, 2, 3" in caplog.text
    store.release.set()  # the stalled write (step 1) may still land whole; nothing after it
    time.sleep(0.2)
    assert create_trial(str(tmp_path)).steps(show_incomplete=True) in ([0], [0, 1])


def test_close_timeout_is_validated(tmp_path, monkeypatch):
    with pytest.raises(ConfigError, match="close_timeout_s"):
        Writer(str(tmp_path), close_timeout_s=0)
    monkeypatch.setenv("STEPSCOPE_CLOSE_TIMEOUT_S", "soon")
    with pytest.raises(ConfigError, match="STEPSCOPE_CLOSE_TIMEOUT_S.*'soon'"):
        Writer(str(tmp_path))
    monkeypatch.setenv("STEPSCOPE_CLOSE_TIMEOUT_S", "2.5")
    writer = Writer(str(tmp_path))
    assert writer.close_timeout_s == 2.5
    writer.close()


def test_stale_temporaries_of_this_worker_are_removed_at_start(tmp_path):
    folder = tmp_path / "events/000000000007"
    folder.mkdir(parents=True)
    mine = folder / ".000000000007_worker_0.tfevents.999999.3.tmp"
    theirs = folder / ".000000000007_worker_1.tfevents.999999.3.tmp"
    mine.write_bytes(b"half a step")
    theirs.write_bytes(b"another worker's")
    with Writer(str(tmp_path)) as writer:
        writer.write_step(0, ModeKeys.TRAIN, 0, {"w": np.ones(1)})
    deadline = time.monotonic() + 5
    while mine.exists() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not mine.exists() and theirs.exists()


def test_smdebug_readable_mode_writes_the_placeholder_and_still_reads(tmp_path, monkeypatch):
    monkeypatch.setenv("STEPSCOPE_PAYLOAD_CRC", "smdebug")
    with Writer(str(tmp_path)) as writer:
        writer.write_collections(CollectionManager().dumps())
        writer.write_step(0, ModeKeys.TRAIN, 0, {"w": np.arange(4.0)})
    meta = json.loads((tmp_path / "collections/000000000/worker_0_collections.json").read_text())["_meta"]
    assert meta["payload_crc"] == "smdebug"
    blob = (tmp_path / "events/000000000000/000000000000_worker_0.tfevents").read_bytes()
    assert struct.unpack("<I", blob[-4:])[0] == SMDEBUG_PLACEHOLDER_CRC
    assert create_trial(str(tmp_path)).tensor("w").value(0).tolist() == [0.0, 1.0, 2.0, 3.0]
    monkeypatch.setenv("STEPSCOPE_PAYLOAD_CRC", "md5")
    with pytest.raises(ConfigError, match="payload_crc.*'md5'"):
        Writer(str(tmp_path / "other"))


class OnceUnavailableStore(LocalStore):
    """Stops answering once, at the fourth index file (mid-way through a batch's)."""

    def __init__(self, root):
        super().__init__(root)
        self.index_keys = []
        self.refused = False

    def write(self, key, data):
        if key.startswith("index/") and len(self.index_keys) == 3 and not self.refused:
            self.refused = True
            raise StoreUnavailable(f"{key}: connection reset")
        super().write(key, data)
        if key.startswith("index/"):
            self.index_keys.append(key)


def test_an_outage_mid_way_through_a_batch_s_index_files_resumes_where_it_stopped(tmp_path, monkeypatch):
    from stepscope.capture import writer as writer_module

    monkeypatch.setattr(writer_module, "RETRY_FIRST_S", 0.01)
    store = OnceUnavailableStore(tmp_path)
    writer = Writer(store)
    writer.write_steps([(s, ModeKeys.TRAIN, s, {"loss": np.float32(s / 10)}, {}) for s in range(10)])
    assert writer.close() is True
    assert writer.outages == 1 and writer.unpublished_steps == [] and writer.lost_steps == []
    # Each index file published once, in step order: the retry began at the one refused.
    assert store.index_keys == [f"index/000000000/{s:012d}_worker_0.json" for s in range(10)]
    trial = create_trial(str(tmp_path))
    assert [float(trial.tensor("loss").value(s)) for s in trial.steps()] == [np.float32(s / 10) for s in range(10)]
