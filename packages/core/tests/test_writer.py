import json
import struct
import threading
import time

import numpy as np
import pytest

from stepscope import ModeKeys, create_trial
from stepscope.collection_manager import CollectionManager
from stepscope.exceptions import ConfigError
from stepscope.records import SMDEBUG_PLACEHOLDER_CRC
from stepscope.store import LocalStore
from stepscope.writer import Deferred, Writer


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


def test_object_arrays_are_rejected_with_a_clear_status(tmp_path):
    writer = Writer(str(tmp_path))
    writer.write_step(0, ModeKeys.TRAIN, 0, {"o": np.array([object()])})
    writer.close()
    status = json.loads((tmp_path / "stepscope-status/worker_0.json").read_text())
    assert "object array" in status["error"]


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
