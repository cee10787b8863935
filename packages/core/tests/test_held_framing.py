"""Held batches of scalar steps framed in C (`_encode.c`, `StepFramer.frame_held`): every
byte the same as the Python path's (event records, index files, step tables), what C
declines left to the Python path, and the black box's listener told of a batch at once."""

import json
import os
import random
import time

import crc32c
import numpy as np
import pytest

from stepscope import create_trial, layout
from stepscope.capture import step_framing
from stepscope.capture.blackbox import SavedValues
from stepscope.capture.step_framing import StepFramer, StepTables, index_json
from stepscope.capture.writer import Writer
from stepscope.modes import ModeKeys

framing = step_framing._encode
needs_c = pytest.mark.skipif(framing is None, reason="stepscope.capture._encode is not built here (or STEPSCOPE_PURE_PYTHON)")
WALL_TIME = 1_765_000_000.123456


def _never_drop(step, name, exc):
    raise AssertionError(f"step {step}: {name} dropped ({exc!r})")


def _python_frames(steps, worker="worker_0", placeholder_crc=False):
    """What the Python path makes of `steps` (Writer._frame_batch's loop, StepTables.add)."""
    framer = StepFramer(worker, _never_drop, placeholder_crc=placeholder_crc)
    parts, key, offset, bodies, tables, entries = None, None, 0, [], StepTables(worker), []
    for step, mode, mode_step, tensors, shapes in steps:
        before = len(parts) if parts is not None else 0
        parts, index = framer.frame(step, mode, mode_step, tensors, shapes, parts=parts, event_key=key, offset=offset)
        offset = (offset if before else 0) + sum(memoryview(p).nbytes for p in parts[before:])
        key = index["meta"]["event_file_name"]
        bodies.append(index_json(index))
        tables.add(step, index)
        entries.append(tables._entries[-1])  # (the step's entry as StepTables keeps it)
    return key, b"".join(parts), bodies, entries


# Values of every plain dtype a held step may hold, and names JSON must escape.
VALUES = [np.float32(0.25), np.float64(-1e300), np.float16(3.5), np.int8(-7), np.int16(300), np.int32(-(2**31)), np.int64(2**62),
          np.uint8(255), np.uint16(65535), np.uint32(2**32 - 1), np.uint64(2**64 - 1), np.bool_(True), 2.5, np.float32("nan"),
          np.float64("-inf"), np.array(0.5, np.float32), np.array(-3, np.int64), np.array(1e-300)]  # fmt: skip  (0-d: Keras's)
NAMES = ["loss", 'say "hi"', "back\\slash", "50%_done", "ünïcode/ß", "emoji 🙂", "tab\tnew\nline", "a" * 300]


def _random_steps(rng, count, first_step):
    steps = []
    step = first_step
    for _ in range(count):
        mode = rng.choice(list(ModeKeys))
        mode_step = rng.choice([0, 5, 9, 10, 99, 100, 12345, 10**12, step])
        values = {name: rng.choice(VALUES) for name in rng.sample(NAMES, rng.randint(1, 4))}
        steps.append((step, mode, mode_step, values, {}))
        step += rng.choice([1, 1, 1, 7, 1000])
    return steps


@needs_c
@pytest.mark.parametrize("first_step", [0, 1, 9, 127, 128, 999, 16383, 10**9, 2**40])
@pytest.mark.parametrize("placeholder_crc", [False, True])
def test_a_held_batch_framed_in_c_is_byte_for_byte_what_python_frames(monkeypatch, first_step, placeholder_crc):
    monkeypatch.setattr(time, "time", lambda: WALL_TIME)
    rng = random.Random(first_step * 2 + placeholder_crc)
    for count in (1, 2, 37):
        steps = _random_steps(rng, count, first_step)
        framed = StepFramer("worker_3", _never_drop, placeholder_crc=placeholder_crc).frame_held(steps)
        assert framed is not None
        key, data, bodies, entries = _python_frames(steps, "worker_3", placeholder_crc)
        assert framed.event_key == key == layout.event_file_key(first_step, "worker_3")
        assert framed.data == data
        assert framed.bodies == bodies
        assert framed.entries == entries
        for body in bodies:  # (and each body is the JSON of its index, as json.dumps writes it)
            assert json.dumps(json.loads(body)).encode() == body


@needs_c
@pytest.mark.parametrize("size", [0, 1, 7, 8, 9, 63, 64, 65, 1000, 4099])
def test_the_c_crc32c_is_the_crc32c_packages(size):
    data = os.urandom(size)
    assert framing.crc32c(data) == crc32c.crc32c(data)


@needs_c
@pytest.mark.parametrize(
    "tensors, shapes",
    [
        ({"loss": np.arange(3.0)}, {}),  # an array (the Python path frames those)
        ({"loss": np.array([1.0])}, {}),  # one element, but one dimension: another head
        ({"loss": np.array(1.0, dtype=">f8")}, {}),  # 0-d, not in the machine's byte order
        ({"loss": np.array("text")}, {}),
        ({"loss": np.float32(1.0)}, {"loss": [1]}),  # a shape saved
        ({"loss": 3}, {}),  # a Python int (no fixed dtype)
        ({"loss": np.complex64(1j)}, {}),
        ({"loss": "text"}, {}),
        ({"bad\ud800name": np.float32(1.0)}, {}),  # a lone surrogate: the index cannot hold it
        ({1: np.float32(1.0)}, {}),  # not a str name
    ],
)
def test_what_c_does_not_frame_is_left_to_the_python_path(tensors, shapes):
    framer = StepFramer("worker_0", _never_drop)
    steps = [(0, ModeKeys.TRAIN, 0, {"loss": np.float32(2.0)}, {}), (1, ModeKeys.TRAIN, 1, tensors, shapes)]
    assert framer.frame_held(steps) is None
    assert framer.frame_held([(5, ModeKeys.TRAIN, 5, {"loss": np.float32(2.0)}, {})]) is not None  # (still works after)


@needs_c
def test_a_name_saved_with_another_dtype_later_gets_its_own_head(monkeypatch):
    monkeypatch.setattr(time, "time", lambda: WALL_TIME)
    steps = [(0, ModeKeys.TRAIN, 0, {"loss": np.float32(1.0)}, {}), (1, ModeKeys.TRAIN, 1, {"loss": np.float64(2.0)}, {}),
             (2, ModeKeys.EVAL, 0, {"loss": np.float32(3.0)}, {}), (3, ModeKeys.EVAL, 1, {"loss": np.array(4.0, np.float32)}, {}),
             (4, ModeKeys.EVAL, 2, {"loss": np.array(5.0, np.float64)}, {}), (5, ModeKeys.EVAL, 3, {"loss": np.array(6, np.int8)}, {})]  # fmt: skip
    framed = StepFramer("worker_0", _never_drop).frame_held(steps)
    assert framed is not None and framed.data == _python_frames(steps)[1]


def _write(out, batches, monkeypatch, compiled, payload_crc="crc32c"):
    monkeypatch.setattr(step_framing, "_encode", framing if compiled else None)
    listener = SavedValues()
    seen, framed_in_c = [], []
    frame_held = StepFramer.frame_held
    monkeypatch.setattr(StepFramer, "frame_held", lambda self, steps: framed_in_c.append(frame_held(self, steps)) or framed_in_c[-1])
    with Writer(str(out), payload_crc=payload_crc) as writer:
        writer.step_listeners += [listener, lambda step, mode, mode_step, arrays: seen.append((step, {k: float(v) for k, v in arrays.items()}))]
        for batch in batches:
            assert writer.write_held_steps(batch)
    assert len(framed_in_c) == len(batches) and all((framed is not None) == compiled for framed in framed_in_c)
    return listener, seen


@needs_c
@pytest.mark.parametrize("payload_crc", ["smdebug", "crc32c"])
def test_a_writer_publishes_the_same_files_either_way_and_its_listeners_hear_every_step(tmp_path, monkeypatch, payload_crc):
    """Framed in C or in Python, the same event files, block tables and index entries: every
    step's index file where smdebug's reader may read the job; else (C only) a held table per
    batch and its last step's index file naming it, with the same entries."""
    monkeypatch.setattr(time, "time", lambda: WALL_TIME)
    rng = random.Random(5)
    loss = [np.float32(rng.random()) for _ in range(2300)]
    loss[1234] = np.float32("nan")
    loss[1700] = np.float32("inf")
    steps = [(s, ModeKeys.TRAIN, s, {"loss": loss[s], "lr": 0.1, "acc": np.array(s % 7 / 7, np.float32)}, {}) for s in range(2300)]  # (0-d: Keras's)
    batches = [steps[i : i + 100] for i in range(0, 2300, 100)]
    outcome = {}
    for compiled in (True, False):
        out = tmp_path / ("c" if compiled else "python")
        outcome[compiled] = _write(out, batches, monkeypatch, compiled, payload_crc)
    files = {compiled: {p.relative_to(tmp_path / name).as_posix(): p.read_bytes() for p in (tmp_path / name).rglob("*") if p.is_file()}
             for compiled, name in ((True, "c"), (False, "python"))}  # fmt: skip
    if payload_crc == "crc32c":
        held = {key: files[True].pop(key) for key in list(files[True]) if key.endswith(layout.HELD_TABLE_SUFFIX)}
        assert len(held) == 23
        for key in [k for k in files[True] if k.startswith("index/")]:
            index = json.loads(files[True].pop(key))
            table = json.loads(held[index["meta"].pop("step_table")])
            assert index == json.loads(files[False][key])  # the last step's entry, as the Python path has it
            assert table["steps"][-1]["step"] == index["meta"]["mode_step"] and len(table["steps"]) == 100
            for row in table["steps"]:  # each step's entry, as its index file in the Python path has it
                python = json.loads(files[False].pop(layout.index_file_key(row["step"], "worker_0")))
                assert python["meta"]["mode_step"] == row["mode_step"] and python["meta"]["mode"] == row["mode"]
                assert [p["start_idx"] for p in python["tensor_payload"]] == row["starts"]
                assert [p["length"] for p in python["tensor_payload"]] == row["lengths"]
                assert [p["tensorname"] for p in python["tensor_payload"]] == table["layouts"][row["layout"]]
                assert python["meta"]["event_file_name"] == row.get("event", layout.event_file_key(row["step"], "worker_0"))
    assert files[True].keys() == files[False].keys()
    for key in files[True]:
        assert files[True][key] == files[False][key], key
    if payload_crc == "smdebug":
        assert sum(key.startswith("index/") for key in files[True]) == 2300
    assert sum(key.startswith(layout.STEP_TABLE_DIR) for key in files[True]) == 3
    # The black box heard of the first NaN and of the last step, as it does step by step.
    for listener, seen in outcome.values():
        assert listener.non_finite["step"] == 1234 and listener.non_finite["tensors"] == {"loss": {"nan": 1, "inf": 0, "size": 1}}
        assert listener.last["step"] == 2299 and listener.last["tensors"]["lr"]["mean"] == 0.1
        assert [s for s, _ in seen] == list(range(2300)) and seen[8][1] == {"loss": float(loss[8]), "lr": 0.1, "acc": float(np.float32(1 / 7))}
    trial = create_trial(str(tmp_path / "c"))
    values = [float(trial.tensor("loss").value(s)) for s in trial.steps()]
    np.testing.assert_array_equal(values, np.array(loss, dtype=np.float64))


def test_the_black_box_hears_a_batch_as_it_hears_each_step():
    rng = random.Random(1)
    for bad in (None, 0, 5, 9):
        steps = [(s, ModeKeys.TRAIN, s, {"loss": np.float32(rng.random()), "acc": np.float64(0.5)}, {}) for s in range(10)]
        if bad is not None:
            steps[bad][3]["acc"] = np.float64("-inf")
            steps[-1][3]["loss"] = np.float32("nan")  # (a later one is not the first)
        at_once, one_by_one = SavedValues(), SavedValues()
        at_once.held_steps(steps)
        for step, mode, mode_step, tensors, _ in steps:
            one_by_one(step, mode, mode_step, {name: np.asarray(value) for name, value in tensors.items()})
        assert at_once.non_finite == one_by_one.non_finite
        assert at_once.last == one_by_one.last
        if bad is not None:
            assert at_once.non_finite["step"] == bad


def test_step_tables_take_made_entries_as_they_take_each_step():
    indexes = []
    for step in [*range(990, 1010), 1500, 2999, 3000, 5001]:
        indexes.append((step, {"meta": {"mode": "TRAIN", "mode_step": step, "event_file_name": layout.event_file_key(990, "w")},
                               "tensor_payload": [{"tensorname": "loss", "start_idx": 8 * step, "length": 90}], "shape_payload": []}))  # fmt: skip

    def step_by_step():
        tables = StepTables("w")
        done = [table for step, index in indexes if (table := tables.add(step, index)) is not None]
        return tables, done + [tables.take()]

    tables, expected = step_by_step()
    assert len(expected) == 5  # blocks 0, 1, 2, 3 and 5
    entries = []
    for step, index in indexes:  # (each step's entry as add keeps it)
        tables.add(step, index)
        entries.append(tables._entries[-1])
    for run in (1, 3, 10, 25):  # handed over in runs of any length: the same tables
        made = StepTables("w")
        got = [table for at in range(0, len(entries), run) for table in made.add_entries(entries[at : at + run])]
        assert got + [made.take()] == expected


@needs_c
def test_a_failure_in_c_leaves_the_batch_to_the_python_path(tmp_path, monkeypatch):
    class Failing:
        @staticmethod
        def frame_held(*args):
            raise MemoryError("no room")

    monkeypatch.setattr(step_framing, "_encode", Failing)
    steps = [(s, ModeKeys.TRAIN, s, {"loss": np.float32(s)}, {}) for s in range(5)]
    assert StepFramer("worker_0", _never_drop).frame_held(steps) is None
    with Writer(str(tmp_path)) as writer:
        assert writer.write_held_steps(steps)
    assert not writer.failed
    trial = create_trial(str(tmp_path))
    assert [float(trial.tensor("loss").value(s)) for s in trial.steps()] == [0.0, 1.0, 2.0, 3.0, 4.0]
