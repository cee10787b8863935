"""Detailed profiling windows with a real torch.profiler on this machine's CPU: the trace is
published where the engine finds it, with the rank metadata HTA expects, and the engine's
tables count what the model did; cProfile and data-loader timing run in their windows."""

from __future__ import annotations

import gzip
import json

import pytest
import torch

import stepscope
from stepscope.capture.detailed import python_stats
from stepscope.config import ProfilerConfig
from stepscope.store import open_store
from stepscope.traces import TraceAnalysis
from stepscope_torch.profiling import create_profiling

from .conftest import TinyMLP


def _train(profiling, steps: int = 6):
    torch.manual_seed(0)
    model = TinyMLP()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = iter(torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(64, 6)), batch_size=8))
    for step in range(steps):
        profiling.step_started(step)
        (batch,) = next(loader)
        with stepscope.annotate("model-forward"):
            loss = model(batch).sum()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        profiling.step_ended(step)
    profiling.close()


def test_windows_publish_a_kineto_trace_the_engine_reads(tmp_path):
    spans: list[tuple[str, int, int]] = []
    config = ProfilerConfig(detailed_windows=[(2, 2)], python_window=(1, 1), dataloader_window=(0, 3))
    profiling = create_profiling(config, open_store(str(tmp_path)), rank=3, world_size=4, record_span=lambda *s: spans.append(s))
    _train(profiling)
    keys = sorted(profiling.published, key=lambda k: "python" in k)
    assert [k.rsplit("_pid", 1)[0] for k in keys] == [
        "profiler-output/framework/pytorch/detailed/rank3/000000000002",
        "profiler-output/framework/python/rank3/000000000001",
    ]
    assert keys[0].endswith(".pt.trace.json.gz") and keys[1].endswith(".prof")
    trace = json.loads(gzip.decompress((tmp_path / keys[0]).read_bytes()))
    assert trace["distributedInfo"] == {"backend": "gloo", "rank": 3, "world_size": 4}
    assert '"rank": 3' in gzip.decompress((tmp_path / keys[0]).read_bytes()).decode()  # HTA's regex

    analysis = TraceAnalysis(tmp_path)
    assert analysis.ranks == [3]
    steps = analysis.step_breakdown(rank=3)
    assert list(steps.step) == [2, 3] and (steps.step_us > 0).all()
    ops = analysis.cpu_ops(k=None, rank=3).set_index("name")
    assert ops.loc["aten::linear", "count"] == 2 * 2  # two Linear layers, two profiled steps
    assert ops.loc["aten::relu", "count"] == 2
    annotations = analysis.events(rank=3, kinds=("annotation",)).name.astype(str)
    assert (annotations == "model-forward").sum() == 2
    # CPU ops inside the annotation run within it, and belong to the step around them
    events = analysis.events(rank=3, kinds=("cpu_op",))
    assert set(events.step) == {2, 3}

    # data-loader timing: one span per next() in steps 0..2, and none after the window
    assert [s[0] for s in spans] == ["dataloader"] * 3 and all(end >= start for _, start, end in spans)
    # cProfile: the window's profile holds the training code that ran in it
    functions = {row["function"] for row in python_stats((tmp_path / keys[1]).read_bytes(), top=500)}
    assert "_train" in functions or "forward" in functions


def test_no_windows_costs_nothing(tmp_path):
    assert create_profiling(ProfilerConfig(), open_store(str(tmp_path))) is None


@pytest.mark.parametrize(("warmup", "recorded"), [(0, [1, 2]), (1, [2])])
def test_time_window(tmp_path, warmup, recorded):
    """A time window's warm-up is its first step (its start cannot be anticipated)."""
    clock = iter([100.0, 100.5, 101.0, 102.5])  # read at each step start
    config = ProfilerConfig(detailed_windows=[{"start_time": 100.4, "duration_s": 1.0}], warmup_steps=warmup)
    profiling = create_profiling(config, open_store(str(tmp_path)))
    profiling.schedulers[0].clock = lambda: next(clock)
    model = TinyMLP()
    for step in range(4):
        profiling.step_started(step)
        model(torch.randn(2, 6))
        profiling.step_ended(step)
    profiling.close()
    assert len(profiling.published) == 1
    steps = TraceAnalysis(tmp_path).step_breakdown(rank=0)
    assert list(steps.step) == recorded


def _marked_steps(profiling, steps: int, marker: str = "only-in-step-{}") -> None:
    model = TinyMLP()
    for step in range(steps):
        profiling.step_started(step)
        with torch.autograd.profiler.record_function(marker.format(step)):
            model(torch.randn(2, 6))
        profiling.step_ended(step)
    profiling.close()


@pytest.mark.parametrize("warmup", [0, 1, 2])
def test_warm_up_steps_run_before_the_window_and_are_not_in_the_trace(tmp_path, warmup):
    config = ProfilerConfig(detailed_windows=[(3, 2)], warmup_steps=warmup)
    profiling = create_profiling(config, open_store(str(tmp_path)))
    started = []
    backend = profiling.schedulers[0].backend
    original = backend.start
    backend.start = lambda step, warmup_steps=0: (started.append((step, warmup_steps)), original(step, warmup_steps))[1]
    _marked_steps(profiling, 7)
    assert started == [(3 - warmup, warmup)]  # the profiler starts `warmup` steps early
    assert [k.rsplit("_pid", 1)[0] for k in profiling.published] == ["profiler-output/framework/pytorch/detailed/rank0/000000000003"]
    analysis = TraceAnalysis(tmp_path)
    assert list(analysis.step_breakdown(rank=0).step) == [3, 4]
    names = set(analysis.events(rank=0, kinds=("annotation",)).name.astype(str))
    assert {"only-in-step-3", "only-in-step-4"} <= names
    assert not {f"only-in-step-{s}" for s in range(3 - warmup, 3)} & names  # warm-up: thrown away
    assert "only-in-step-5" not in names


def test_a_window_never_synchronizes_the_device(tmp_path, monkeypatch):
    """With a (fake) CUDA device, no step of a window waits for it: kernels are given to
    their step by the runtime call that launched them."""
    syncs = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **k: syncs.append(a))
    monkeypatch.setattr(torch.profiler, "profile", _CpuOnlyProfile)  # CUPTI is not on this machine
    config = ProfilerConfig(detailed_windows=[(1, 3)])
    profiling = create_profiling(config, open_store(str(tmp_path)))
    _marked_steps(profiling, 5)
    assert syncs == []
    assert _CpuOnlyProfile.asked_for_cuda
    assert len(profiling.published) == 1


class _CpuOnlyProfile(torch.profiler.profile):
    """torch.profiler.profile asked for CUDA activities on a CPU-only build: records the
    request and profiles the CPU."""

    asked_for_cuda = False

    def __init__(self, *args, activities=None, **kwargs):
        type(self).asked_for_cuda = torch.profiler.ProfilerActivity.CUDA in (activities or [])
        super().__init__(*args, activities=[torch.profiler.ProfilerActivity.CPU], **kwargs)


def test_export_and_compression_run_off_the_training_thread_and_the_cost_is_published(tmp_path, monkeypatch):
    import threading

    from stepscope_torch import profiling as torch_profiling

    threads = []
    original = torch_profiling._export

    def export(*args):
        threads.append(threading.current_thread())
        return original(*args)

    monkeypatch.setattr(torch_profiling, "_export", export)
    config = ProfilerConfig(detailed_windows=[(1, 2), (4, 1)])
    profiling = create_profiling(config, open_store(str(tmp_path)))
    _marked_steps(profiling, 6)
    assert len(threads) == 2 and threading.main_thread() not in threads
    assert len(profiling.published) == 2
    (cost_file,) = (tmp_path / "stepscope-cost" / "profiler-windows").glob("detailed-profiler_rank0_pid*.json")
    windows = json.loads(cost_file.read_text())["windows"]
    assert [(w["first_step"], w["warmup_steps"], w["steps"]) for w in windows] == [(0, 1, 3), (3, 1, 2)]
    for window, key in zip(windows, sorted(profiling.published)):
        assert window["bytes"] == (tmp_path / key).stat().st_size
        assert window["training_thread_s"] == pytest.approx(window["start_s"] + window["steps_s"] + window["stop_s"])
        assert window["publish_s"] > 0


def test_a_failing_backend_turns_off_without_breaking_training(tmp_path, caplog):
    config = ProfilerConfig(detailed_windows=[(0, 2)])
    profiling = create_profiling(config, open_store(str(tmp_path)))

    def broken(step, warmup_steps=0):
        raise RuntimeError("profiler unavailable")

    profiling.schedulers[0].backend.start = broken
    _train(profiling, steps=3)
    assert profiling.published == []
    assert "turned off" in caplog.text


@pytest.mark.parametrize("bad", [{"detailed_windows": [(1, 0)]}, {"python_window": {"start_step": 1}}])
def test_bad_windows_are_config_errors(bad):
    with pytest.raises(stepscope.ConfigError):
        ProfilerConfig(**bad)


def test_hook_runs_windows_in_a_plain_loop(tmp_path, mlp, batches):
    """The PyTorch hook drives the windows from its own steps: profiled steps are the
    hook's global steps, annotations outside windows land on the step timeline."""
    from torch import nn

    from stepscope_torch import Hook

    out = tmp_path / "job"
    hook = Hook(str(out), profiler_config=ProfilerConfig(system_monitor=False, detailed_windows=[(1, 2)]))
    model, loss_fn = mlp(), nn.CrossEntropyLoss()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    hook.register_module(model)
    hook.register_loss(loss_fn)
    hook.register_optimizer(optimizer)
    for x, y in batches(5):
        optimizer.zero_grad()
        with stepscope.annotate("my-loss"):
            loss = loss_fn(model(x), y)
        loss.backward()
        optimizer.step()
    hook.close()
    analysis = stepscope.create_trial(str(out)).profiler.traces
    breakdown = analysis.step_breakdown(rank=0)
    assert list(breakdown.step) == [1, 2]
    # joined with the hook's step timeline: its phases of the same steps
    timeline = stepscope.create_trial(str(out)).profiler.step_timeline()
    for phase in ("forward", "backward", "optimizer"):
        expected = timeline[(timeline.phase == phase) & timeline.step.isin([1, 2])].groupby("step").duration_ms.sum() * 1000
        assert breakdown.set_index("step")[f"{phase}_us"].to_dict() == pytest.approx(expected.to_dict())
    assert analysis.cpu_ops(k=None, rank=0).set_index("name").loc["aten::linear", "count"] == 2 * 2
    inside = analysis.events(rank=0, kinds=("annotation",))
    assert (inside.name.astype(str) == "my-loss").sum() == 2  # steps 1 and 2, in the trace
    timeline = stepscope.create_trial(str(out)).profiler.step_timeline()
    spans = timeline[timeline.phase == "annotation"]
    assert sorted(spans.step) == [0, 1, 2, 3, 4] and set(spans.name) == {"my-loss"}


def test_a_flush_publishes_the_trace_of_a_window_that_ended(tmp_path, mlp, batches, monkeypatch):
    # A callback flushes at the end of each stage: a window that ended in it must be readable
    # when fit() returns, even while its export (on the publisher's thread) is slow; and a
    # window still open at a flush goes on.
    import time

    from torch import nn

    from stepscope_torch import Hook
    from stepscope_torch import profiling as torch_profiling

    export = torch_profiling._export

    def slow_export(*args):
        time.sleep(1.0)
        return export(*args)

    monkeypatch.setattr(torch_profiling, "_export", slow_export)
    out = tmp_path / "job"
    hook = Hook(str(out), profiler_config=ProfilerConfig(system_monitor=False, detailed_windows=[(1, 1), (6, 3)]))
    model, loss_fn = mlp(), nn.CrossEntropyLoss()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    hook.register_module(model)
    hook.register_optimizer(optimizer)

    def train(steps):
        for x, y in batches(steps):
            optimizer.zero_grad()
            loss_fn(model(x), y).backward()
            optimizer.step()

    def traces():
        return sorted(p.name.split("_")[0] for p in (out / "profiler-output").rglob("*.pt.trace.json.gz"))

    train(4)  # steps 0-3: the first window has ended, its export is under way
    hook.flush()
    assert traces() == ["000000000001"]
    assert stepscope.create_trial(str(out)).profiler.traces.trace_keys()  # readable as the job's
    train(4)  # steps 4-7: the second window open at 6 and 7
    hook.flush()
    assert hook._counters.detailed.schedulers[0].running and traces() == ["000000000001"]
    train(2)
    hook.close()
    assert traces() == ["000000000001", "000000000006"]
    steps = stepscope.create_trial(str(out)).profiler.traces.step_breakdown(rank=0)
    assert list(steps.step) == [1, 6, 7, 8]


def test_hook_without_windows_builds_no_profiler(make_hook):
    hook = make_hook(profiler_config=ProfilerConfig(system_monitor=False))
    assert hook.detailed is None


def test_an_annotation_name_with_quotes_and_control_characters_keeps_the_trace_valid(tmp_path):
    # Kineto writes a name between quotes as it is (torch 2.13): `"` would end the string
    # early and make the whole trace invalid JSON. The framework gets a safe spelling; the
    # step timeline (stepscope's own JSON) keeps the exact name.
    name = 'load "batch" \\ tab\there\nline'
    spans: list[tuple[str, int, int]] = []
    stepscope.capture.annotation.set_sink(lambda *span: spans.append(span))
    profiling = create_profiling(ProfilerConfig(detailed_windows=[(1, 1)]), open_store(str(tmp_path)))
    try:
        torch.manual_seed(0)
        model = TinyMLP()
        for step in range(3):
            profiling.step_started(step)
            with stepscope.annotate(name):
                model(torch.randn(4, 6)).sum().backward()
            profiling.step_ended(step)
        profiling.close()
    finally:
        stepscope.capture.annotation.set_sink(None)
    (key,) = profiling.published
    trace = json.loads(gzip.decompress((tmp_path / key).read_bytes()))  # valid JSON
    names = {e.get("name") for e in trace["traceEvents"]}
    assert stepscope.capture.annotation.framework_name(name) in names
    assert "load 'batch' / tab here line" in names
    annotations = TraceAnalysis(tmp_path).events(kinds=("annotation",)).name.astype(str)
    assert (annotations == "load 'batch' / tab here line").sum() == 1
    assert [s[0] for s in spans] == [name] * 3


def test_memory_history_is_validated_and_a_no_op_without_cuda(tmp_path):
    from stepscope.exceptions import ConfigError

    with pytest.raises(ConfigError, match="memory_history_entries"):
        ProfilerConfig(memory_history=True, memory_history_entries=0)
    config = ProfilerConfig(detailed_windows=[(1, 2)], memory_history=True)
    profiling = create_profiling(config, open_store(str(tmp_path)))
    _train(profiling, steps=4)
    assert not torch.cuda.is_available()  # this machine: the window's trace only, no snapshot
    assert [k.split("/")[3] for k in profiling.published] == ["detailed"]
    assert not list(tmp_path.glob("profiler-output/framework/pytorch/memory/**/*"))
