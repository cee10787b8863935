"""The routine batches (stepscope.capture.routine_batches) in Keras: under the capture
defaults most steps save only the logs, and the callback runs them (and the steps where
nothing is due) itself instead of through the step driver, in C (`_batches.Batches`) or in
Python (`PythonBatches`): every test runs with each. Training is run with them and without
them (`arm` made a no-op) and what was saved is compared, and checked against what Keras
showed the callbacks (an independent record)."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

import stepscope
from stepscope.capture import routine_batches
from stepscope.config import ProfilerConfig, SaveConfig
from stepscope.modes import ModeKeys
from stepscope.profiler import STEP_PHASES, create_profiler_trial
from stepscope_tf import StepscopeCallback

BATCH = 8
COMPILED = routine_batches.load_extension("stepscope.capture", "_batches") is not None
SAMPLES = 256  # 32 steps an epoch: past the capture defaults' dense start, most steps are routine
VALIDATION = 64




@pytest.fixture(params=["compiled", "python"], autouse=True)
def implementation(request, monkeypatch):
    """Which routine batches the callbacks made in a test get."""
    if request.param == "compiled" and not COMPILED:
        pytest.skip("stepscope.capture._batches is not built here (or STEPSCOPE_PURE_PYTHON)")
    if request.param == "python":
        monkeypatch.setenv("STEPSCOPE_PURE_PYTHON", "1")
    return request.param


def _data():
    rng = np.random.RandomState(1)
    x = rng.randn(SAMPLES, 4).astype("float32")
    y = (x @ rng.randn(4, 1)).astype("float32")
    return x, y


def _train(make_model, recorder, out_dir, *, routine=True, extra=(), epochs=2, options=None):
    """fit (with validation) + evaluate with the one-line callback (or `options`), the
    routine path on or off; returns the callback (closed) and the model."""
    with pytest.MonkeyPatch.context() as patch:
        if not routine:
            patch.setattr(routine_batches, "arm", lambda batches, hook, mode: None)
        x, y = _data()
        model = make_model()
        callback = StepscopeCallback(str(out_dir), profiler_config=ProfilerConfig(system_monitor=False), **(options or {}))
        callbacks = [recorder, *extra, callback]
        model.fit(x, y, batch_size=BATCH, epochs=epochs, shuffle=False, verbose=0, callbacks=callbacks, validation_data=(x[:VALIDATION], y[:VALIDATION]))
        model.evaluate(x[:VALIDATION], y[:VALIDATION], batch_size=BATCH, verbose=0, callbacks=callbacks)
        callback.close()
    return callback, model


def _saved(out_dir):
    """{(mode, mode step): {name: value}} of every saved scalar-sized value."""
    trial = stepscope.create_trial(str(out_dir))
    out = {}
    for name in trial.tensor_names():
        tensor = trial.tensor(name)
        for step in tensor.steps():
            mode, mode_step = trial.mode_of(step)
            out.setdefault((mode, mode_step), {})[name] = np.asarray(tensor.value(step))
    return trial, out


EVERY_7 = {"save_config": SaveConfig(save_interval=7), "include_collections": ["weights", "biases", "gradients"]}


@pytest.mark.parametrize("options", [None, EVERY_7], ids=["capture-defaults", "every-7-steps"])
def test_routine_batches_save_what_the_step_driver_saves(make_model, recorder, tmp_path, helpers, options, implementation):
    # Under the capture defaults most steps save the logs alone; saving every 7 steps, most
    # steps save nothing (both run in C between the steps that save tensors).
    fast, _ = _train(make_model, recorder, tmp_path / "fast", options=options)
    assert isinstance(fast._routine, routine_batches.PythonBatches) == (implementation == "python")
    slow, _ = _train(make_model, helpers.Recorder(), tmp_path / "slow", routine=False, options=options)
    steps = 2 * (SAMPLES // BATCH) + 3 * (VALIDATION // BATCH)
    # Most steps ran here: all but the dense start's, the tensor steps and the steps after
    # them, and the cost meter's timed steps; none without it.
    assert fast._routine.steps > steps // 2
    assert slow._routine.steps == 0
    fast_trial, fast_saved = _saved(tmp_path / "fast")
    slow_trial, slow_saved = _saved(tmp_path / "slow")
    assert fast_trial.steps() == slow_trial.steps()
    assert options is not None or fast_trial.steps() == list(range(steps))
    assert [fast_trial.mode_of(s) for s in fast_trial.steps()] == [slow_trial.mode_of(s) for s in slow_trial.steps()]
    assert fast_saved.keys() == slow_saved.keys()
    for key, values in fast_saved.items():
        assert values.keys() == slow_saved[key].keys(), key
    # The losses and metrics are what Keras showed the callbacks at each batch end where
    # they were due (every step, or every 7th step of each mode).
    every = 1 if options is None else 7
    for mode, logs in ((ModeKeys.TRAIN, recorder.logs["train"]), (ModeKeys.EVAL, recorder.logs["test"])):
        assert sorted(k[1] for k in fast_saved if k[0] == mode) == list(range(0, len(logs), every))
        for mode_step, shown in enumerate(logs[::every]):
            saved = fast_saved[(mode, mode_step * every)]
            for name, value in shown.items():
                assert saved[name] == np.float64(value), (mode, mode_step, name)
    # The step timeline has each step's data and compute phases, on both paths alike.
    for out_dir in (tmp_path / "fast", tmp_path / "slow"):
        timeline = create_profiler_trial(str(out_dir)).step_timeline()
        whole = timeline[timeline["phase"].isin(STEP_PHASES)]
        assert sorted(whole["step"]) == list(range(steps))
        phases = timeline[~timeline["phase"].isin(STEP_PHASES)]
        assert set(phases.groupby("step")["phase"].apply(frozenset)) <= {frozenset({"data", "compute"}), frozenset({"compute"})}
        assert (phases["phase"] == "compute").sum() == steps
    # The cost meter counted every step; the evidence note counted every saved loss.
    train, validation = 2 * SAMPLES // BATCH, 3 * VALIDATION // BATCH
    for callback in (fast, slow):
        assert callback.hook.outputs.meter.cost.steps == steps
        saved = callback.hook._runtime.saved
        assert (saved.train_losses, saved.eval_losses) == (-(-train // every), -(-validation // every))


def test_a_value_saved_into_a_routine_step_is_saved_at_that_step(make_model, recorder, tmp_path):
    import keras

    x, y = _data()
    model = make_model()
    callback = StepscopeCallback(str(tmp_path / "job"), profiler_config=ProfilerConfig(system_monitor=False))

    class SavesAScalar(keras.callbacks.Callback):
        """Another callback that saves into the open step (before stepscope ends it)."""

        def on_train_batch_end(self, batch, logs=None):
            callback.save_scalar("seen", float(batch) + 0.5)

    model.fit(x, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0, callbacks=[recorder, SavesAScalar(), callback])
    callback.close()
    _, saved = _saved(tmp_path / "job")
    for mode_step in range(SAMPLES // BATCH):
        values = saved[(ModeKeys.TRAIN, mode_step)]
        assert float(values["seen"]) == mode_step + 0.5
        assert values["loss"] == np.float64(recorder.logs["train"][mode_step]["loss"])
    # Such a step opens routinely and the step driver ends it (it holds more than the logs).
    assert callback._routine.steps > 0


def test_a_failure_in_the_routine_path_never_breaks_training_and_keeps_what_was_saved(make_model, recorder, tmp_path, caplog):
    x, y = _data()
    model = make_model()
    callback = StepscopeCallback(str(tmp_path / "job"), profiler_config=ProfilerConfig(system_monitor=False))
    hook = callback.hook
    hook._runtime.held.max_steps = 5  # the routine path hands its steps over every 5
    failed_at = []

    def failing_release():
        if callback._routine.steps >= 20:
            failed_at.append(hook._counters.global_step - 1)
            raise RuntimeError("planted failure in the routine path")
        hook._runtime.held.release()

    hook._runtime.release_held = failing_release
    history = model.fit(x, y, batch_size=BATCH, epochs=2, shuffle=False, verbose=0, callbacks=[recorder, callback])
    callback.close()
    assert len(history.history["loss"]) == 2 and len(recorder.logs["train"]) == 2 * SAMPLES // BATCH
    assert len(failed_at) == 1 and not hook.enabled
    assert "planted failure in the routine path" in caplog.text
    status = json.loads((tmp_path / "job" / "stepscope-status" / "worker_0.json").read_text())
    assert "planted failure" in json.dumps(status)
    # Every step ended before the failure is readable (the failing one too: it was held
    # when handing the held steps over failed), with the loss Keras showed.
    trial = stepscope.create_trial(str(tmp_path / "job"))
    loss = trial.tensor("loss")
    assert loss.steps() == list(range(failed_at[0] + 1))
    for step in loss.steps():
        assert loss.value(step) == np.float64(recorder.logs["train"][step]["loss"])


def test_a_failing_clock_stops_the_timeline_and_tensors_go_on(make_model, recorder, tmp_path):
    x, y = _data()
    model = make_model()
    callback = StepscopeCallback(str(tmp_path / "job"), profiler_config=ProfilerConfig(system_monitor=False))
    counters = callback.hook._counters
    model.fit(x[:BATCH], y[:BATCH], batch_size=BATCH, epochs=1, shuffle=False, verbose=0, callbacks=[callback])  # (the hook starts its clock)
    clock = counters.now
    assert clock is not None

    def failing_clock():
        if callback._routine.steps >= 5:
            raise OSError("planted clock failure")
        return clock()

    counters.now = failing_clock
    model.fit(x, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0, callbacks=[recorder, callback])
    callback.close()
    # The profiler side turned itself off; tensors went on.
    assert callback.hook.failsafe.enabled and not callback.hook.profiler_failsafe.enabled
    assert counters.now is None and callback._routine.steps > 5
    trial = stepscope.create_trial(str(tmp_path / "job"))
    assert trial.tensor("loss").steps() == list(range(1 + SAMPLES // BATCH))


@pytest.mark.parametrize("when", ["before", "after"])
def test_load_state_dict_between_fits_continues_the_numbering_on_the_routine_path(make_model, recorder, tmp_path, when):
    # The routine path reads the counters at every step: a checkpoint's numbering restored
    # between two fits is the one it continues from.
    x, y = _data()
    model = make_model()
    callback = StepscopeCallback(str(tmp_path / "job"), profiler_config=ProfilerConfig(system_monitor=False))
    model.fit(x, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0, callbacks=[callback])
    state = callback.hook.state_dict()
    assert state["global_step"] == SAMPLES // BATCH
    if when == "after":
        state = {"global_step": 1000, "mode_steps": {"TRAIN": 1000}}
    callback.hook.load_state_dict(state)
    model.fit(x, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0, callbacks=[callback])
    callback.close()
    trial = stepscope.create_trial(str(tmp_path / "job"))
    first = list(range(SAMPLES // BATCH))
    second = [state["global_step"] + i for i in range(SAMPLES // BATCH)]
    assert trial.tensor("loss").steps() == first + second
    assert [trial.mode_of(s)[1] for s in second] == [state["mode_steps"]["TRAIN"] + i for i in range(SAMPLES // BATCH)]


def test_routine_steps_reach_the_writer_in_order_with_the_others(make_model, recorder, tmp_path):
    # Routine steps wait in RoutineBatches' list, the others go through HeldSteps.hand_over:
    # the index files of one worker are written in step order (HeldSteps takes the list first).
    x, y = _data()
    model = make_model()
    callback = StepscopeCallback(str(tmp_path / "job"), profiler_config=ProfilerConfig(system_monitor=False))
    written = []
    writer = callback.hook.writer
    original = writer.write_held_steps

    def record(steps):
        written.extend(s[0] for s in steps)
        return original(steps)

    writer.write_held_steps = record
    model.fit(x, y, batch_size=BATCH, epochs=2, shuffle=False, verbose=0, callbacks=[callback])
    callback.close()
    assert written == sorted(written) and len(written) > SAMPLES // BATCH
    assert os.path.isdir(tmp_path / "job" / "index")
