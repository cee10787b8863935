"""Profiling windows without a framework: the pure schedule, the scheduler driving a
recording backend, cProfile windows, and stepscope.annotate."""

from __future__ import annotations

import pytest

import stepscope
from stepscope.capture import annotation
from stepscope.capture.detailed import WindowedProfilers, WindowScheduler, add_distributed_info, python_stats
from stepscope.config import ProfilerConfig, ProfilingWindow, active_window
from stepscope.exceptions import ConfigError
from stepscope.store import open_store


class Recorder:
    def __init__(self):
        self.calls = []

    def start(self, step, warmup_steps=0):
        self.calls.append(("start", step))

    def step_start(self, step):
        self.calls.append(("step_start", step))

    def step_end(self, step):
        self.calls.append(("step_end", step))

    def stop(self):
        self.calls.append(("stop",))
        return [("profiler-output/framework/test/detailed", ".bin", b"trace")]


def test_windows_parse_and_validate():
    assert ProfilingWindow.parse((3, 2)) == ProfilingWindow(start_step=3, num_steps=2)
    assert ProfilingWindow.parse({"StartStep": "5", "NumSteps": "1"}) == ProfilingWindow(start_step=5, num_steps=1)
    assert ProfilingWindow.parse({"start_unix_time": 10, "duration": 2}).covers(0, 11.0)
    for bad in ({"start_step": 1, "start_time": 2.0}, {"start_step": -1, "num_steps": 1}, {"start_time": 1.0, "duration_s": 0}):
        with pytest.raises(ConfigError):
            ProfilingWindow.parse(bad)
    config = ProfilerConfig(detailed_windows=(4, 2))  # one pair is one window
    assert config.detailed_windows == (ProfilingWindow(start_step=4, num_steps=2),) and config.detailed
    assert not ProfilerConfig().detailed
    windows = (ProfilingWindow(start_step=10, num_steps=2), ProfilingWindow(start_time=100.0, duration_s=5.0))
    assert [active_window(windows, s, 0.0) for s in (9, 10, 11, 12)] == [None, 0, 0, None]
    assert active_window(windows, 50, 104.9) == 1 and active_window(windows, 50, 105.0) is None


def test_scheduler_runs_each_window_once_and_publishes(tmp_path):
    recorder = Recorder()
    store = open_store(str(tmp_path))
    scheduler = WindowScheduler((ProfilingWindow(start_step=2, num_steps=2), ProfilingWindow(start_step=3, num_steps=1)), recorder, store, rank=1)
    for step in range(6):
        scheduler.step_started(step)
        scheduler.step_ended(step)
    scheduler.close()
    # the second window (step 3) is covered by the first while it runs, and over when the first ends
    assert recorder.calls == [("start", 2), ("step_start", 2), ("step_end", 2), ("step_start", 3), ("step_end", 3), ("stop",)]
    assert len(scheduler.published) == 1 and scheduler.published[0].startswith("profiler-output/framework/test/detailed/rank1/000000000002_pid")
    assert (tmp_path / scheduler.published[0]).read_bytes() == b"trace"


def test_time_window_stops_at_first_step_after_it(tmp_path):
    recorder = Recorder()
    times = iter([0.0, 10.0, 11.0, 13.0, 14.0])
    scheduler = WindowScheduler((ProfilingWindow(start_time=9.0, duration_s=3.0),), recorder, open_store(str(tmp_path)), clock=lambda: next(times))
    for step in range(5):
        scheduler.step_started(step)
        scheduler.step_ended(step)
    assert [c for c in recorder.calls if c[0] in ("start", "stop")] == [("start", 1), ("stop",)]
    assert ("step_start", 3) not in recorder.calls


def test_python_window_profiles_the_code_that_ran(tmp_path):
    profilers = WindowedProfilers.build(ProfilerConfig(python_window=(1, 1)), open_store(str(tmp_path)), rank=0, trace_backend=None)

    def busy_function():
        return sum(i * i for i in range(20000))

    for step in range(3):
        profilers.step_started(step)
        busy_function()
        profilers.step_ended(step)
    profilers.close()
    assert len(profilers.published) == 1 and profilers.published[0].endswith(".prof")
    rows = python_stats((tmp_path / profilers.published[0]).read_bytes(), top=200)
    calls = {r["function"]: r["calls"] for r in rows}
    assert calls["busy_function"] == 1  # only step 1 was profiled


def test_annotate_spans_and_backends():
    spans, entered = [], []

    class Backend:
        def __init__(self, name):
            self.name = name

        def __enter__(self):
            entered.append(("enter", self.name))

        def __exit__(self, *exc):
            entered.append(("exit", self.name))

    annotation.set_sink(lambda *span: spans.append(span))
    try:
        with stepscope.annotate("outside"):
            pass
        annotation.set_backend(Backend, True)

        @stepscope.annotate("decorated")
        def work(x):
            return x + 1

        assert work(1) == 2
        annotation.set_backend(Backend, False)
        with stepscope.annotate("after"):
            pass
    finally:
        annotation.set_sink(None)
    assert [s[0] for s in spans] == ["outside", "decorated", "after"] and all(s[2] >= s[1] for s in spans)
    assert entered == [("enter", "decorated"), ("exit", "decorated")]
    with pytest.raises(ConfigError):
        stepscope.annotate("")


def test_distributed_info_is_added_once():
    trace = b'{\n  "schemaVersion": 1,\n  "traceEvents": []}'
    once = add_distributed_info(trace, "nccl", 2, 8)
    assert b'"distributedInfo": {"backend": "nccl", "rank": 2, "world_size": 8}' in once
    assert add_distributed_info(once, "gloo", 0, 1) == once


def test_sagemaker_profiling_parameters():
    parameters = {
        "ProfilingIntervalInMilliseconds": "100",
        "DetailedProfilingConfig": '{"StartStep": 5, "NumSteps": 3}',
        "PythonProfilingConfig": '{"StartStep": 9, "NumSteps": 1, "ProfilerName": "cprofile", "cProfileTimer": "total_time"}',
        "DataloaderProfilingConfig": {"StartTimeInSecSinceEpoch": 1700000000, "DurationInSeconds": 60, "MetricsRegex": ".*"},
    }
    config = ProfilerConfig.from_sagemaker(parameters, system_monitor=False)
    assert config.monitor_interval_ms == 100 and not config.system_monitor
    assert config.detailed_windows == (ProfilingWindow(start_step=5, num_steps=3),)
    assert config.python_window == ProfilingWindow(start_step=9, num_steps=1)
    assert config.dataloader_window == ProfilingWindow(start_time=1700000000.0, duration_s=60.0)
    with pytest.raises(ConfigError, match="DetailedProfilingConfig"):
        ProfilerConfig.from_sagemaker({"DetailedProfilingConfig": '{"MetricsRegex": "x"}'})
    with pytest.raises(ConfigError, match="not JSON"):
        ProfilerConfig.from_sagemaker({"PythonProfilingConfig": "{oops"})
