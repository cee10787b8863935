"""Work in the profiled steps, when detailed traces exist: top kernels by time and by
launches, the launch latency distribution, memory copies (volume, bandwidth), syncs and the
idle breakdown, and the CPU operators (self and total time), as the trace engine
(`trial.profiler.traces`, docs/traces.md) computes them. A CPU-only window shows its
operators and says it has no GPU activity, rather than asking for a window it has."""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import Any

from ..context import ReportContext
from ..figures import histogram
from ..model import Figure, Section, Table

logger = logging.getLogger("stepscope")

MAX_ROWS = 15
MAX_NAME = 64  # kernel names run to hundreds of characters of template arguments

# (key, title, call on the TraceAnalysis facade)
_TABLES = (
    ("gpu-top-kernels-time", "Top kernels by time", lambda t: t.top_kernels(k=MAX_ROWS, by="time")),
    ("gpu-top-kernels-launches", "Top kernels by launches", lambda t: t.top_kernels(k=MAX_ROWS, by="launches")),
    ("gpu-launch-latency", "Kernel launch latency (launch call end to kernel start)", lambda t: t.launch_latency()),
    ("gpu-memory-ops", "Memory copies and sets: volume and bandwidth", lambda t: t.memory_ops()),
    ("gpu-syncs", "Synchronisations (host blocked on the GPU)", lambda t: t.syncs()),
    ("gpu-temporal", "GPU time: busy, idle, compute", lambda t: t.temporal_breakdown()),
    ("gpu-idle", "GPU idle time by cause, per stream", lambda t: t.idle_breakdown()),
)

WHAT_TO_SAVE = (
    "GPU kernel tables need detailed traces: profile a few steps (torch.profiler / tf.profiler traces "
    "under profiler-output/framework/<framework>/detailed/rank<r>/, see docs/traces.md), then run the report again."
)


def needs_traces(name: str, title: str, what_to_save: str) -> Callable[[Callable[[Section, Any], None]], Callable[[ReportContext], Section]]:
    """Turns `fill(section, traces)` into a section builder: a job without detailed traces
    gets the section with `what_to_save` instead (the gpu and memory sections share it)."""

    def wrap(fill: Callable[[Section, Any], None]) -> Callable[[ReportContext], Section]:
        @functools.wraps(fill)
        def build(ctx: ReportContext) -> Section:
            section = Section(name, title)
            traces = _traces(ctx)
            if traces is None:
                section.missing.append(what_to_save)
            else:
                fill(section, traces)
            return section

        return build

    return wrap


@needs_traces("gpu", "GPU work", WHAT_TO_SAVE)
def build(section: Section, traces: Any) -> None:
    for key, title, call in _TABLES:
        frame = _call(section, title, call, traces)
        if frame is None or not len(frame):
            continue
        head = frame.head(MAX_ROWS)
        rows = tuple(tuple(_cell(v) for v in row) for row in head.itertuples(index=False))
        more = f" (first {MAX_ROWS} of {len(frame)})" if len(frame) > MAX_ROWS else ""
        section.add(Table(tuple(str(c) for c in head.columns), rows, caption=title + more, key=key))
        if key == "gpu-launch-latency":
            _latency_histogram(section, traces)
    gpu_tables = len(section.blocks)
    _cpu_operators(section, traces)
    if not gpu_tables:
        steps = _traced_steps(traces)
        section.missing.append(f"The profiled window ({steps}) holds no GPU activity: a CPU-only run, so there are no kernel, "
                               "copy or GPU-idle tables; its CPU operators are below." if len(section.blocks) else
                               f"The profiled window ({steps}) holds no GPU activity and no CPU operators.")


CPU_OPS_KEY = "cpu-operators"


def _cpu_operators(section: Section, traces: Any) -> None:
    """The profiled steps' CPU operators by self time (the time an operator spends outside
    the operators it calls), the view torch's profiler tables lead with."""
    frame = _call(section, "CPU operators", lambda t: t.cpu_ops(k=None), traces)
    if frame is None or not len(frame):
        return
    frame = frame.sort_values("self_us", ascending=False, ignore_index=True)
    columns = [c for c in ("rank", "name", "count", "self_us", "total_us", "mean_us", "p95_us") if c in frame.columns]
    head = frame[columns].head(MAX_ROWS)
    rows = tuple(tuple(_cell(v) for v in row) for row in head.itertuples(index=False))
    more = f" (first {MAX_ROWS} of {len(frame)})" if len(frame) > MAX_ROWS else ""
    section.add(Table(tuple(columns), rows, caption="CPU operators by self time, in the profiled steps" + more, key=CPU_OPS_KEY))


def _traced_steps(traces: Any) -> str:
    try:
        steps = traces.step_breakdown()
    except Exception:
        return "steps unknown"
    if not len(steps):
        return "no ProfilerStep marks"
    numbers = sorted({int(s) for s in steps["step"]})
    return f"{len(numbers)} step(s), {numbers[0]}-{numbers[-1]}" if len(numbers) > 1 else f"step {numbers[0]}"


def _traces(ctx: ReportContext) -> Any | None:
    """The trace engine's view of the job, or None when the job has no detailed traces."""
    try:
        traces = ctx.profiler.traces
        listed = traces.traces()
    except Exception as exc:  # no engine (older core), unreadable traces: say so, keep going
        logger.warning("stepscope report: cannot open the detailed traces: %s", exc)
        return None
    return traces if len(listed) else None


def _call(section: Section, title: str, call: Any, *args: Any) -> Any:
    """call(*args), or None with the failure named in the section (the report goes on)."""
    try:
        return call(*args)
    except Exception as exc:
        logger.warning("stepscope report: trace analysis %r failed: %s", title, exc)
        section.missing.append(f"{title}: the trace engine could not compute it ({type(exc).__name__}: {exc}).")
        return None


def _latency_histogram(section: Section, traces: Any) -> None:
    try:
        launches = traces.launches()
    except Exception:
        return
    if len(launches) and "delay_ns" in launches:
        delays = (launches["delay_ns"][launches["delay_ns"] >= 0] / 1e3).tolist()
        if delays:
            section.add(Figure(histogram(delays, xlabel="launch delay (µs)"), caption="Launch latency distribution (every launched GPU activity)", key="gpu-launch-histogram"))


def _cell(value: Any) -> Any:
    value = value.item() if hasattr(value, "item") else value
    if isinstance(value, str) and len(value) > MAX_NAME:
        return value[: MAX_NAME - 3] + "..."
    return value
