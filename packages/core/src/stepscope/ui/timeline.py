"""The timeline view's data, with level of detail decided on the server.

A job's intervals (steps and phases per rank and mode, from the step timeline) and counters
(CPU and GPU utilization per node, from the system metrics) are put once into sorted numpy
columns per lane. A request names a time range and a width in pixels; each lane answers
with the intervals at least `MIN_SLICE_PX` wide as they are, and everything smaller summed
into pixel buckets (count, busy fraction, the first name). So the answer's size depends on
the width, not on how many events the range holds: a 1,000,000-event job zooms and pans as
smoothly as a small one."""

from __future__ import annotations

import threading
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
_TRACKS = {"TRAIN": 1, "EVAL": 2, "PREDICT": 3, "GLOBAL": 4}


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


@dataclass
class CounterLane:
    id: str
    group: str
    label: str
    t: np.ndarray  # int64 ns
    value: np.ndarray
    unit: str = "%"
    kind: str = "counter"


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

    @property
    def event_count(self) -> int:
        return sum(len(lane.start) for lane in self.lanes if lane.kind == "slices")


def build_index(timeline: pd.DataFrame, metrics: pd.DataFrame, markers: list[dict[str, Any]] | None = None) -> TimelineIndex:
    """Lanes from a step timeline frame (`ProfilerTrial.step_timeline()`) and system metrics."""
    names: dict[str, int] = {}
    lanes: list[Any] = []
    timeline = timeline.reset_index(drop=True)
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
    lanes.sort(key=lambda lane: (lane.group, lane.kind != "counter", _TRACKS.get(lane.label, 9), lane.label))
    bounds = [(int(lane.start[0]), int(lane.end.max())) for lane in lanes if lane.kind == "slices" and len(lane.start)]
    bounds += [(int(lane.t[0]), int(lane.t[-1])) for lane in lanes if lane.kind == "counter" and len(lane.t)]
    start = min((b[0] for b in bounds), default=0)
    end = max((b[1] for b in bounds), default=0)
    return TimelineIndex(lanes, list(names), start, max(end, start + 1), timeline, metrics, markers or [])


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
    s, e = lane.start[lo:hi], lane.end[lo:hi]
    inside = e >= t0
    idx = np.nonzero(inside)[0]
    s, e = s[idx], e[idx]
    durations = e - s
    wide = durations >= ns_per_px * MIN_SLICE_PX
    wide_idx = idx[wide]
    if len(wide_idx) > MAX_SLICES_PER_LANE:  # keep the longest; the rest is aggregated below
        keep = np.argsort(durations[wide])[-MAX_SLICES_PER_LANE:]
        mask = np.zeros(len(wide_idx), bool)
        mask[keep] = True
        wide_positions = np.nonzero(wide)[0]
        wide[wide_positions[~mask]] = False
        wide_idx = idx[wide]
    absolute = wide_idx + lo
    slices = {
        "s": np.round((lane.start[absolute] - t0) / 1e3, 1).tolist(),
        "d": np.round((lane.end[absolute] - lane.start[absolute]) / 1e3, 1).tolist(),
        "z": lane.depth[absolute].tolist(),
        "n": _local_names(lane.name[absolute], used),
        "i": absolute.tolist(),
    }
    narrow = ~wide
    agg: dict[str, Any] = {"b": [], "z": [], "c": [], "f": [], "n": []}
    if narrow.any():
        ns, ne = np.maximum(s[narrow], t0), np.minimum(e[narrow], t1)
        bucket = np.clip(((ns - t0) / bucket_ns).astype(np.int64), 0, buckets - 1)
        depth = lane.depth[idx[narrow] + lo].astype(np.int64)
        key = depth * buckets + bucket
        counts = np.bincount(key, minlength=2 * buckets)
        busy = np.bincount(key, weights=(ne - ns).astype(float), minlength=2 * buckets)
        present = np.nonzero(counts)[0]
        _, first = np.unique(key, return_index=True)  # key ascends with start within a depth: the first event of each bucket
        names = lane.name[idx[narrow] + lo][first]
        agg = {
            "b": (present % buckets).tolist(),
            "z": (present // buckets).tolist(),
            "c": counts[present].tolist(),
            "f": np.minimum(100, np.round(100 * busy[present] / bucket_ns)).astype(int).tolist(),
            "n": _local_names(names, used),
        }
    return {"id": lane.id, "group": lane.group, "label": lane.label, "kind": "slices", "slices": slices, "agg": agg}


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
    event = index.events.iloc[int(lane.row[row])]
    out = {k: _plain(event[k]) for k in ("node_id", "rank", "framework", "mode", "step", "phase", "name", "start_ns", "end_ns", "duration_ms")}
    out["args"] = _plain(event["args"])
    # epoch nanoseconds need 61 bits; a browser's JSON numbers keep 53, so send them as text
    out["start_ns"], out["end_ns"] = str(out["start_ns"]), str(out["end_ns"])
    return out


def perfetto_events(index: TimelineIndex, start_ns: int | None, end_ns: int | None) -> bytes:
    """A Chrome trace (Perfetto and chrome://tracing open it) of the range: steps and phases
    on one track per rank and mode, CPU/GPU utilization as counters."""
    t0 = index.start_ns if start_ns is None else int(start_ns)
    t1 = index.end_ns if end_ns is None else int(end_ns)
    events: list[dict[str, Any]] = []
    frame = index.events
    if len(frame):
        frame = frame[(frame["end_ns"] >= t0) & (frame["start_ns"] <= t1)]
    for rank, group in frame.groupby("rank", sort=True) if len(frame) else []:
        node = str(group["node_id"].iloc[0])
        events.append({"name": "process_name", "ph": "M", "pid": int(rank), "args": {"name": f"rank {rank} ({node})"}})
        for mode, track in _TRACKS.items():
            if (group["mode"] == mode).any():
                events.append({"name": "thread_name", "ph": "M", "pid": int(rank), "tid": track, "args": {"name": mode}})
        for row in group.itertuples():
            args = {"step": int(row.step), "mode": str(row.mode), "phase": str(row.phase)}
            if isinstance(row.args, dict):
                args.update(row.args)
            events.append({"name": str(row.name), "cat": str(row.phase), "ph": "X", "ts": row.start_ns / 1e3, "dur": (row.end_ns - row.start_ns) / 1e3,
                           "pid": int(row.rank), "tid": _TRACKS.get(str(row.mode), 9), "args": args})
    for lane in index.lanes:
        if lane.kind != "counter":
            continue
        keep = (lane.t >= t0) & (lane.t <= t1)
        pid = f"system {lane.group}"
        for t, v in zip(lane.t[keep].tolist(), lane.value[keep].tolist()):
            events.append({"name": lane.label, "ph": "C", "ts": t / 1e3, "pid": pid, "args": {"value": v}})
    return orjson.dumps({"traceEvents": events, "displayTimeUnit": "ms", "metadata": {"source": "stepscope ui", "range_ns": [t0, t1]}})


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

_indexes: dict[str, tuple[Any, TimelineIndex]] = {}
_lock = threading.Lock()


def job_index(jobs: Any, job: str) -> TimelineIndex:
    """The job's index, rebuilt when the job has published something new."""
    trial = jobs.trial(job)
    stamp = jobs.generation(job)
    with _lock:
        hit = _indexes.get(job)
    if hit is not None and hit[0] == stamp:
        return hit[1]
    profiler = trial.profiler
    index = build_index(profiler.step_timeline(), profiler.system_metrics(), _rule_markers(trial, stamp))
    with _lock:
        _indexes[job] = (stamp, index)
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
        evidence = row.get("evidence") or {}
        fired_steps = list(row.get("steps") or [])
        if isinstance(evidence, dict):
            fired_steps += [o.get("step") for o in evidence.get("outliers", []) if isinstance(o, dict)]
        for step in fired_steps:
            if step in first_start.index:
                markers.append({"t_ns": int(first_start[step]), "label": f"{row['rule']} (step {step})"})
    return markers


def timeline_view(jobs: Any, job: str, start_ns: float | None, end_ns: float | None, width_px: int) -> bytes:
    return orjson.dumps(query(job_index(jobs, job), None if start_ns is None else int(start_ns), None if end_ns is None else int(end_ns), width_px))


def perfetto_trace(jobs: Any, job: str, start_ns: float | None, end_ns: float | None) -> bytes:
    return perfetto_events(job_index(jobs, job), None if start_ns is None else int(start_ns), None if end_ns is None else int(end_ns))
