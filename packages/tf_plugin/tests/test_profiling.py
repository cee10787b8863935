"""A short Keras fit under tf.profiler in a profiling window: the XSpace is published where
the engine finds it and read, without TensorFlow, into the same tables as Kineto traces."""

from __future__ import annotations

import keras
import numpy as np
import pytest
import tensorflow as tf

import stepscope
from stepscope.config import ProfilerConfig
from stepscope.store import open_store
from stepscope.traces import TraceAnalysis
from stepscope_tf.profiling import create_profiling

pytestmark = pytest.mark.heavy


class _Windows(keras.callbacks.Callback):
    def __init__(self, profiling):
        super().__init__()
        self.profiling = profiling

    def on_train_batch_begin(self, batch, logs=None):
        self.profiling.step_started(batch)

    def on_train_batch_end(self, batch, logs=None):
        self.profiling.step_ended(batch)

    def on_train_end(self, logs=None):
        self.profiling.close()


def test_keras_fit_under_tf_profiler(tmp_path, data):
    x, y = data
    config = ProfilerConfig(detailed_windows=[(1, 2)])
    profiling = create_profiling(config, open_store(str(tmp_path)), rank=2)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(8, activation="relu"), keras.layers.Dense(1)])
    model.compile("sgd", "mse")
    model.fit(x, y, batch_size=8, epochs=1, verbose=0, callbacks=[_Windows(profiling)])
    keys = profiling.published
    assert len(keys) == 1 and keys[0].startswith("profiler-output/framework/tensorflow/detailed/rank2/000000000001_pid") and keys[0].endswith(".xplane.pb")
    with stepscope.annotate("outside-any-window"):  # no backend: only a span, no error
        tf.constant(1.0)

    analysis = TraceAnalysis(tmp_path)
    assert analysis.ranks == [2]
    steps = analysis.step_breakdown(rank=2)
    assert list(steps.step) == [1, 2] and (steps.step_us > 0).all()
    ops = analysis.cpu_ops(k=None, rank=2)
    assert len(ops) > 0 and (ops["count"] > 0).all()
    events = analysis.events(rank=2, kinds=("cpu_op",))
    assert set(np.unique(events.step)) <= {-1, 1, 2} and (events.step >= 1).any()


def test_keras_callback_runs_windows(tmp_path, data):
    from stepscope_tf import StepscopeCallback

    x, y = data
    out = tmp_path / "job"
    callback = StepscopeCallback(str(out), profiler_config=ProfilerConfig(system_monitor=False, detailed_windows=[(2, 1)]))
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(8, activation="relu"), keras.layers.Dense(1)])
    model.compile("sgd", "mse")
    model.fit(x, y, batch_size=8, epochs=1, verbose=0, callbacks=[callback])
    callback.hook.close()
    analysis = stepscope.create_trial(str(out)).profiler.traces
    assert [k.rsplit("/", 2)[-2] for k in analysis.trace_keys()] == ["rank0"]
    assert list(analysis.step_breakdown(rank=0).step) == [2]


def test_warm_up_steps_are_profiled_and_dropped(tmp_path):
    """ProfilerConfig.warmup_steps: the profiler starts that many steps early, marks them
    ProfilerWarmup, and the reader drops what they recorded; the files are published by the
    background publisher (complete at close)."""
    config = ProfilerConfig(detailed_windows=[(2, 2)], warmup_steps=1)
    profiling = create_profiling(config, open_store(str(tmp_path)))
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(8, activation="relu"), keras.layers.Dense(1)])
    x = tf.random.normal((8, 4))
    for step in range(5):
        profiling.step_started(step)
        with stepscope.annotate(f"only-in-step-{step}"):
            model(x)
        profiling.step_ended(step)
    profiling.close()
    assert [k.rsplit("_pid", 1)[0] for k in profiling.published] == ["profiler-output/framework/tensorflow/detailed/rank0/000000000002"]
    analysis = TraceAnalysis(tmp_path)
    assert list(analysis.step_breakdown(rank=0).step) == [2, 3]
    names = set(analysis.events(rank=0, kinds=("annotation",)).name.astype(str))
    assert {"only-in-step-2", "only-in-step-3"} <= names
    assert not {"only-in-step-1", "ProfilerWarmup"} & names
    assert "only-in-step-4" not in names
