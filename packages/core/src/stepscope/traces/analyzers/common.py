"""Helpers the analyses share: picking events of a kind, summary statistics, interval unions
and the innermost annotation around a point in time. All vectorized (numpy/pandas)."""

from __future__ import annotations

import numpy as np
import pandas as pd

from ..schema import BOOKKEEPING_CATEGORIES, KIND_CODE, STEP_NAME_RE

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
    """count, total, mean, p50, p95, max of `value` (ns) per group, in microseconds; groups
    in order of first appearance. One sort of (group, value) gives every statistic
    (quantiles interpolated linearly, as pandas and numpy do), which is several times
    faster than pandas' groupby quantile on a million rows."""
    if frame.empty:
        return pd.DataFrame(columns=[*keys, *STAT_COLUMNS])
    codes = _group_codes(frame, keys)
    values = frame[value].to_numpy()
    order = sort_order(codes, values, stable=False)  # equal (group, value) pairs are interchangeable
    codes, values = codes[order], values[order]
    starts = np.flatnonzero(np.concatenate(([True], codes[1:] != codes[:-1])))
    counts = np.diff(np.append(starts, codes.size))
    first_row = np.minimum.reduceat(order, starts)
    last = starts + counts - 1

    def quantile(q: float) -> np.ndarray:
        position = (counts - 1) * q
        below = np.floor(position).astype(np.int64)
        low, high = values[starts + below], values[np.minimum(starts + below + 1, last)]
        return low + (high - low) * (position - below)

    out = frame[keys].iloc[first_row].reset_index(drop=True)
    out["count"] = counts.astype(np.int64)
    total = np.add.reduceat(values, starts)
    out["total_us"] = total / 1000.0
    out["mean_us"] = total / counts / 1000.0
    out["p50_us"] = quantile(0.5) / 1000.0
    out["p95_us"] = quantile(0.95) / 1000.0
    out["max_us"] = values[last] / 1000.0
    return out.iloc[np.argsort(first_row, kind="stable")].reset_index(drop=True)[[*keys, *STAT_COLUMNS]]


def sort_order(primary: np.ndarray, secondary: np.ndarray, stable: bool = True) -> np.ndarray:
    """The order sorting rows by `primary`, then `secondary` (both integer). One argsort of a
    combined 64-bit key when both ranges fit (np.lexsort is several times slower);
    `stable=False` when the order of equal pairs does not matter (faster still)."""
    if primary.size == 0:
        return np.zeros(0, dtype=np.int64)
    primary, secondary = primary.astype(np.int64, copy=False), secondary.astype(np.int64, copy=False)
    low, high = int(secondary.min()), int(secondary.max())
    span_bits = max(high - low, 1).bit_length()
    groups_bits = max(int(primary.max()) - int(primary.min()), 1).bit_length()
    if span_bits + groups_bits > 62:
        return np.lexsort((secondary, primary))
    key = ((primary - primary.min()) << span_bits) | (secondary - low)
    return np.argsort(key, kind="stable" if stable else "quicksort")


def _group_codes(frame: pd.DataFrame, keys: list[str]) -> np.ndarray:
    if len(keys) == 1 and isinstance(frame[keys[0]].dtype, pd.CategoricalDtype):
        return frame[keys[0]].cat.codes.to_numpy().astype(np.int64)
    return frame.groupby(keys, observed=True, sort=False, dropna=False).ngroup().to_numpy().astype(np.int64)


def launch_lookup(events: pd.DataFrame, correlation: np.ndarray) -> tuple[pd.DataFrame, np.ndarray]:
    """The host runtime calls (runtime and sync rows) and, for each correlation id given,
    the position among them of the first call with that id, or -1. A sorted search, not
    a join: nothing is copied but the ids."""
    calls = of_kind(events, "runtime", "sync")
    ids = calls["correlation"].to_numpy()
    if ids.size == 0 or correlation.size == 0:
        return calls, np.full(correlation.size, -1, dtype=np.int64)
    order = np.argsort(ids, kind="stable")  # stable: among equal ids the first call wins
    sorted_ids = ids[order]
    known = int(np.searchsorted(sorted_ids, 0))  # calls without an id (-1) sort first
    if known == ids.size:
        return calls, np.full(correlation.size, -1, dtype=np.int64)
    low, high = int(sorted_ids[known]), int(sorted_ids[-1])
    if high - low < 4 * (ids.size - known) + 1024:
        # Correlation ids are a counter: a table indexed by id is read in order (the ids of
        # GPU work increase) where a binary search jumps about (3x faster on 10^6 rows).
        sorted_ids, order = sorted_ids[known:], order[known:]
        first = np.empty(sorted_ids.size, dtype=bool)
        first[0] = True
        np.not_equal(sorted_ids[1:], sorted_ids[:-1], out=first[1:])
        table = np.full(high - low + 1, -1, dtype=np.int64)
        table[sorted_ids[first] - low] = order[first]
        inside = (correlation >= low) & (correlation <= high)
        return calls, np.where(inside, table[np.clip(correlation - low, 0, high - low)], -1)
    position = np.minimum(np.searchsorted(sorted_ids, correlation), ids.size - 1)
    found = (sorted_ids[position] == correlation) & (correlation >= 0)
    return calls, np.where(found, order[position], -1)


def launch_start_of(events: pd.DataFrame, gpu: pd.DataFrame) -> np.ndarray:
    """Start (ns) of the runtime call that launched each GPU row, or -1 when unknown.
    Integer lookups only: epoch nanoseconds do not survive a trip through float64."""
    calls, position = launch_lookup(events, gpu["correlation"].to_numpy())
    starts = calls["ts_ns"].to_numpy()
    return np.where(position >= 0, starts[np.maximum(position, 0)] if starts.size else -1, -1)


def union_ns(starts: np.ndarray, ends: np.ndarray, presorted: bool = False) -> int:
    """Length of the union of [start, end) intervals (`presorted`: already by start)."""
    if starts.size == 0:
        return 0
    if not presorted:
        order = np.argsort(starts, kind="stable")
        starts, ends = starts[order], ends[order]
    running_end = np.maximum.accumulate(ends)
    # A merged interval starts wherever a start is past every earlier end, and ends at the
    # running end just before the next one starts.
    new = np.empty(starts.size, dtype=bool)
    new[0] = True
    np.greater(starts[1:], running_end[:-1], out=new[1:])
    first = np.flatnonzero(new)
    last = np.append(first[1:] - 1, starts.size - 1)
    return int((running_end[last] - starts[first]).sum())


def not_analysed(events: pd.DataFrame) -> pd.DataFrame:
    """Events of categories the engine does not know (a new device's, e.g. MTIA's `mtia_*`):
    one row per category with its count and total duration. Kineto's bookkeeping
    categories (the trace span, CUPTI overhead, profiler ranges) are left out."""
    other = of_kind(events, "other")
    columns = ["category", "events", "total_us"]
    if other.empty:
        return pd.DataFrame(columns=columns)
    category = other["category"].astype(str)
    other = other[~category.isin(list(BOOKKEEPING_CATEGORIES)).to_numpy()]
    if other.empty:
        return pd.DataFrame(columns=columns)
    grouped = other.groupby(other["category"].astype(str), sort=True)["dur_ns"].agg(["size", "sum"]).reset_index()
    grouped.columns = ["category", "events", "total_us"]
    grouped["total_us"] = grouped["total_us"] / 1000.0
    return grouped.sort_values("events", ascending=False, ignore_index=True)


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
