"""Detailed profiling for TensorFlow/Keras: inside the windows of ProfilerConfig,
tf.profiler.experimental records an XSpace, published as one `.xplane.pb` per window per
rank under `profiler-output/framework/tensorflow/detailed/rank<r>/`, which the trace engine
reads into the same tables as Kineto traces (stepscope.traces.xspace, no TensorFlow needed
to read it). Each step is marked with a `ProfilerStep` trace carrying `step_num`; a
cProfile window runs beside it. `create_profiling` returns None when no window is set.

The warm-up steps before a window (ProfilerConfig.warmup_steps) run under the profiler
marked `ProfilerWarmup`; the XSpace reader drops what they recorded (tf.profiler has no
warm-up of its own). The window never synchronizes the device; reading the XSpace files
and publishing them happen on the background publisher's thread."""

from __future__ import annotations

import glob
import os
import shutil
import tempfile
from typing import Any

import tensorflow as tf

from stepscope.capture import annotation
from stepscope.capture.detailed import Payload, StepMarker, WindowedProfilers, detailed_dir
from stepscope.config import ProfilerConfig
from stepscope.store import Store

TRACE_SUFFIX = ".xplane.pb"


def _trace(name: str) -> Any:
    return tf.profiler.experimental.Trace(name)


class XSpaceBackend:
    """tf.profiler.experimental over one window."""

    def __init__(self, config: ProfilerConfig):
        self.config = config
        self._folder: str | None = None
        self._marker = StepMarker()
        self._warmup_left = 0

    def start(self, step: int, warmup_steps: int = 0) -> None:
        self._warmup_left = warmup_steps
        self._folder = tempfile.mkdtemp(prefix="stepscope-tfprof-")
        options = tf.profiler.experimental.ProfilerOptions(host_tracer_level=2, python_tracer_level=1 if self.config.with_stack else 0, device_tracer_level=1)
        tf.profiler.experimental.start(self._folder, options=options)
        annotation.set_backend(_trace, True)

    def step_start(self, step: int) -> None:
        # TraceMe encodes keyword arguments as stats: the reader turns this into ProfilerStep#<step>.
        name = "ProfilerWarmup" if self._warmup_left > 0 else "ProfilerStep"
        self._warmup_left -= 1
        self._marker.enter(tf.profiler.experimental.Trace(name, step_num=int(step), _r=1))

    def step_end(self, step: int) -> None:
        self._marker.exit()

    def stop(self) -> list[tuple[str, str, Payload]]:
        annotation.set_backend(_trace, False)
        self.step_end(-1)
        folder, self._folder = self._folder, None
        if folder is None:
            return []
        try:
            tf.profiler.experimental.stop()  # on this thread: TF writes the XSpace
        except BaseException:
            shutil.rmtree(folder, ignore_errors=True)
            raise
        return [(detailed_dir("tensorflow"), TRACE_SUFFIX, lambda: _read_xspace(folder))]


def _read_xspace(folder: str) -> bytes:
    """The window's XSpace (one host: one file), read on the publisher's thread."""
    try:
        files = sorted(glob.glob(os.path.join(folder, "**", "*.xplane.pb"), recursive=True))
        if not files:
            raise FileNotFoundError(f"tf.profiler wrote no .xplane.pb under {folder}")
        with open(files[0], "rb") as handle:
            return handle.read()
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def create_profiling(config: ProfilerConfig, store: Store, *, rank: int = 0) -> WindowedProfilers | None:
    """The windowed profilers of a Keras callback or TF hook, or None without windows."""
    return WindowedProfilers.build(config, store, rank=rank, trace_backend=lambda: XSpaceBackend(config))
