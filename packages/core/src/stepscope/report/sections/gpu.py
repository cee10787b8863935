"""GPU work, when detailed traces exist: top kernels, launch latency, memcpy, syncs, idle
time, as the trace engine (stepscope.traces) computes them. Without it, or without traces,
the section says what to save."""

from __future__ import annotations

import logging
from typing import Any

from ..context import ReportContext
from ..model import Section, Table

logger = logging.getLogger("stepscope")

MAX_ROWS = 15
# (analysis method of the trace engine, title); each returns a DataFrame.
_ANALYSES = (
    ("kernel_stats", "Top kernels by time"),
    ("launch_latency", "Kernel launch latency"),
    ("memcpy_stats", "Memory copies (volume and bandwidth)"),
    ("sync_stats", "Synchronisations"),
    ("idle_breakdown", "GPU idle time breakdown"),
)

WHAT_TO_SAVE = (
    "GPU kernel tables need detailed traces: profile a few steps with the hook's profiler window "
    "(torch.profiler / tf.profiler traces under profiler-output/framework/), then reopen the job."
)


def build(ctx: ReportContext) -> Section:
    section = Section("gpu", "GPU work")
    traces = _traces(ctx)
    if traces is None:
        section.missing.append(WHAT_TO_SAVE)
        return section
    for method, title in _ANALYSES:
        analysis = getattr(traces, method, None)
        if analysis is None:
            continue
        try:
            frame = analysis()
        except Exception as exc:
            logger.warning("stepscope report: trace analysis %s failed: %s", method, exc)
            section.missing.append(f"{title}: the trace engine could not compute it ({exc}).")
            continue
        if frame is None or not len(frame):
            continue
        head = frame.head(MAX_ROWS)
        section.add(Table(tuple(str(c) for c in head.columns), tuple(tuple(_cell(v) for v in row) for row in head.itertuples(index=False)), caption=title, key=f"gpu-{method}"))
    if not section.blocks:
        section.missing.append(WHAT_TO_SAVE)
    return section


def _traces(ctx: ReportContext) -> Any | None:
    """The trace engine's view of the job, or None (no engine installed, no traces)."""
    profiler = ctx.profiler
    traces = getattr(profiler, "traces", None)
    if traces is None:
        return None
    try:
        traces = traces() if callable(traces) else traces
        if hasattr(traces, "has_traces") and not traces.has_traces():
            return None
        return traces
    except Exception as exc:
        logger.warning("stepscope report: cannot open the traces: %s", exc)
        return None


def _cell(value: Any) -> Any:
    return value.item() if hasattr(value, "item") else value
