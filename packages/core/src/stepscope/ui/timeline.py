"""The timeline view's data, with level of detail decided on the server.

A job's intervals (steps and phases per rank and mode, from the step timeline) and counters
(CPU and GPU utilization per node, from the system metrics) are put once into sorted numpy
columns per lane. A request names a time range and a width in pixels; each lane answers
with the intervals at least `MIN_SLICE_PX` wide as they are, and everything smaller summed
into pixel buckets (count, busy fraction, the first name). So the answer's size depends on
the width, not on how many events the range holds: a 1,000,000-event job zooms and pans as
smoothly as a small one.

Four things are called "timeline": the hook's phase records (capture/phases.py); the step
timeline files, written by capture/step_timeline.py, parsed by profiler/timeline.py and read
for a job by profiler/step_reader.py; the merged Perfetto trace of `stepscope timeline`
(export/perfetto.py); and the app's timeline view (ui/timeline.py). This module is the app's timeline view."""

from __future__ import annotations

import os
import threading
import weakref
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import orjson
import pandas as pd

from ..exceptions import StepscopeError
from .views import STEP_PHASES

MIN_SLICE_PX = 2.0  # narrower intervals are aggregated
BUCKET_PX = 3  # pixels per aggregation bucket
MAX_SLICES_PER_LANE = 4000
MAX_EXPORT_EVENTS = 2_000_000  # a Perfetto download above this would be hundreds of MB
RAW_LIMIT = 150_000  # a range with more intervals than this is answered from the lane's grid
GRID_CELLS = 1 << 16
_TRACKS = {"TRAIN": 1, "EVAL": 2, "PREDICT": 3, "GLOBAL": 4}


class TooManyEvents(ValueError):
    """A range too large to export as one trace file."""


@dataclass
class SliceLane:
    """Intervals of one track, sorted by start; `depth` 0 for steps, 1 for their phases."""

    id: str
    group: str
    label: str
    start: np.ndarray  # int64 ns
    end: np.ndarray
    depth: np.ndarray  # int8
    name: np.ndarray  # int32 into TimelineIndex.names
    row: np.ndarray  # int64 row of the source frame (for details)
    max_duration: int = 0
    kind: str = "slices"
    source: str = "steps"  # which frame `row` points into: "steps" (step timeline) or "traces"
    duration: np.ndarray = field(default_factory=lambda: np.array([], dtype=np.int64))
    grid: _Grid | None = None
    grids: list[_Grid] = field(default_factory=list)  # finest first

    def __post_init__(self) -> None:
        self.duration = self.end - self.start
        if len(self.start) > RAW_LIMIT:
            fine = _Grid.build(self)
            self.grids = [fine, fine.coarser(), fine.coarser(256)]  # 65,536, 4,096 and 256 cells
            self.grid = fine


@dataclass
class _Grid:
    """Per depth, intervals counted on GRID_CELLS equal cells of the lane's span (count,
    summed duration, first interval), and the lane's positions sorted by duration: what a
    coarse zoom over millions of intervals reads instead of the intervals."""

    origin: int
    cell_ns: int
    cells: int
    count: np.ndarray  # (depths, cells) int32
    busy: np.ndarray  # (depths, cells) float64
    first: np.ndarray  # (depths, cells) int64 position of the first interval, -1 if none
    by_duration: np.ndarray
    sorted_durations: np.ndarray

    @classmethod
    def build(cls, lane: SliceLane) -> _Grid:
        origin = int(lane.start[0])
        cell_ns = max(1, -(-(int(lane.start[-1]) - origin + 1) // GRID_CELLS))
        cell = (lane.start - origin) // cell_ns
        depths = int(lane.depth.max()) + 1
        key = lane.depth.astype(np.int64) * GRID_CELLS + cell
        count = np.bincount(key, minlength=depths * GRID_CELLS).reshape(depths, GRID_CELLS).astype(np.int32)
        busy = np.bincount(key, weights=lane.duration.astype(float), minlength=depths * GRID_CELLS).reshape(depths, GRID_CELLS)
        first = np.full(depths * GRID_CELLS, -1, dtype=np.int64)
        order = np.argsort(key, kind="stable")
        sorted_key = key[order]
        starts = np.flatnonzero(np.r_[True, sorted_key[1:] != sorted_key[:-1]])
        first[sorted_key[starts]] = order[starts]
        by_duration = np.argsort(lane.duration, kind="stable")
        return cls(origin, cell_ns, GRID_CELLS, count, busy, first.reshape(depths, GRID_CELLS), by_duration, lane.duration[by_duration])

    def coarser(self, factor: int = 16) -> _Grid:
        """The same counts on cells `factor` times wider (a level of the pyramid)."""
        depths, cells = self.count.shape[0], self.cells // factor
        first = self.first.reshape(depths, cells, factor)
        has = first >= 0
        pick = np.where(has.any(axis=2), np.take_along_axis(first, has.argmax(axis=2)[..., None], axis=2)[..., 0], -1)
        return _Grid(self.origin, self.cell_ns * factor, cells, self.count.reshape(depths, cells, factor).sum(axis=2, dtype=np.int32),
                     self.busy.reshape(depths, cells, factor).sum(axis=2), pick, self.by_duration, self.sorted_durations)


@dataclass
class CounterLane:
    id: str
    group: str
    label: str
    t: np.ndarray  # int64 ns
    value: np.ndarray
    unit: str = "%"
    kind: str = "counter"


_MAX_EPOCH_S = 2.0**62 / 1e9  # the latest time, in seconds, whose nanoseconds fit in an int64


@dataclass
class TimelineIndex:
    """Every lane of one job, ready for range queries."""

    lanes: list[Any]
    names: list[str]
    start_ns: int
    end_ns: int
    events: pd.DataFrame  # the step timeline, for details and export
    metrics: pd.DataFrame
    markers: list[dict[str, Any]] = field(default_factory=list)
    traces: pd.DataFrame | None = None  # the trace engine's events (kernels, runtime calls, CPU ops, ...)
    launches: pd.DataFrame | None = None  # the trace engine's launch -> GPU activity pairs

    @property
    def event_count(self) -> int:
        return sum(len(lane.start) for lane in self.lanes if lane.kind == "slices")


def build_index(timeline: pd.DataFrame, metrics: pd.DataFrame, markers: list[dict[str, Any]] | None = None,
                traces: pd.DataFrame | None = None, launches: pd.DataFrame | None = None) -> TimelineIndex:
    """Lanes from a step timeline frame (`ProfilerTrial.step_timeline()`), system metrics and,
    where the job has detailed traces, the trace engine's events (`TraceAnalysis.events()`)."""
    names: dict[str, int] = {}
    lanes: list[Any] = []
    timeline = timeline.reset_index(drop=True)
    if len(metrics):
        # A sample at NaN, infinity or a time no int64 of nanoseconds holds is no point on
        # the time axis (a hostile or broken metrics file): leave it out, keep the rest.
        stamps = pd.to_numeric(metrics["timestamp"], errors="coerce").to_numpy(float)
        metrics = metrics[np.isfinite(stamps) & (np.abs(stamps) < _MAX_EPOCH_S)]
    if len(timeline):
        codes, uniques = pd.factorize(timeline["name"].astype(str), sort=False)
        names = {str(n): i for i, n in enumerate(uniques)}
        starts = timeline["start_ns"].to_numpy(np.int64)
        ends = np.maximum(timeline["end_ns"].to_numpy(np.int64), starts)
        depth = np.where(timeline["phase"].isin(STEP_PHASES).to_numpy(), 0, 1).astype(np.int8)
        for (node, rank, mode), group in timeline.groupby(["node_id", "rank", "mode"], sort=True):
            rows = group.index.to_numpy()
            order = np.argsort(starts[rows], kind="stable")
            rows = rows[order]
            s, e = starts[rows], ends[rows]
            lane_id = f"r{rank}-{mode}"
            lanes.append(SliceLane(lane_id, f"{node} rank {rank}", f"{mode}", s, e, depth[rows], codes[rows].astype(np.int32), rows,
                                   int((e - s).max()) if len(s) else 0))
    if len(metrics):
        wanted = metrics[metrics["dimension"].isin(["CPUUtilization", "GPUUtilization"])]
        cpu = wanted[(wanted["dimension"] == "CPUUtilization") & (wanted["name"] == "total")]
        gpu = wanted[wanted["dimension"] == "GPUUtilization"]
        for (node, name), frame in pd.concat([cpu, gpu]).groupby(["node_id", "name"], sort=True, observed=True):
            frame = frame.sort_values("timestamp")
            label = "CPU utilization" if name == "total" else f"{name} utilization"
            lanes.append(CounterLane(f"c-{node}-{name}", f"{node}", label, (frame["timestamp"].to_numpy() * 1e9).astype(np.int64), frame["value"].to_numpy(float)))
    if traces is not None and len(traces):
        traces = traces.reset_index(drop=True)
        lanes += _trace_lanes(traces, names)
    lanes.sort(key=lambda lane: (lane.group, lane.kind != "counter", _TRACKS.get(lane.label, 9), lane.label))
    bounds = [(int(lane.start[0]), int(lane.end.max())) for lane in lanes if lane.kind == "slices" and len(lane.start)]
    bounds += [(int(lane.t[0]), int(lane.t[-1])) for lane in lanes if lane.kind == "counter" and len(lane.t)]
    start = min((b[0] for b in bounds), default=0)
    end = max((b[1] for b in bounds), default=0)
    return TimelineIndex(lanes, list(names), start, max(end, start + 1), timeline, metrics, markers or [], traces, launches)


def _trace_lanes(traces: pd.DataFrame, names: dict[str, int]) -> list[SliceLane]:
    """Per rank: one lane per GPU stream (kernels, memcpy, memset), one of runtime calls (the
    launches), and per host thread one of annotations over CPU operators."""
    from ..traces.schema import KIND_CODE

    text = traces["name"].astype(str)
    codes = np.array([names.setdefault(n, len(names)) for n in text.tolist()], dtype=np.int32)
    kind = traces["kind"].to_numpy()
    starts = traces["ts_ns"].to_numpy(np.int64)
    ends = starts + np.maximum(traces["dur_ns"].to_numpy(np.int64), 0)
    gpu = np.isin(kind, [KIND_CODE["kernel"], KIND_CODE["memcpy"], KIND_CODE["memset"]])
    runtime = np.isin(kind, [KIND_CODE["runtime"], KIND_CODE["sync"]]) & (traces["stream"].to_numpy() < 0)
    host_ops = np.isin(kind, [KIND_CODE["annotation"], KIND_CODE["cpu_op"]])
    lanes = []

    def lane(lane_id: str, group: str, label: str, rows: np.ndarray, depth: np.ndarray) -> None:
        order = np.argsort(starts[rows], kind="stable")
        rows = rows[order]
        s, e = starts[rows], ends[rows]
        lanes.append(SliceLane(lane_id, group, label, s, e, depth[order].astype(np.int8), codes[rows], rows,
                               int((e - s).max()) if len(s) else 0, source="traces"))

    ranks = traces["rank"].to_numpy()
    streams = traces["stream"].to_numpy()
    tids = traces["tid"].to_numpy()
    for rank in sorted(set(ranks.tolist())):
        mine = ranks == rank
        for stream in sorted(set(streams[mine & gpu].tolist())):
            rows = np.flatnonzero(mine & gpu & (streams == stream))
            lane(f"g{rank}-s{stream}", f"rank {rank} GPU", f"stream {stream}", rows, np.zeros(len(rows)))
        rows = np.flatnonzero(mine & runtime)
        if len(rows):
            lane(f"h{rank}-runtime", f"rank {rank} host", "runtime (launches)", rows, np.zeros(len(rows)))
        for tid in sorted(set(tids[mine & host_ops].tolist())):
            rows = np.flatnonzero(mine & host_ops & (tids == tid))
            lane(f"h{rank}-t{tid}", f"rank {rank} host", f"thread {tid}: annotations / CPU ops", rows, (kind[rows] == KIND_CODE["cpu_op"]).astype(np.int8))
    return lanes


def query(index: TimelineIndex, start_ns: int | None, end_ns: int | None, width_px: int) -> dict[str, Any]:
    """The lanes of [start_ns, end_ns] at `width_px` pixels: times in the answer are µs from
    the range start (`t0`, ns), so numbers stay short."""
    t0 = index.start_ns if start_ns is None else int(start_ns)
    t1 = index.end_ns if end_ns is None else int(end_ns)
    if t1 <= t0:
        t1 = t0 + 1000
    ns_per_px = (t1 - t0) / width_px
    bucket_ns = ns_per_px * BUCKET_PX
    buckets = int(np.ceil(width_px / BUCKET_PX))
    used_names: dict[int, int] = {}
    lanes_out = []
    for lane in index.lanes:
        if lane.kind == "slices":
            lanes_out.append(_query_slices(lane, t0, t1, ns_per_px, bucket_ns, buckets, used_names))
        else:
            lanes_out.append(_query_counter(lane, t0, t1, bucket_ns, buckets))
    names = [""] * len(used_names)
    for global_id, local_id in used_names.items():
        names[local_id] = index.names[global_id]
    markers = [m for m in index.markers if t0 <= m["t_ns"] <= t1]
    return {"t0": t0, "t1": t1, "job_start": index.start_ns, "job_end": index.end_ns, "width": width_px, "bucket_us": bucket_ns / 1e3,
            "names": names, "lanes": lanes_out, "events": index.event_count,
            "markers": [{"t": round((m["t_ns"] - t0) / 1e3, 1), "label": m["label"]} for m in markers[:500]]}


def _local_names(ids: np.ndarray, used: dict[int, int]) -> list[int]:
    out = []
    for value in ids.tolist():
        local = used.get(value)
        if local is None:
            local = used[value] = len(used)
        out.append(local)
    return out


def _query_slices(lane: SliceLane, t0: int, t1: int, ns_per_px: float, bucket_ns: float, buckets: int, used: dict[int, int]) -> dict[str, Any]:
    lo = int(np.searchsorted(lane.start, t0 - lane.max_duration, side="left"))
    hi = int(np.searchsorted(lane.start, t1, side="right"))
    threshold = ns_per_px * MIN_SLICE_PX
    usable = [g for g in lane.grids if bucket_ns >= 4 * g.cell_ns] if lane.grid is not None else []
    if usable and hi - lo > RAW_LIMIT:
        wide, agg = _from_grid(lane, usable[-1], t0, t1, threshold, bucket_ns, buckets)
    else:
        wide, agg = _from_events(lane, lo, hi, t0, t1, threshold, bucket_ns, buckets)
    slices = {
        "s": np.round((lane.start[wide] - t0) / 1e3, 1).tolist(),
        "d": np.round(lane.duration[wide] / 1e3, 1).tolist(),
        "z": lane.depth[wide].tolist(),
        "n": _local_names(lane.name[wide], used),
        "i": wide.tolist(),
    }
    bucket, depth, count, busy, first = agg
    aggregated = {
        "b": bucket.tolist(), "z": depth.tolist(), "c": count.astype(np.int64).tolist(),
        "f": np.minimum(100, np.round(100 * busy / bucket_ns)).astype(np.int64).tolist(),
        "n": _local_names(lane.name[first], used),
    }
    return {"id": lane.id, "group": lane.group, "label": lane.label, "kind": "slices", "slices": slices, "agg": aggregated}


def _keep_longest(positions: np.ndarray, durations: np.ndarray) -> np.ndarray:
    """At most MAX_SLICES_PER_LANE of `positions`, the longest, in start order."""
    if len(positions) > MAX_SLICES_PER_LANE:
        positions = np.sort(positions[np.argsort(durations, kind="stable")[-MAX_SLICES_PER_LANE:]])
    return positions


def _from_events(lane: SliceLane, lo: int, hi: int, t0: int, t1: int, threshold: float, bucket_ns: float, buckets: int):
    """(wide positions, aggregates) from the intervals themselves: exact."""
    # Only intervals starting before t0 can end before it: check those alone.
    first_inside = int(np.searchsorted(lane.start, t0, side="left"))
    early = np.arange(lo, first_inside)[lane.end[lo:first_inside] >= t0]
    positions = np.concatenate([early, np.arange(first_inside, hi)]) if len(early) or first_inside > lo else np.arange(first_inside, hi)
    durations = lane.duration[positions]
    is_wide = durations >= threshold
    wide = _keep_longest(positions[is_wide], durations[is_wide])
    if len(wide) < int(is_wide.sum()):
        is_wide = np.isin(positions, wide, assume_unique=True)
    narrow = positions[~is_wide]
    if not len(narrow):
        empty = np.array([], dtype=np.int64)
        return wide, (empty, empty, empty, np.array([], float), empty)
    ns = np.maximum(lane.start[narrow], t0)
    ne = np.minimum(lane.end[narrow], t1)
    bucket = np.minimum(((ns - t0) / bucket_ns).astype(np.int64), buckets - 1)
    depth = lane.depth[narrow].astype(np.int64)
    return wide, _aggregate(bucket, depth, (ne - ns).astype(float), narrow, buckets)


def _aggregate(bucket: np.ndarray, depth: np.ndarray, busy: np.ndarray, positions: np.ndarray, buckets: int, counts: np.ndarray | None = None):
    """Sum per (depth, bucket); the first position of each (buckets ascend within a depth)."""
    key = depth * buckets + bucket
    size = (int(depth.max()) + 1) * buckets if len(depth) else buckets
    count = np.bincount(key, weights=counts, minlength=size)
    total = np.bincount(key, weights=busy, minlength=size)
    present = np.flatnonzero(count > 0)
    # the first position of each key: keys in ascending order, start order kept within one
    order = np.arange(len(key)) if len(key) < 2 or bool(np.all(key[1:] >= key[:-1])) else np.argsort(key, kind="stable")
    sorted_key = key[order]
    starts = np.flatnonzero(np.r_[True, sorted_key[1:] != sorted_key[:-1]])
    first = positions[order[starts]].astype(np.int64)  # aligned with `present`: the same sorted keys
    return present % buckets, present // buckets, count[present], total[present], first


def _from_grid(lane: SliceLane, grid: _Grid, t0: int, t1: int, threshold: float, bucket_ns: float, buckets: int):
    """(wide positions, aggregates) from the lane's precomputed grid: a range of millions of
    intervals costs what its cells cost. Intervals count in the cell where they start, so
    bucket edges are exact to one cell, at most a quarter of a bucket."""
    # wide ones: a suffix of the lane sorted by duration, then those overlapping the range
    k = int(np.searchsorted(grid.sorted_durations, threshold, side="left"))
    candidates = grid.by_duration[k:]
    candidates = candidates[(lane.start[candidates] <= t1) & (lane.end[candidates] >= t0)]
    wide = _keep_longest(np.sort(candidates), lane.duration[np.sort(candidates)])
    c0 = max(0, (t0 - grid.origin) // grid.cell_ns)
    c1 = min(grid.cells - 1, (t1 - grid.origin) // grid.cell_ns)
    if c1 < c0:
        empty = np.array([], dtype=np.int64)
        return wide, (empty, empty, empty, np.array([], float), empty)
    cells = np.arange(c0, c1 + 1)
    cell_bucket = np.clip(((grid.origin + cells * grid.cell_ns - t0) / bucket_ns).astype(np.int64), 0, buckets - 1)
    count = grid.count[:, c0:c1 + 1].astype(float).copy()
    busy = grid.busy[:, c0:c1 + 1].copy()
    # the wide ones are sent as they are: take them out of the counts
    inside = wide[(lane.start[wide] >= grid.origin + c0 * grid.cell_ns) & (lane.start[wide] < grid.origin + (c1 + 1) * grid.cell_ns)]
    if len(inside):
        cell_of = (lane.start[inside] - grid.origin) // grid.cell_ns - c0
        np.subtract.at(count, (lane.depth[inside].astype(np.int64), cell_of), 1)
        np.subtract.at(busy, (lane.depth[inside].astype(np.int64), cell_of), lane.duration[inside].astype(float))
    present = count > 0
    d_idx, c_idx = np.nonzero(present)
    return wide, _aggregate(cell_bucket[c_idx], d_idx.astype(np.int64), busy[d_idx, c_idx], grid.first[d_idx, c_idx + c0], buckets, counts=count[d_idx, c_idx])


def _query_counter(lane: CounterLane, t0: int, t1: int, bucket_ns: float, buckets: int) -> dict[str, Any]:
    lo = max(0, int(np.searchsorted(lane.t, t0, side="left")) - 1)
    hi = min(len(lane.t), int(np.searchsorted(lane.t, t1, side="right")) + 1)
    t, v = lane.t[lo:hi], lane.value[lo:hi]
    if len(t) > buckets:
        bucket = np.clip(((t - t0) / bucket_ns).astype(np.int64), -1, buckets) + 1
        counts = np.bincount(bucket, minlength=buckets + 2)
        sums = np.bincount(bucket, weights=v, minlength=buckets + 2)
        present = np.nonzero(counts)[0]
        t = t0 + (present - 1 + 0.5) * bucket_ns
        v = sums[present] / counts[present]
    return {"id": lane.id, "group": lane.group, "label": lane.label, "kind": "counter", "unit": lane.unit,
            "t": np.round((np.asarray(t, float) - t0) / 1e3, 1).tolist(), "v": np.round(v, 2).tolist()}


def event_details(index: TimelineIndex, lane_id: str, row: int) -> dict[str, Any]:
    """Everything the step timeline holds about one interval (the details panel)."""
    lane = next((lane for lane in index.lanes if lane.id == lane_id and lane.kind == "slices"), None)
    if lane is None or not 0 <= row < len(lane.row):
        raise KeyError("no such event")
    if lane.source == "traces":
        return _trace_event_details(index, int(lane.row[row]))
    event = index.events.iloc[int(lane.row[row])]
    out = {k: _plain(event[k]) for k in ("node_id", "rank", "framework", "mode", "step", "phase", "name", "start_ns", "end_ns", "duration_ms")}
    out["args"] = _plain(event["args"])
    # epoch nanoseconds need 61 bits; a browser's JSON numbers keep 53, so send them as text
    out["start_ns"], out["end_ns"] = str(out["start_ns"]), str(out["end_ns"])
    return out


def _trace_event_details(index: TimelineIndex, row: int) -> dict[str, Any]:
    """A trace event, and for a GPU activity the runtime call that launched it (the launch
    lane, time, delay), from the trace engine's `launches()`."""
    from ..traces.schema import KINDS

    assert index.traces is not None  # a "traces" lane exists only with a traces frame
    event = index.traces.iloc[row]
    out: dict[str, Any] = {"kind": KINDS[int(event["kind"])], "name": str(event["name"]), "rank": int(event["rank"]), "step": int(event["step"]),
                           "start_ns": str(int(event["ts_ns"])), "end_ns": str(int(event["ts_ns"]) + int(event["dur_ns"])),
                           "duration_us": int(event["dur_ns"]) / 1e3}
    for column in ("stream", "device", "correlation", "external_id", "bytes"):
        if int(event[column]) >= 0:
            out[column] = int(event[column])
    launches = index.launches
    if launches is not None and len(launches) and out.get("correlation") is not None and out["kind"] in ("kernel", "memcpy", "memset"):
        match = launches[(launches["correlation"] == out["correlation"]) & (launches["rank"] == out["rank"])] if "rank" in launches else \
            launches[launches["correlation"] == out["correlation"]]
        if len(match):
            launch = match.iloc[0]
            out["launch"] = {"call": str(launch["launch_call"]), "start_ns": str(int(launch["launch_ts_ns"])),
                             "duration_us": int(launch["launch_dur_ns"]) / 1e3, "delay_us": int(launch["delay_ns"]) / 1e3,
                             "lane": f"h{out['rank']}-runtime"}
    return out


def export_steps(index: TimelineIndex, start_ns: int | None, end_ns: int | None) -> tuple[int, int] | None:
    """The steps (first, last) a range covers, for the merged trace's `steps=`; None (the
    whole job) when the job has no step timeline. TooManyEvents for a range too large."""
    t0 = index.start_ns if start_ns is None else int(start_ns)
    t1 = index.end_ns if end_ns is None else int(end_ns)
    count = sum(int(np.searchsorted(lane.start, t1, side="right")) - int(np.searchsorted(lane.start, t0 - lane.max_duration))
                for lane in index.lanes if lane.kind == "slices")
    if count > MAX_EXPORT_EVENTS:
        raise TooManyEvents(f"the range holds about {count:,} intervals; zoom in below {MAX_EXPORT_EVENTS:,} to export it")
    frame = index.events
    if not len(frame):
        return None
    steps = frame[frame["phase"].isin(STEP_PHASES)]
    if steps.empty:
        return None
    inside = steps[(steps["end_ns"] >= t0) & (steps["start_ns"] <= t1)]
    if inside.empty:  # between two steps: the one before and the one after
        before = steps[steps["end_ns"] < t0]["step"]
        after = steps[steps["start_ns"] > t1]["step"]
        first = int(before.max()) if len(before) else int(after.min())
        last = int(after.min()) if len(after) else int(before.max())
        return min(first, last), max(first, last)
    return int(inside["step"].min()), int(inside["step"].max())


def _plain(value: Any) -> Any:
    if isinstance(value, (np.integer,)):
        return int(value)
    if isinstance(value, (np.floating,)):
        return float(value)
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if value is None or isinstance(value, (str, int, float, bool, list)):
        return value
    if pd.isna(value):
        return None
    return str(value)


# --- per job, cached ----------------------------------------------------------------------

# Per trial, weakly (see views._cache): (generation, index).
_indexes: weakref.WeakKeyDictionary[Any, tuple[int, TimelineIndex]] = weakref.WeakKeyDictionary()
_lock = threading.Lock()


def job_index(jobs: Any, job: str) -> TimelineIndex:
    """The job's index, rebuilt when the job has published something new."""
    trial = jobs.trial(job)
    stamp = jobs.generation(job)
    with _lock:
        hit = _indexes.get(trial)
    if hit is not None and hit[0] == stamp:
        return hit[1]
    from .jobs import trial_lock
    from .views import _traces

    markers = _rule_markers(trial, stamp)
    with trial_lock(trial):
        profiler = trial.profiler
        traces = _traces(trial)
        events = traces.events(kinds=["kernel", "memcpy", "memset", "runtime", "sync", "annotation", "cpu_op"]) if traces is not None else None
        launches = traces.launches() if traces is not None else None
        index = build_index(profiler.step_timeline(), profiler.system_metrics(), markers, events, launches)
    with _lock:
        _indexes[trial] = (stamp, index)
    return index


def _rule_markers(trial: Any, stamp: int) -> list[dict[str, Any]]:
    """Where rules fired, placed at the start of the step they name (for the marker lane)."""
    from .views import rules_status

    timeline = trial.profiler.step_timeline()
    steps = timeline[timeline["phase"].isin(STEP_PHASES)]
    if steps.empty:
        return []
    first_start = steps.groupby("step")["start_ns"].min()
    markers = []
    try:
        rows = rules_status(trial, stamp)["rules"]
    except (StepscopeError, OSError, ValueError):
        return []
    for row in rows:
        if not row["fired"]:
            continue
        for step in row.get("steps") or []:
            if step in first_start.index:
                markers.append({"t_ns": int(first_start[step]), "label": f"{row['rule']} (step {step})"})
    return markers


def timeline_view(jobs: Any, job: str, start_ns: float | None, end_ns: float | None, width_px: int) -> bytes:
    return orjson.dumps(query(job_index(jobs, job), None if start_ns is None else int(start_ns), None if end_ns is None else int(end_ns), width_px))


def perfetto_trace(jobs: Any, job: str, start_ns: float | None, end_ns: float | None) -> bytes:
    """The merged Perfetto timeline (stepscope.export.perfetto: metrics, steps and
    phases, annotations, CPU ops, GPU streams with launch flows, rule firings) of the steps
    the visible range covers."""
    import tempfile

    from ..export.perfetto import write_timeline
    from .jobs import trial_lock

    index = job_index(jobs, job)
    steps = export_steps(index, None if start_ns is None else int(start_ns), None if end_ns is None else int(end_ns))
    trial = jobs.trial(job, refresh=False)
    with tempfile.TemporaryDirectory(prefix="stepscope-ui-") as folder, trial_lock(trial):
        target = os.path.join(folder, "trace.json")
        write_timeline(trial.store, target, steps=steps, analysis=trial.profiler.traces)
        with open(target, "rb") as handle:
            return handle.read()
