"""Shared fixtures of the TensorFlow plugin's tests: small deterministic Keras models and
data. TensorFlow is configured here, before anything imports it: quiet logs, no oneDNN
(its rounding differs between code paths), and two logical CPUs for MirroredStrategy."""

from __future__ import annotations

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "0")

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import tensorflow as tf  # noqa: E402

_cpus = tf.config.list_physical_devices("CPU")
tf.config.set_logical_device_configuration(_cpus[0], [tf.config.LogicalDeviceConfiguration()] * 2)

import keras  # noqa: E402

from stepscope.config import ProfilerConfig  # noqa: E402

BATCH = 8
SAMPLES = 32


@pytest.fixture(scope="session")
def data() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.RandomState(0)
    x = rng.randn(SAMPLES, 4).astype("float32")
    y = (x @ rng.randn(4, 1) + 0.1 * rng.randn(SAMPLES, 1)).astype("float32")
    return x, y


def build_model(seed: int = 0) -> keras.Model:
    """Deterministic: no dropout, fixed initial weights; layer names fixed so tensor names are."""
    keras.utils.set_random_seed(seed)
    inputs = keras.Input((4,), name="x")
    hidden = keras.layers.Dense(3, activation="tanh", name="hidden")(inputs)
    outputs = keras.layers.Dense(1, name="head")(hidden)
    return keras.Model(inputs, outputs, name="small")


@pytest.fixture(scope="session")
def initial_weights() -> list[np.ndarray]:
    return build_model().get_weights()


@pytest.fixture
def make_model(initial_weights):
    """A fresh compiled copy of the same model: `make_model(run_eagerly=False, optimizer=...)`."""

    def make(run_eagerly: bool = False, optimizer: str | keras.optimizers.Optimizer = "adam") -> keras.Model:
        model = build_model()
        model.set_weights(initial_weights)
        model.compile(optimizer=optimizer, loss="mse", metrics=["mae"], run_eagerly=run_eagerly)
        return model

    return make


@pytest.fixture
def no_profiler() -> ProfilerConfig:
    """Most tests check tensors; the system monitor thread is not needed there."""
    return ProfilerConfig.disabled()


class Recorder(keras.callbacks.Callback):
    """Independent record of what Keras shows callbacks: weights at batch begin (the point
    where stepscope saves them) and logs at batch end, per mode."""

    def __init__(self) -> None:
        super().__init__()
        self.weights: dict[str, list[list[np.ndarray]]] = {"train": [], "test": [], "predict": []}
        self.logs: dict[str, list[dict]] = {"train": [], "test": []}

    def on_train_batch_begin(self, batch, logs=None):
        self.weights["train"].append(self.model.get_weights())

    def on_test_batch_begin(self, batch, logs=None):
        self.weights["test"].append(self.model.get_weights())

    def on_predict_batch_begin(self, batch, logs=None):
        self.weights["predict"].append(self.model.get_weights())

    def on_train_batch_end(self, batch, logs=None):
        self.logs["train"].append(dict(logs))

    def on_test_batch_end(self, batch, logs=None):
        self.logs["test"].append(dict(logs))


@pytest.fixture
def recorder() -> Recorder:
    return Recorder()


def tape_gradients(model: keras.Model, weights: list[np.ndarray], x: np.ndarray, y: np.ndarray) -> list[np.ndarray]:
    """Gradients of the mean squared error at `weights` on one batch, by a GradientTape
    on a separate copy of the model (independent of anything stepscope does)."""
    clone = keras.models.clone_model(model)
    clone.set_weights(weights)
    with tf.GradientTape() as tape:
        loss = keras.losses.MeanSquaredError()(y, clone(x, training=True))
    return [g.numpy() for g in tape.gradient(loss, clone.trainable_weights)]


@pytest.fixture
def gradients_at():
    return tape_gradients


@pytest.fixture(autouse=True)
def _no_leftover_stop(monkeypatch):
    monkeypatch.delenv("STEPSCOPE_DISABLE", raising=False)


@pytest.fixture(scope="session")
def helpers():
    """The helpers above for module-scoped fixtures (test modules cannot import conftest
    under --import-mode=importlib)."""
    import types

    return types.SimpleNamespace(build_model=build_model, Recorder=Recorder, tape_gradients=tape_gradients)
