"""StepscopeCallback in model.fit/evaluate/predict: every saved value is checked against an
independent source (weights Keras shows a callback, gradients from a separate GradientTape,
logs), in graph mode and eagerly; plus configuration errors and the never-break contract."""

from __future__ import annotations

import os
import shutil

import numpy as np
import pytest
import tensorflow as tf

import stepscope
from stepscope.capture.control import request_stop
from stepscope.config import ProfilerConfig, ReductionConfig, SaveConfig
from stepscope.exceptions import ConfigError
from stepscope.modes import ModeKeys
from stepscope.reductions import compute
from stepscope_tf import StepscopeCallback

NAMES = ["hidden/kernel", "hidden/bias", "head/kernel", "head/bias"]
BATCH = 8
STEPS_PER_EPOCH = 4  # 32 samples


def _fit(model, x, y, callbacks, epochs=2, validation=True):
    return model.fit(
        x, y, batch_size=BATCH, epochs=epochs, shuffle=False, verbose=0, callbacks=callbacks,
        validation_data=(x[:16], y[:16]) if validation else None,
    )


@pytest.fixture(scope="module", params=["graph", "eager"])
def fitted(request, tmp_path_factory, initial_weights, helpers):
    """One fit (2 epochs with validation) + evaluate + predict with everything saved at
    every step, shared by the checks below."""
    import keras

    model = helpers.build_model()
    model.set_weights(initial_weights)
    model.compile(optimizer="adam", loss="mse", metrics=["mae"], run_eagerly=request.param == "eager")
    rng = np.random.RandomState(0)
    x = rng.randn(32, 4).astype("float32")
    y = (x @ rng.randn(4, 1)).astype("float32")
    out_dir = str(tmp_path_factory.mktemp(f"fit_{request.param}"))
    recorder = helpers.Recorder()
    callback = StepscopeCallback(
        out_dir,
        save_config=SaveConfig(save_interval=1),
        include_collections=["weights", "biases", "gradients", "optimizer_variables"],
        include_regex=["outputs/hidden$", "inputs/head$"],
        profiler_config=ProfilerConfig(system_monitor=False),
    )
    _fit(model, x, y, [recorder, callback])
    model.evaluate(x[:16], y[:16], batch_size=BATCH, verbose=0, callbacks=[recorder, callback])
    predictions = model.predict(x, batch_size=BATCH, verbose=0, callbacks=[recorder, callback])
    callback.close()
    assert keras.backend.backend() == "tensorflow"
    return {"trial": stepscope.create_trial(out_dir), "recorder": recorder, "model": model, "x": x, "y": y, "predictions": predictions, "out_dir": out_dir}


def test_steps_and_modes_follow_fit_evaluate_predict(fitted):
    trial = fitted["trial"]
    assert trial.steps(mode=ModeKeys.TRAIN) == list(range(8))
    assert trial.steps(mode=ModeKeys.EVAL) == list(range(4 + 2))  # 2 validation steps per epoch + evaluate
    assert trial.steps(mode=ModeKeys.PREDICT) == list(range(4))
    # The global step counts every step of every mode, in the order they ran.
    order = [trial.mode_of(step)[0] for step in trial.steps()]
    T, E, P = ModeKeys.TRAIN, ModeKeys.EVAL, ModeKeys.PREDICT
    assert order == [T] * 4 + [E] * 2 + [T] * 4 + [E] * 2 + [E] * 2 + [P] * 4
    assert trial.workers() == ["worker_0"]


def test_train_mode_step_is_the_optimizer_iteration(fitted):
    iterations = fitted["trial"].tensor("optimizer/iteration").values(mode=ModeKeys.TRAIN)
    assert {step: int(value) for step, value in iterations.items()} == {k: k for k in range(8)}


def test_weights_equal_what_keras_shows_at_the_same_point(fitted):
    trial, recorder = fitted["trial"], fitted["recorder"]
    for mode, seen in ((ModeKeys.TRAIN, recorder.weights["train"]), (ModeKeys.EVAL, recorder.weights["test"]), (ModeKeys.PREDICT, recorder.weights["predict"])):
        assert len(seen) == len(trial.steps(mode=mode))
        for step, expected in enumerate(seen):
            for name, value in zip(NAMES, expected):
                np.testing.assert_array_equal(trial.tensor(name).value(step, mode=mode), value, err_msg=f"{name} {mode.name} {step}")


def test_gradients_equal_an_independent_gradient_tape(fitted, gradients_at):
    trial, recorder, x, y = fitted["trial"], fitted["recorder"], fitted["x"], fitted["y"]
    assert trial.tensor_names(collection="gradients") == sorted(f"gradients/{n}" for n in NAMES)
    for step in range(8):
        batch = slice((step % STEPS_PER_EPOCH) * BATCH, (step % STEPS_PER_EPOCH + 1) * BATCH)
        # Gradients of the weights *before* this step's update (saved at the same step).
        expected = gradients_at(fitted["model"], recorder.weights["train"][step], x[batch], y[batch])
        for name, value in zip(NAMES, expected):
            np.testing.assert_allclose(trial.tensor(f"gradients/{name}").value(step, mode=ModeKeys.TRAIN), value, rtol=1e-5, atol=1e-7, err_msg=f"{name} step {step}")
    assert not trial.tensor_names(collection="gradients", mode=ModeKeys.EVAL)


def test_losses_and_metrics_equal_logs(fitted):
    trial, recorder = fitted["trial"], fitted["recorder"]
    for mode, logs in ((ModeKeys.TRAIN, recorder.logs["train"]), (ModeKeys.EVAL, recorder.logs["test"])):
        for step, entry in enumerate(logs):
            assert float(trial.tensor("loss").value(step, mode=mode)) == pytest.approx(entry["loss"], rel=1e-6)
            assert float(trial.tensor("mae").value(step, mode=mode)) == pytest.approx(entry["mae"], rel=1e-6)
    collections = trial.collections()
    assert "loss" in collections["losses"].tensor_names and "mae" in collections["metrics"].tensor_names


def test_layer_outputs_and_inputs_chosen_by_regex(fitted):
    trial, recorder, x = fitted["trial"], fitted["recorder"], fitted["x"]
    assert [n for n in trial.tensor_names() if n.startswith(("inputs/", "outputs/"))] == ["inputs/head", "outputs/hidden"]
    # Each layer output's activation is in the collections metadata (rules find activations
    # by type): Dense(activation="tanh") is recorded as tanh.
    assert trial.module_class("outputs/hidden") == "tanh"
    for step in (0, 5):
        kernel, bias = recorder.weights["train"][step][:2]
        batch = x[(step % STEPS_PER_EPOCH) * BATCH :][:BATCH]
        expected = np.tanh(batch @ kernel + bias)
        np.testing.assert_allclose(trial.tensor("outputs/hidden").value(step, mode=ModeKeys.TRAIN), expected, rtol=1e-5, atol=1e-6)
        # The head's input is the hidden layer's output.
        np.testing.assert_array_equal(trial.tensor("inputs/head").value(step, mode=ModeKeys.TRAIN), trial.tensor("outputs/hidden").value(step, mode=ModeKeys.TRAIN))
    kernel, bias = recorder.weights["predict"][3][:2]
    np.testing.assert_allclose(trial.tensor("outputs/hidden").value(3, mode=ModeKeys.PREDICT), np.tanh(x[24:] @ kernel + bias), rtol=1e-5, atol=1e-6)


def test_step_timeline_accounts_for_every_step(fitted):
    from stepscope.profiler import STEP_PHASES, create_profiler_trial

    timeline = create_profiler_trial(fitted["out_dir"]).step_timeline()
    assert set(timeline["framework"]) == {"tensorflow"}
    steps = timeline[timeline["phase"].isin(STEP_PHASES)]
    assert steps.groupby("mode").size().to_dict() == {"TRAIN": 8, "EVAL": 6, "PREDICT": 4}
    assert set(steps["phase"]) == {"step", "eval_step", "predict_step"}
    assert (timeline["end_ns"] >= timeline["start_ns"]).all()
    # Each step is its "data" (the loop between batches) then "compute" (the compiled
    # step); together they account for all of the step's time.
    phases = timeline[~timeline["phase"].isin(STEP_PHASES)]
    assert set(phases["phase"]) <= {"data", "compute"} and "compute" in set(phases["phase"])
    for (mode, step), whole in steps.groupby(["mode", "step"]):
        parts = phases[(phases["mode"] == mode) & (phases["step"] == step)]
        whole_ns = int(whole["end_ns"].iloc[0] - whole["start_ns"].iloc[0])
        assert int((parts["end_ns"] - parts["start_ns"]).sum()) >= 0.95 * whole_ns, (mode, step)


def test_captures_are_removed_at_close(fitted):
    model = fitted["model"]
    assert "apply" not in vars(model.optimizer)
    assert all("call" not in vars(layer) for layer in model.layers)
    assert model.train_function is None and model.predict_function is None


def test_device_reductions_match_the_core_definitions(make_model, data, tmp_path, no_profiler):
    x, y = data
    wanted = ReductionConfig(
        reductions=["min", "max", "mean", "std", "variance", "sum", "prod"], abs_reductions=["mean", "max"], norms=["l1", "l2"], abs_norms=["l2"], save_raw_tensor=True
    )
    callback = StepscopeCallback(str(tmp_path), save_config=SaveConfig(save_steps=[1], start_step=1, end_step=1), reduction_config=wanted, include_collections=["weights", "gradients"], profiler_config=no_profiler)
    _fit(make_model(), x, y, [callback], epochs=1, validation=False)
    callback.close()
    trial = stepscope.create_trial(str(tmp_path))
    assert trial.steps() == [1]
    for name in ("hidden/kernel", "gradients/head/kernel"):
        raw = trial.tensor(name).value(1)
        for reduction, is_abs in wanted.requested():
            saved = trial.tensor(f"smdebug/reductions/{'abs_' if is_abs else ''}{reduction}/{name}").value(1)
            assert float(saved) == pytest.approx(float(compute(raw, reduction, is_abs)), rel=1e-6, abs=1e-9), (name, reduction, is_abs)
    # The loss is saved whole and not reduced, as smdebug does with its scalar collections.
    assert trial.tensor("loss").value(1).shape == ()
    assert not [n for n in trial.tensor_names() if n.startswith("smdebug/reductions/") and n.endswith("/loss")]


def test_only_due_steps_are_captured(make_model, data, tmp_path, no_profiler, recorder, gradients_at):
    """The capture is armed for step 5 only: what is read after it is step 5's gradient."""
    x, y = data
    model = make_model()
    model.fit(x, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0)  # traced before stepscope: traced again
    callback = StepscopeCallback(str(tmp_path), save_config=SaveConfig(save_steps=[1, 5], start_step=1, end_step=1), include_collections=["gradients"], profiler_config=no_profiler)
    _fit(model, x, y, [recorder, callback], validation=False)
    callback.close()
    trial = stepscope.create_trial(str(tmp_path))
    assert trial.steps(mode=ModeKeys.TRAIN) == [1, 5]
    for step in (1, 5):
        batch = slice((step % STEPS_PER_EPOCH) * BATCH, (step % STEPS_PER_EPOCH + 1) * BATCH)
        expected = gradients_at(model, recorder.weights["train"][step], x[batch], y[batch])
        np.testing.assert_allclose(trial.tensor("gradients/hidden/kernel").value(step, mode="train"), expected[0], rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"include_collections": ["wieghts"]}, "wieghts"),
        ({"include_regex": ["(unclosed"]}, "unclosed"),
        ({"save_config": {"save_interval": 10}}, "save_config"),
        ({"include_workers": "some"}, "include_workers"),
        ({"reduction_config": ReductionConfig}, "reduction_config"),
    ],
)
def test_bad_arguments_fail_at_construction(tmp_path, kwargs, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(")):
        StepscopeCallback(str(tmp_path), **kwargs)


def test_out_dir_that_is_a_file_fails_at_construction(tmp_path):
    path = tmp_path / "file"
    path.write_text("")
    with pytest.raises(ConfigError):
        StepscopeCallback(str(path))


def test_unknown_save_config_values_are_config_errors(tmp_path):
    with pytest.raises(ConfigError, match="save_interval"):
        StepscopeCallback(str(tmp_path), save_config=SaveConfig(save_interval=0))


def test_stop_request_ends_fit_at_the_batch_end(make_model, data, tmp_path, no_profiler):
    import keras

    x, y = data
    callback = StepscopeCallback(str(tmp_path), profiler_config=no_profiler)

    class Rule(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            if batch == 1:
                request_stop(callback.hook.store, "TestRule", "loss is fine")
                callback.hook.stop_poller.check_now()  # the poller's thread would see it within 2 s

    history = make_model().fit(x, y, batch_size=BATCH, epochs=3, shuffle=False, verbose=0, callbacks=[Rule(), callback])
    callback.close()
    assert len(history.history["loss"]) == 1  # stopped in the first epoch
    assert callback.hook.mode_step(ModeKeys.TRAIN) == 2


def _plain_run(make_model, x, y):
    model = make_model()
    history = _fit(model, x, y, [], epochs=2)
    return model.get_weights(), history.history


def _train_with(make_model, x, y, callback, *before):
    """A fresh model fitted for two epochs with `before` callbacks then `callback`, closed."""
    model = make_model()
    history = _fit(model, x, y, [*before, callback], epochs=2)
    callback.close()
    return model, history


def _assert_same_weights(model, expected_weights):
    for got, want in zip(model.get_weights(), expected_weights):
        np.testing.assert_array_equal(got, want)


def _assert_same_run(model, history, expected):
    """Bit-identical weights and the same Keras history as `_plain_run`'s (weights, history)."""
    expected_weights, expected_history = expected
    _assert_same_weights(model, expected_weights)
    assert history.history == expected_history


@pytest.mark.heavy
def test_unwritable_store_mid_run_leaves_training_unchanged(make_model, data, tmp_path, caplog):
    import keras

    x, y = data
    expected = _plain_run(make_model, x, y)
    out_dir = tmp_path / "job"
    callback = StepscopeCallback(str(out_dir), save_config=SaveConfig(save_interval=1), include_collections=["weights", "gradients"], include_regex=["outputs/"], profiler_config=ProfilerConfig(system_monitor=False))

    class BreakStore(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            if batch == 2 and out_dir.is_dir():
                callback.hook.flush()
                shutil.rmtree(out_dir)
                out_dir.write_text("not a folder any more")  # root ignores chmod: make it a file

    model, history = _train_with(make_model, x, y, callback, BreakStore())
    assert not callback.hook.enabled
    assert "failed and is now disabled" in caplog.text
    _assert_same_run(model, history, expected)


@pytest.mark.heavy
def test_stepscope_disable_leaves_training_unchanged_and_writes_nothing(make_model, data, tmp_path, monkeypatch):
    x, y = data
    expected = _plain_run(make_model, x, y)
    monkeypatch.setenv("STEPSCOPE_DISABLE", "1")
    out_dir = tmp_path / "job"
    callback = StepscopeCallback(str(out_dir), save_config=SaveConfig(save_interval=1), include_collections=["weights", "gradients"])
    model, history = _train_with(make_model, x, y, callback)
    assert not out_dir.exists() or not any(out_dir.iterdir())
    assert "apply" not in vars(model.optimizer)
    _assert_same_run(model, history, expected)


@pytest.mark.heavy
def test_training_with_stepscope_gives_the_same_weights(make_model, data, tmp_path, no_profiler):
    """The captures are observers: a run that saves everything every step trains alike."""
    x, y = data
    expected_weights, _ = _plain_run(make_model, x, y)
    callback = StepscopeCallback(str(tmp_path), save_config=SaveConfig(save_interval=1), save_all=True, profiler_config=no_profiler)
    model, _ = _train_with(make_model, x, y, callback)
    _assert_same_weights(model, expected_weights)
    assert os.path.exists(tmp_path / "training_job_end.ts")
    assert tf.executing_eagerly()


def test_from_json_reads_a_sagemaker_hook_config(tmp_path, make_model, data):
    import json

    config = tmp_path / "debughookconfig.json"
    config.write_text(json.dumps({
        "LocalPath": str(tmp_path / "job"),
        "HookParameters": {"save_interval": "3"},
        "CollectionConfigurations": [{"CollectionName": "weights"}, {"CollectionName": "gradients", "CollectionParameters": {"save_interval": "2"}}],
    }))
    callback = StepscopeCallback.from_json(str(config), profiler_config=ProfilerConfig.disabled())
    x, y = data
    make_model().fit(x, y, batch_size=4, epochs=1, callbacks=[callback], verbose=0)  # 8 steps
    callback.close()
    trial = stepscope.create_trial(str(tmp_path / "job"))
    weights = trial.tensor(trial.tensor_names(collection="weights")[0])
    gradients = trial.tensor(trial.tensor_names(collection="gradients")[0])
    assert weights.steps(mode=ModeKeys.TRAIN) == [0, 3, 6]
    assert gradients.steps(mode=ModeKeys.TRAIN) == [0, 2, 4, 6]


def test_everything_is_readable_when_fit_returns(tmp_path, make_model, data):
    """Before close: fit's end publishes tensors, the step timeline and system metrics."""
    from stepscope.profiler import create_profiler_trial

    x, y = data
    callback = StepscopeCallback(str(tmp_path), save_config=SaveConfig(save_interval=2), include_collections="weights",
                                 profiler_config=ProfilerConfig(monitor_interval_ms=100))
    make_model().fit(x, y, batch_size=4, epochs=1, callbacks=[callback], verbose=0)  # 8 steps
    assert callback.hook.monitor is not None and callback.hook.monitor.in_own_process
    trial = stepscope.create_trial(str(tmp_path))
    assert trial.steps(mode=ModeKeys.TRAIN) == [0, 2, 4, 6]
    profiler = create_profiler_trial(str(tmp_path))
    steps = profiler.step_timeline()
    assert sorted(steps[steps["phase"] == "step"]["step"]) == list(range(8))
    assert not trial.is_complete()  # the end marker waits for close()
    callback.close()
    assert len(create_profiler_trial(str(tmp_path)).system_metrics()) > 0
    assert stepscope.create_trial(str(tmp_path)).is_complete()
