"""Hook in custom training loops: the GradientTape recipe (eager), a tf.function train step
whose gradients the hook captures through the optimizer, custom tensors, stop requests."""

from __future__ import annotations

import logging

import keras
import numpy as np
import pytest
import tensorflow as tf

import stepscope
from stepscope.capture.control import request_stop
from stepscope.config import SaveConfig
from stepscope.exceptions import ConfigError
from stepscope.modes import ModeKeys
from stepscope_tf import Hook, StopTrainingRequested

NAMES = ["hidden/kernel", "hidden/bias", "head/kernel", "head/bias"]


def _batches(x, y, size=8):
    return [(x[i : i + size], y[i : i + size]) for i in range(0, len(x), size)]


def test_gradient_tape_recipe(make_model, data, tmp_path, no_profiler, gradients_at):
    x, y = data
    model = make_model()
    optimizer = keras.optimizers.SGD(0.05)
    loss_fn = keras.losses.MeanSquaredError()
    seen_weights = []
    with Hook(str(tmp_path), model=model, save_config=SaveConfig(save_interval=2), include_collections=["weights", "biases", "gradients"], profiler_config=no_profiler) as hook:
        for xb, yb in _batches(x, y):
            seen_weights.append(model.get_weights())
            with hook.step(ModeKeys.TRAIN):
                with hook.phase("forward"), tf.GradientTape() as tape:
                    loss = loss_fn(yb, model(xb, training=True))
                grads = tape.gradient(loss, model.trainable_variables)
                hook.save_gradients(grads, model.trainable_variables)
                hook.save_loss(loss)
                hook.save_tensor("custom/lr", np.float32(0.05))
                optimizer.apply(grads, model.trainable_variables)
        with hook.step("eval"):
            hook.save_loss(loss_fn(y, model(x)))
    trial = stepscope.create_trial(str(tmp_path))
    assert trial.steps(mode=ModeKeys.TRAIN) == [0, 2] and trial.steps(mode=ModeKeys.EVAL) == [0]
    for step in (0, 2):
        xb, yb = _batches(x, y)[step]
        expected = gradients_at(model, seen_weights[step], xb, yb)
        for name, grad, weight in zip(NAMES, expected, seen_weights[step]):
            np.testing.assert_allclose(trial.tensor(f"gradients/{name}").value(step, mode="train"), grad, rtol=1e-5, atol=1e-7)
            np.testing.assert_array_equal(trial.tensor(name).value(step, mode="train"), weight)
    assert float(trial.tensor("custom/lr").value(0, mode="train")) == pytest.approx(0.05)
    assert "loss" in trial.collections()["losses"].tensor_names
    assert trial.steps() == [0, 2, 4]


def test_tf_function_train_step_gradients_captured_through_the_optimizer(make_model, data, tmp_path, no_profiler, gradients_at):
    x, y = data
    model = make_model()
    optimizer = keras.optimizers.Adam(0.01)
    loss_fn = keras.losses.MeanSquaredError()
    hook = Hook(str(tmp_path), model=model, optimizer=optimizer, save_config=SaveConfig(save_interval=3), include_collections=["gradients"], profiler_config=no_profiler)

    @tf.function
    def train_step(xb, yb):
        with tf.GradientTape() as tape:
            loss = loss_fn(yb, model(xb, training=True))
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        hook.save_scalar("symbolic_loss", loss)  # symbolic here: skipped with a warning, never an error
        return loss

    seen_weights = []
    for xb, yb in _batches(x, y) * 2:
        seen_weights.append(model.get_weights())
        with hook.step():
            hook.save_loss(train_step(xb, yb))
    hook.close()
    trial = stepscope.create_trial(str(tmp_path))
    assert trial.steps(mode="train") == [0, 3, 6]
    for step in (0, 3, 6):
        xb, yb = (_batches(x, y) * 2)[step]
        expected = gradients_at(model, seen_weights[step], xb, yb)
        for name, grad in zip(NAMES, expected):
            np.testing.assert_allclose(trial.tensor(f"gradients/{name}").value(step, mode="train"), grad, rtol=1e-5, atol=1e-7)
    assert "apply" not in vars(optimizer)  # removed at close


def test_symbolic_tensors_are_skipped_with_one_warning(tmp_path, no_profiler, caplog):
    hook = Hook(str(tmp_path), save_config=SaveConfig(save_interval=1), profiler_config=no_profiler)

    @tf.function
    def inside():
        hook.save_tensor("t", tf.ones(3))
        return tf.constant(1)

    with caplog.at_level(logging.WARNING, logger="stepscope"), hook.step():
        inside()
    hook.close()
    assert "symbolic tensor" in caplog.text and hook.enabled is False  # closed, not failed
    assert hook.failsafe.error is None


def test_stop_request_raises_at_step_end(tmp_path, no_profiler):
    hook = Hook(str(tmp_path), profiler_config=no_profiler)
    with hook.step():
        pass
    request_stop(hook.store, "TestRule", "enough")
    hook.stop_poller.check_now()
    with pytest.raises(StopTrainingRequested), hook.step():
        pass
    hook.close()


def test_bad_hook_arguments(tmp_path):
    with pytest.raises(ConfigError, match="model"):
        Hook(str(tmp_path), model="not a model")
    with pytest.raises(ConfigError, match="strategy"):
        Hook(str(tmp_path), strategy="mirrored")
    with pytest.raises(ConfigError, match="unknown collection"):
        Hook(str(tmp_path), include_collections="gradient")
