"""Steps that save only losses and metrics (every step under the capture defaults) take a
cheaper road: the step driver answers "what is due" from a run of every-step collections
instead of asking each schedule, and the steps go to the writer in batches (held_steps.py,
`Writer.write_steps`): one event file per batch, one index file per step. What a reader
sees is unchanged: every value at its own step, through our Trial, the step tables and the
per-step index files smdebug's reader lists."""

import json
import random

import numpy as np
import pytest

from stepscope import create_trial, layout
from stepscope.capture.held_steps import HeldSteps
from stepscope.capture.hook import HookBase
from stepscope.capture.writer import Writer
from stepscope.config import Collection, ProfilerConfig, SaveConfig, SaveConfigMode
from stepscope.modes import ModeKeys


class BareHook(HookBase):
    framework = "test"
    builtin_regexes = {"weights": [r"^(?!gradient).*weight"], "losses": ["loss"]}


def _files(job, folder):
    return sorted(p.relative_to(job).as_posix() for p in (job / folder).rglob("*") if p.is_file())


def test_a_batch_is_one_event_file_with_an_index_file_per_step(tmp_path):
    values = {step: np.float32(1.0 / (step + 1)) for step in range(5, 12)}
    with Writer(str(tmp_path)) as writer:
        writer.write_step(4, ModeKeys.TRAIN, 4, {"loss": np.float32(9.0), "w": np.arange(3.0)})
        assert writer.write_steps([(s, ModeKeys.TRAIN, s, {"loss": v}, {}) for s, v in values.items()])
        writer.write_step(12, ModeKeys.EVAL, 0, {"loss": np.float32(0.5)})
    events = _files(tmp_path, "events")
    assert events == ["events/000000000004/000000000004_worker_0.tfevents", "events/000000000005/000000000005_worker_0.tfevents",
                      "events/000000000012/000000000012_worker_0.tfevents"]
    assert len(_files(tmp_path, "index")) == 9  # every step its own index file (what smdebug lists)
    index = json.loads((tmp_path / "index/000000000/000000000009_worker_0.json").read_text())
    assert index["meta"] == {"mode": "TRAIN", "mode_step": 9, "event_file_name": "events/000000000005/000000000005_worker_0.tfevents"}
    trial = create_trial(str(tmp_path))
    assert trial.steps() == list(range(4, 13))
    assert {s: float(trial.tensor("loss").value(s)) for s in values} == {s: float(v) for s, v in values.items()}
    assert trial.tensor("loss").value(0, mode=ModeKeys.EVAL) == np.float32(0.5)


def test_step_tables_name_a_batch_s_event_file_and_readers_use_it(tmp_path):
    # One table per 1,000 steps: step 999 and its batch end the first.
    with Writer(str(tmp_path)) as writer:
        writer.write_steps([(s, ModeKeys.TRAIN, s, {"loss": np.float32(s)}, {}) for s in range(990, 1000)])
        writer.write_steps([(s, ModeKeys.TRAIN, s, {"loss": np.float32(s)}, {}) for s in range(1000, 1003)])
    tables = _files(tmp_path, layout.STEP_TABLE_DIR)
    assert len(tables) == 2  # steps 990-999, then 1000-1002 (published at close)
    body = json.loads((tmp_path / tables[0]).read_text())
    by_step = {row["step"]: row for row in body["steps"]}
    assert "event" not in by_step[990]  # the first step of a batch is in its own file
    assert by_step[995]["event"] == "events/000000000990/000000000990_worker_0.tfevents"
    # A reader that knows the steps from the tables only (the index files gone) reads each value.
    for key in _files(tmp_path, "index"):
        (tmp_path / key).unlink()
    trial = create_trial(str(tmp_path))
    assert trial.steps() == list(range(990, 1003))
    assert [float(trial.tensor("loss").value(s)) for s in trial.steps()] == [float(s) for s in range(990, 1003)]


def test_a_step_handed_over_twice_in_a_batch_is_dropped_once(tmp_path, caplog):
    with Writer(str(tmp_path)) as writer:
        writer.write_step(3, ModeKeys.TRAIN, 3, {"loss": np.float32(1.0)})
        writer.write_steps([(s, ModeKeys.TRAIN, s, {"loss": np.float32(s)}, {}) for s in (3, 4)])
    assert "handed over twice" in caplog.text
    trial = create_trial(str(tmp_path))
    assert trial.steps() == [3, 4] and float(trial.tensor("loss").value(3)) == 1.0


class _Recorder:
    def __init__(self):
        self.calls = []

    def write_step(self, step, *rest):
        self.calls.append(("step", step))

    def write_held_steps(self, steps):
        self.calls.append(("batch", [s[0] for s in steps]))


def test_held_steps_go_in_order_in_batches():
    writer = _Recorder()
    held = HeldSteps(writer, max_steps=3, max_s=1e9)
    one = {"loss": np.float32(1.0)}
    for step in range(4):
        held.hand_over(step, ModeKeys.TRAIN, step, one, {}, scalars=True)
    held.hand_over(4, ModeKeys.TRAIN, 4, {"w": np.zeros(3)}, {}, scalars=False)  # a tensor step: the held ones go first
    held.hand_over(5, ModeKeys.TRAIN, 5, {"big": np.zeros(1 << 15)}, {}, scalars=True)  # too large to hold
    held.hand_over(6, ModeKeys.TRAIN, 6, one, {}, scalars=True)
    assert len(held) == 1
    held.release()
    assert writer.calls == [("batch", [0, 1, 2]), ("batch", [3]), ("step", 4), ("step", 5), ("batch", [6])]


class _Source:
    """A compiled plugin's list of the steps it ended itself (HeldSteps.attach_source)."""

    def __init__(self):
        self.steps, self.ended_at = [], None

    def end(self, step, tensors):
        import time

        if not self.steps:
            self.ended_at = time.monotonic()
        self.steps.append((step, ModeKeys.TRAIN, step, tensors, {}))

    def take_held(self):
        steps, self.steps = self.steps, []
        return steps

    def held_age(self):
        import time

        return time.monotonic() - self.ended_at if self.steps else None


def test_held_steps_take_a_compiled_source_s_steps_first_and_note_each_once():
    writer, source, noted = _Recorder(), _Source(), []
    held = HeldSteps(writer, max_steps=1000, max_s=1e9, note=lambda mode, tensors: noted.append(sorted(tensors)))
    held.attach_source(source)
    one = {"loss": np.float32(1.0)}
    source.end(0, one)
    source.end(1, one)
    held.hand_over(2, ModeKeys.TRAIN, 2, one, {}, scalars=True)  # the Python path's step comes after them
    source.end(3, one)
    held.hand_over(4, ModeKeys.TRAIN, 4, {"w": np.zeros(3)}, {}, scalars=False)
    source.end(5, one)
    assert len(held) == 1 and source.steps == []
    held.release()
    assert writer.calls == [("batch", [0, 1, 2, 3]), ("step", 4), ("batch", [5])]
    assert noted == [["loss"]] * 4 + [["w"]] + [["loss"]]
    held.close()


def test_a_compiled_source_s_steps_reach_the_writer_when_no_step_follows():
    import time

    writer, source = _Recorder(), _Source()
    held = HeldSteps(writer, max_steps=1000, max_s=0.2)
    held.attach_source(source)
    source.end(0, {"loss": np.float32(1.0)})
    deadline = time.monotonic() + 10
    while not writer.calls and time.monotonic() < deadline:
        time.sleep(0.02)
    assert writer.calls == [("batch", [0])]
    held.close()


def test_held_steps_wait_no_longer_than_max_s():
    writer = _Recorder()
    held = HeldSteps(writer, max_steps=1000, max_s=0.0)
    held.hand_over(0, ModeKeys.TRAIN, 0, {"loss": np.float32(1.0)}, {}, scalars=True)
    assert writer.calls == [("batch", [0])]


def test_held_steps_reach_the_writer_when_no_step_follows():
    """A loop that hangs (or pauses) after a scalar step: the daemon thread hands it over,
    so a live reader sees it and a process killed while hanging does not lose it."""
    import time

    writer = _Recorder()
    held = HeldSteps(writer, max_steps=1000, max_s=0.2)
    held.hand_over(0, ModeKeys.TRAIN, 0, {"loss": np.float32(1.0)}, {}, scalars=True)
    held.hand_over(1, ModeKeys.TRAIN, 1, {"loss": np.float32(0.9)}, {}, scalars=True)
    assert writer.calls == []  # held: no step followed yet
    deadline = time.monotonic() + 10
    while not writer.calls and time.monotonic() < deadline:
        time.sleep(0.02)
    assert writer.calls == [("batch", [0, 1])]
    releaser = held._releaser
    assert releaser is not None and releaser.is_alive()
    held.close()
    releaser.join(5)
    assert not releaser.is_alive()  # close stops it


def test_a_hook_s_scalar_steps_are_readable_at_every_step_and_after_flush(tmp_path):
    hook = BareHook(str(tmp_path), profiler_config=ProfilerConfig.disabled(), include_collections=["weights"])
    for step in range(130):
        if hook.begin_step(ModeKeys.TRAIN) and hook.is_due("weights"):
            hook.save_tensor("fc.weight", [1.0, float(step)], "weights")
        hook.save_loss(2.0 * 0.97**step)
        hook.end_step()
    hook.flush()  # publishes the held steps too
    trial = create_trial(str(tmp_path))
    assert trial.tensor("loss").steps() == list(range(130))
    assert trial.tensor("fc.weight").steps() == [*range(10), *range(10, 100, 10), 100]
    assert np.allclose([trial.tensor("loss").value(s) for s in range(130)], [2.0 * 0.97**s for s in range(130)])
    assert len(_files(tmp_path, "events")) < 130 // 2  # batched: far fewer event files than steps
    hook.close()


def _brute_force_due(collections, mode, mode_step):
    return [c.name for c in collections if c.save_config.should_save(mode_step, mode)]


@pytest.mark.parametrize("seed", range(4))
def test_due_collections_match_each_schedule_asked_directly(tmp_path, seed):
    """The driver's every-step runs give what asking every collection's schedule gives,
    over schedules that start, end and interleave (and EVAL steps between TRAIN ones)."""
    rng = random.Random(seed)
    modes = {ModeKeys.TRAIN: SaveConfigMode(save_interval=1, start_step=rng.randint(0, 20), end_step=rng.choice([None, 90]))}
    collections = [
        Collection("losses", save_config=SaveConfig(mode_save_configs=modes)),
        Collection("metrics", save_config=SaveConfig(save_interval=1, save_steps=[3], start_step=rng.randint(0, 40))),
        Collection("weights", save_config=SaveConfig(save_interval=rng.randint(2, 30), save_steps=[rng.randint(0, 150)])),
    ]
    hook = BareHook(str(tmp_path), profiler_config=ProfilerConfig.disabled(), collections=collections, include_collections=["weights"])
    included = {c.name: c for c in hook.included}
    got, expected = [], []
    for _ in range(150):
        mode = ModeKeys.EVAL if rng.random() < 0.1 else ModeKeys.TRAIN
        mode_step = hook.mode_step(mode)
        hook.begin_step(mode)
        step = hook.current_step
        got.append(sorted(step.due_names))
        expected.append(sorted(_brute_force_due([included[n] for n in ("losses", "metrics", "weights")], mode, mode_step)
                               + (["default"] if included["default"].save_config.should_save(mode_step, mode) else [])))
        hook.end_step()
    hook.close()
    assert got == expected
