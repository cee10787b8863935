"""Top CPU operators: inclusive time (an operator's time includes the operators it calls)
and self time (minus the operators it calls directly on its thread)."""

from __future__ import annotations

import numpy as np
import pandas as pd

from .common import duration_stats, of_kind


def self_times(ops: pd.DataFrame) -> np.ndarray:
    """Self time (ns) of each row: its duration minus that of its direct children, the
    operators nested in it on the same thread."""
    tid = ops["tid"].to_numpy()
    start = ops["ts_ns"].to_numpy()
    dur = ops["dur_ns"].to_numpy()
    end = start + dur
    order = np.lexsort((-end, start, tid))
    children = np.zeros(len(ops), dtype=np.int64)
    stack: list[int] = []
    last_tid = None
    # One pass in nesting order with a stack of open operators: per operator, not per event
    # of the trace, and only when this analysis is asked for.
    for index, thread, begin, finish in zip(order.tolist(), tid[order].tolist(), start[order].tolist(), end[order].tolist()):
        if thread != last_tid:
            stack.clear()
            last_tid = thread
        while stack and end[stack[-1]] <= begin:
            stack.pop()
        if stack and finish <= end[stack[-1]]:
            children[stack[-1]] += finish - begin
        stack.append(index)
    return dur - children


def cpu_op_stats(events: pd.DataFrame, k: int | None = 20) -> pd.DataFrame:
    ops = of_kind(events, "cpu_op")
    out = duration_stats(ops, ["name"])
    if len(ops):
        own = pd.Series(self_times(ops), index=ops.index).groupby(ops["name"], observed=True).sum() / 1000.0
        out["self_us"] = out["name"].map(own).astype(float)
    else:
        out["self_us"] = pd.Series(dtype=float)
    out["name"] = out["name"].astype(str)
    out = out.sort_values("total_us", ascending=False, ignore_index=True)
    return out.head(k) if k else out
