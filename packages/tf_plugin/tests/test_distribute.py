"""MirroredStrategy over two logical CPU devices: one process is one worker (`worker_0`);
gradients are the local replicas' sum (what the optimizer applies), layer outputs the
replicas' slices in order (the global batch), weights the (identical) mirrored values."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

import stepscope
from stepscope.config import ProfilerConfig, SaveConfig
from stepscope.modes import ModeKeys
from stepscope_tf import StepscopeCallback

NAMES = ["hidden/kernel", "hidden/bias", "head/kernel", "head/bias"]


@pytest.mark.heavy
def test_mirrored_strategy_two_cpus(helpers, initial_weights, data, tmp_path, recorder):
    x, y = data
    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    assert strategy.num_replicas_in_sync == 2
    with strategy.scope():
        model = helpers.build_model()
        model.set_weights(initial_weights)
        model.compile(optimizer="sgd", loss="mse")
    callback = StepscopeCallback(
        str(tmp_path), save_config=SaveConfig(save_interval=1), include_collections=["weights", "biases", "gradients"], include_regex=["outputs/hidden$"], profiler_config=ProfilerConfig(system_monitor=False)
    )
    model.fit(x, y, batch_size=8, epochs=1, shuffle=False, verbose=0, callbacks=[recorder, callback])
    callback.close()
    trial = stepscope.create_trial(str(tmp_path))
    assert trial.workers() == ["worker_0"]
    assert trial.steps(mode=ModeKeys.TRAIN) == [0, 1, 2, 3]
    for step in range(4):
        xb, yb = x[step * 8 : step * 8 + 8], y[step * 8 : step * 8 + 8]
        weights = recorder.weights["train"][step]
        # The gradient of the global batch's loss: what SGD applied at this step.
        expected = helpers.tape_gradients(model, weights, xb, yb)
        for name, grad, weight in zip(NAMES, expected, weights):
            np.testing.assert_allclose(trial.tensor(f"gradients/{name}").value(step, mode="train"), grad, rtol=1e-5, atol=1e-6)
            np.testing.assert_array_equal(trial.tensor(name).value(step, mode="train"), weight)
        after = recorder.weights["train"][step + 1] if step < 3 else model.get_weights()
        np.testing.assert_allclose(after[0], weights[0] - 0.01 * expected[0], rtol=1e-5, atol=1e-6)
        outputs = trial.tensor("outputs/hidden").value(step, mode="train")
        np.testing.assert_allclose(outputs, np.tanh(xb @ weights[0] + weights[1]), rtol=1e-5, atol=1e-6)
