"""The Keras hook records what each saved layer output is (the layer's activation), so the
default DeadRelu finds dead units in `Dense(activation="relu")` outputs by type."""

from __future__ import annotations

import numpy as np
import pytest

from stepscope import create_trial
from stepscope.config import SaveConfig
from stepscope.rules import DeadRelu, run_rules


@pytest.mark.heavy
def test_dense_relu_outputs_are_recognised_and_dead_units_found(tmp_path):
    import keras

    from stepscope_tf import StepscopeCallback

    keras.utils.set_random_seed(0)
    x, y = np.random.default_rng(0).standard_normal((64, 8)).astype("float32"), np.zeros((64, 1), "float32")
    for name, bias in (("dead", -50.0), ("alive", 0.0)):
        # Named: Keras' automatic names count layers made earlier in the process, so they
        # depend on which tests ran before this one (pytest-xdist changes that).
        model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="relu", bias_initializer=keras.initializers.Constant(bias), name="dense"),
                                  keras.layers.Dense(1, name="dense_1")])
        model.compile("sgd", "mse")
        with StepscopeCallback(str(tmp_path / name), save_config=SaveConfig(save_interval=2), include_collections=["weights", "outputs", "losses"]) as callback:
            # 3 epochs of 4 steps: DeadRelu judges a unit over 3 saved steps in a row.
            model.fit(x, y, batch_size=16, epochs=3, callbacks=[callback], verbose=0)
    dead, alive = create_trial(str(tmp_path / "dead")), create_trial(str(tmp_path / "alive"))
    assert dead.module_class("outputs/dense") == "relu" and dead.module_class("outputs/dense_1") == "Dense"
    report = run_rules([DeadRelu(dead, **DeadRelu.preset)])[0]
    assert report.fired and report.evidence[0].tensor == "outputs/dense" and report.evidence[0].mode == "TRAIN"
    control = run_rules([DeadRelu(alive, **DeadRelu.preset)])[0]
    assert not control.fired and control.tensors_inspected == 1
