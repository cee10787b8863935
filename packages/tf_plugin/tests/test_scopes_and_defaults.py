"""The Keras side of scopes and capture defaults: each model, each nested model and each
optimizer is declared as a scope; `StepscopeCallback(out_dir)` without a save_config saves
the loss every step and tensors on the dense-then-sparse schedule."""

from __future__ import annotations

import keras
import numpy as np

from stepscope import create_trial
from stepscope.config import DENSE_START_STEPS, SaveConfig
from stepscope_tf import Hook, StepscopeCallback


def test_the_one_liner_saves_the_loss_every_step(tmp_path, make_model, data, no_profiler):
    x, y = data
    with StepscopeCallback(str(tmp_path), include_collections=["weights", "optimizer_variables"], profiler_config=no_profiler) as callback:
        make_model().fit(x, y, batch_size=1, epochs=2, callbacks=[callback], verbose=0)  # 64 steps
    trial = create_trial(str(tmp_path))
    assert trial.tensor("loss").steps() == list(range(64))
    assert trial.tensor("hidden/kernel").steps() == [s for s in DENSE_START_STEPS if s < 64]
    # The optimizer's slots, made at its first step, are planned from then on: at each due
    # step after the first (the hook keeps the plans of a set of due collections, and plans
    # again when variables come). Its learning rate is there from the start.
    dense = [s for s in DENSE_START_STEPS if s < 64]
    steps = {name: trial.tensor(name).steps() for name in trial.tensor_names(collection="optimizer_variables")}
    assert steps["optimizer/learning_rate"] == dense and steps["optimizer/hidden_kernel_momentum"] == dense[1:]
    assert all(found in (dense, dense[1:]) for found in steps.values()), steps
    assert [s.name for s in trial.scopes()] == ["small", "optimizer"]
    assert set(trial.scopes()[0].parameters) == {"hidden/kernel", "hidden/bias", "head/kernel", "head/bias"}
    assert trial.scope_map().group_of("gradients/head/kernel") == "small"


def test_a_loss_only_step_does_not_walk_the_model(tmp_path, make_model, data, no_profiler, monkeypatch):
    # Under the defaults every step is due (the loss): the model's variables are asked for
    # where tensors are due, not at each step, and every step's loss is saved, in training
    # and in validation.
    x, y = data
    walked = []
    refresh = Hook._refresh_variables

    def counted(hook):
        step = hook.current_step
        walked.append(None if step is None else (step.mode.name, step.mode_step))
        refresh(hook)

    monkeypatch.setattr(Hook, "_refresh_variables", counted)
    with StepscopeCallback(str(tmp_path), include_collections=["weights"], profiler_config=no_profiler) as callback:
        make_model().fit(x, y, batch_size=1, epochs=2, validation_data=(x[:4], y[:4]), callbacks=[callback], verbose=0)  # 64 + 8 steps
    dense = [s for s in DENSE_START_STEPS if s < 64]
    # (and at step 11, the first where only the loss is due, whose plans are then kept)
    assert [w for w in walked if w is not None and w[0] == "TRAIN"] == [("TRAIN", s) for s in sorted([*dense, 11])]
    trial = create_trial(str(tmp_path))
    assert trial.tensor("loss").steps(mode="TRAIN") == list(range(64))
    assert trial.tensor("loss").steps(mode="EVAL") == list(range(8))
    assert trial.tensor("hidden/kernel").steps(mode="TRAIN") == dense


def test_logs_are_saved_as_keras_hands_them_on_every_kind_of_step(tmp_path, make_model, data, no_profiler, recorder):
    # Keras hands batch hooks its logs as Python floats; they are kept as they are (framed as
    # float64, what numpy makes of a float) on loss-only steps, held and framed in batches,
    # and on the dense schedule's tensor steps, framed with the step's tensors alike.
    x, y = data
    with StepscopeCallback(str(tmp_path), include_collections=["weights", "losses", "metrics"], profiler_config=no_profiler) as callback:
        make_model().fit(x, y, batch_size=1, epochs=1, validation_data=(x[:4], y[:4]), callbacks=[recorder, callback], verbose=0)
    trial = create_trial(str(tmp_path))
    tensor_steps = trial.tensor("hidden/kernel").steps(mode="TRAIN")
    assert 0 in tensor_steps and 11 not in tensor_steps  # both kinds of step below
    for name in ("loss", "mae"):
        saved = trial.tensor(name)
        assert saved.steps(mode="TRAIN") == list(range(32)) and saved.steps(mode="EVAL") == list(range(4))
        for step, logs in enumerate(recorder.logs["train"]):
            value = saved.value(step, mode="TRAIN")
            assert value.dtype == np.float64 and value.shape == () and value == logs[name], (name, step)
        assert [float(saved.value(s, mode="EVAL")) for s in range(4)] == [logs[name] for logs in recorder.logs["test"]]
    assert "mae" in trial.tensor_names(collection="metrics") and "loss" in trial.tensor_names(collection="losses")


def test_a_save_config_of_every_step_keeps_loss_steps_routine(tmp_path, make_model, data, no_profiler, monkeypatch):
    # The default collection is then due at every step too; while no regex adds variables
    # to it the variables are not asked for at each step, and with one that does, the
    # kernel it takes is saved at every step with the values Keras holds.
    x, y = data
    walked = []
    refresh = Hook._refresh_variables
    monkeypatch.setattr(Hook, "_refresh_variables", lambda hook: (walked.append(1), refresh(hook))[1])
    every_step = SaveConfig(save_interval=1)
    with StepscopeCallback(str(tmp_path / "losses"), save_config=every_step, include_collections=["losses"], profiler_config=no_profiler) as callback:
        make_model().fit(x, y, batch_size=1, epochs=1, callbacks=[callback], verbose=0)  # 32 steps
    assert len(walked) <= 3  # (attaching, and the first step's plans)
    assert create_trial(str(tmp_path / "losses")).tensor("loss").steps() == list(range(32))
    model, kernels = make_model(), []
    recorder = keras.callbacks.LambdaCallback(on_train_batch_begin=lambda batch, logs: kernels.append(model.get_layer("hidden").kernel.numpy().copy()))
    with StepscopeCallback(str(tmp_path / "regex"), save_config=every_step, include_collections=["losses"], include_regex=[r"^hidden/kernel$"], profiler_config=no_profiler) as callback:
        model.fit(x, y, batch_size=1, epochs=1, callbacks=[recorder, callback], verbose=0)
    trial = create_trial(str(tmp_path / "regex"))
    assert trial.tensor("hidden/kernel").steps() == list(range(32))
    for step in (0, 15, 31):
        np.testing.assert_array_equal(trial.tensor("hidden/kernel").value(step), kernels[step])


class _TwoNetworks(keras.Model):
    """A GAN-shaped model: a generator and a discriminator, each with its own optimizer."""

    def __init__(self):
        super().__init__(name="gan")
        self.generator = keras.Sequential([keras.Input((2,)), keras.layers.Dense(4, name="g_dense")], name="generator")
        self.discriminator = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1, name="d_dense")], name="discriminator")
        self.g_optimizer = keras.optimizers.Adam(1e-3)
        self.d_optimizer = keras.optimizers.Adam(1e-3)

    def call(self, z):
        return self.discriminator(self.generator(z))


def test_nested_models_and_their_optimizers_are_scopes(tmp_path, no_profiler):
    model = _TwoNetworks()
    model(np.zeros((1, 2), "float32"))
    model.g_optimizer.build(model.generator.trainable_variables)
    model.d_optimizer.build(model.discriminator.trainable_variables)
    hook = Hook(str(tmp_path), model=model, profiler_config=no_profiler)
    hook.close()
    scopes = {s.name: s for s in create_trial(str(tmp_path)).scopes()}
    assert {"gan", "generator", "discriminator", "g_optimizer", "d_optimizer"} <= set(scopes)
    assert scopes["generator"].kind == "model" and scopes["d_optimizer"].kind == "optimizer"
    generator = set(scopes["generator"].parameters)
    assert generator and generator == set(scopes["g_optimizer"].parameters) and not generator & set(scopes["discriminator"].parameters)
