"""What the trace-based profiler rules check, as pure functions from a TraceAnalysis to one
row per (rank, step) with the measured value and whether it crosses the threshold. The
rules (stepscope.rules) wrap these and report through the one rule model; the report and
the UI can show the same tables."""

from __future__ import annotations

import numpy as np
import pandas as pd

from .analysis import StepRange, TraceAnalysis
from .analyzers.common import of_kind, union_ns
from .analyzers.steps import profiler_steps

CHECK_COLUMNS = ["rank", "step", "value", "threshold", "fired", "detail"]


def _frame(rows: list[dict[str, object]]) -> pd.DataFrame:
    return pd.DataFrame(rows, columns=CHECK_COLUMNS)


def high_launch_latency(analysis: TraceAnalysis, threshold_us: float = 50.0, steps: StepRange = None) -> pd.DataFrame:
    """p95 launch delay (HTA's definition) of each step's kernels above `threshold_us`."""
    rows = []
    for rank in analysis.ranks:
        launches = analysis.launches(rank=rank, steps=steps)
        launches = launches[(launches["kind"] == 0) & (launches["step"] >= 0)]
        for step, group in launches.groupby("step", sort=True):
            p95 = float(np.percentile(group["delay_ns"].to_numpy(), 95)) / 1000.0
            worst = group.loc[group["delay_ns"].idxmax()]
            rows.append({"rank": rank, "step": int(step), "value": p95, "threshold": threshold_us, "fired": p95 > threshold_us,
                         "detail": f"p95 launch delay {p95:.1f} us over {len(group)} launches; worst {worst['delay_ns'] / 1000:.1f} us ({worst['name']})"})
    return _frame(rows)


def small_kernels_dominating(analysis: TraceAnalysis, max_kernel_us: float = 10.0, min_share: float = 0.5, steps: StepRange = None) -> pd.DataFrame:
    """Share of a step's kernel launches shorter than `max_kernel_us` above `min_share`: the
    step is bound by launch overhead (fuse kernels, use CUDA graphs, larger batches)."""
    rows = []
    for rank in analysis.ranks:
        kernels = of_kind(analysis.events(rank=rank, steps=steps), "kernel")
        kernels = kernels[kernels["step"].to_numpy() >= 0]
        for step, group in kernels.groupby("step", sort=True):
            small = group["dur_ns"].to_numpy() < max_kernel_us * 1000
            share = float(small.mean())
            rows.append({"rank": rank, "step": int(step), "value": share, "threshold": min_share, "fired": share > min_share,
                         "detail": f"{int(small.sum())} of {len(group)} kernels shorter than {max_kernel_us:g} us ({share:.0%})"})
    return _frame(rows)


def many_syncs_per_step(analysis: TraceAnalysis, max_syncs: int = 10, steps: StepRange = None) -> pd.DataFrame:
    """Host synchronize calls per step above `max_syncs` (each stalls the CPU until the GPU
    catches up: .item(), .cpu(), printing tensors)."""
    rows = []
    for rank in analysis.ranks:
        syncs = analysis.sync_events(rank=rank, steps=steps)
        profiled = analysis.step_breakdown(rank=rank, steps=steps)["step"].tolist()
        counts = syncs[syncs["step"] >= 0].groupby("step").size() if not syncs.empty else pd.Series(dtype=int)
        for step in profiled:
            count = int(counts.get(step, 0))
            rows.append({"rank": rank, "step": int(step), "value": float(count), "threshold": float(max_syncs), "fired": count > max_syncs,
                         "detail": f"{count} synchronize calls"})
    return _frame(rows)


def memcpy_bound_steps(analysis: TraceAnalysis, max_share: float = 0.3, steps: StepRange = None) -> pd.DataFrame:
    """Share of a step's duration during which a memcpy/memset ran (union over streams)
    above `max_share`: copies rather than compute hold the step (pin memory, overlap
    copies, keep data on the GPU)."""
    rows = []
    for rank in analysis.ranks:
        events = analysis.events(rank=rank, steps=steps)
        copies = of_kind(events, "memcpy", "memset")
        by_step = {int(step): group for step, group in copies.groupby("step", sort=False)}
        for step, _ts, dur in profiler_steps(events).itertuples(index=False):
            group = by_step.get(int(step))
            if group is None or not dur:
                continue
            start = group["ts_ns"].to_numpy()
            busy = union_ns(start, start + group["dur_ns"].to_numpy())
            share = min(1.0, busy / dur)
            rows.append({"rank": rank, "step": int(step), "value": share, "threshold": max_share, "fired": share > max_share,
                         "detail": f"memcpy/memset running {busy / 1000:.0f} us of a {dur / 1000:.0f} us step ({share:.0%})"})
    return _frame(rows)
