"""Helpers the analyses share: picking events of a kind, summary statistics, interval unions
and the innermost annotation around a point in time. All vectorized (numpy/pandas)."""

from __future__ import annotations

import numpy as np
import pandas as pd

from ..schema import KIND_CODE, STEP_NAME_RE

STAT_COLUMNS = ("count", "total_us", "mean_us", "p50_us", "p95_us", "max_us")


def of_kind(events: pd.DataFrame, *kinds: str) -> pd.DataFrame:
    """The rows of some kinds. Event tables are sorted by kind (tables.py does it once), so
    this is usually a slice, not a copy; any other frame is filtered."""
    codes = sorted(KIND_CODE[k] for k in kinds)
    column = events["kind"].to_numpy()
    if column.size and (column.size < 2 or bool(np.all(column[1:] >= column[:-1]))):
        bounds = np.searchsorted(column, [codes[0], codes[-1] + 1])
        if codes == list(range(codes[0], codes[-1] + 1)):
            return events.iloc[int(bounds[0]) : int(bounds[1])]
    mask = np.isin(column, codes) if len(codes) > 1 else column == codes[0]
    return events[mask]


def duration_stats(frame: pd.DataFrame, keys: list[str], value: str = "dur_ns") -> pd.DataFrame:
    """count, total, mean, p50, p95, max of `value` (ns) per group, in microseconds."""
    if frame.empty:
        return pd.DataFrame(columns=[*keys, *STAT_COLUMNS])
    grouped = frame.groupby(keys, observed=True, sort=False)[value]
    out = grouped.agg(["count", "sum", "mean", "max"])
    out.columns = ["count", "total_us", "mean_us", "max_us"]
    quantiles = grouped.quantile([0.5, 0.95]).unstack()
    out["p50_us"] = quantiles[0.5]
    out["p95_us"] = quantiles[0.95]
    for column in ("total_us", "mean_us", "max_us", "p50_us", "p95_us"):
        out[column] = out[column].astype(np.float64) / 1000.0
    out["count"] = out["count"].astype(np.int64)
    return out.reset_index()[[*keys, *STAT_COLUMNS]]


def launch_start_of(events: pd.DataFrame, gpu: pd.DataFrame) -> np.ndarray:
    """Start (ns) of the runtime call that launched each GPU row, or -1 when unknown.
    Integer lookups only: epoch nanoseconds do not survive a trip through float64."""
    runtime = events[events["kind"].isin([KIND_CODE["runtime"], KIND_CODE["sync"]]).to_numpy()]
    runtime = runtime[runtime["correlation"].to_numpy() >= 0].drop_duplicates("correlation")
    position = pd.Index(runtime["correlation"].to_numpy()).get_indexer(gpu["correlation"].to_numpy())
    starts = runtime["ts_ns"].to_numpy()
    return np.where(position >= 0, starts[np.maximum(position, 0)] if starts.size else -1, -1)


def union_ns(starts: np.ndarray, ends: np.ndarray) -> int:
    """Length of the union of [start, end) intervals."""
    if starts.size == 0:
        return 0
    order = np.argsort(starts, kind="stable")
    starts, ends = starts[order], ends[order]
    running_end = np.maximum.accumulate(ends)
    # A new merged interval starts wherever a start is past every earlier end.
    new = np.empty(starts.size, dtype=bool)
    new[0] = True
    new[1:] = starts[1:] > running_end[:-1]
    group = np.cumsum(new) - 1
    group_start = starts[new]
    group_end = np.zeros(group_start.size, dtype=np.int64)
    np.maximum.at(group_end, group, ends)
    return int((group_end - group_start).sum())


def user_annotations(events: pd.DataFrame) -> pd.DataFrame:
    """Host annotations other than the profiler's step markers."""
    annotations = of_kind(events, "annotation")
    if annotations.empty:
        return annotations
    names = annotations["name"].astype(str)
    return annotations[~names.str.match(STEP_NAME_RE.pattern).to_numpy()]


def innermost(points: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """Index (into starts/ends) of the innermost interval holding each point, or -1.
    Intervals must nest (annotations on one thread do)."""
    if starts.size == 0 or points.size == 0:
        return np.full(points.size, -1, dtype=np.int64)
    order = np.lexsort((-ends, starts))
    starts, ends = starts[order], ends[order]
    # parent[i]: the nearest earlier interval that still holds interval i's start.
    parent = np.full(starts.size, -1, dtype=np.int64)
    stack: list[int] = []
    for index in range(starts.size):  # one iteration per annotation, not per event
        while stack and ends[stack[-1]] <= starts[index]:
            stack.pop()
        parent[index] = stack[-1] if stack else -1
        stack.append(index)
    candidate = np.searchsorted(starts, points, side="right") - 1
    for _ in range(64):
        valid = candidate >= 0
        outside = valid & (ends[np.maximum(candidate, 0)] <= points)
        if not outside.any():
            break
        candidate = np.where(outside, parent[np.maximum(candidate, 0)], candidate)
    return np.where(candidate >= 0, order[np.maximum(candidate, 0)], -1)
