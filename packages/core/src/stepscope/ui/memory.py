"""The data behind a job's Memory page, as plain JSON: the trace engine's allocator tables
(docs/traces.md "Memory"): per-rank peaks, a bounded timeline per rank and device with the
step starts, what was live at the highest peak, per-step peaks, growth and allocating ops."""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any

from .views import _cached, _traces, table

MAX_TIMELINE_POINTS = 1200  # per rank and device; the engine keeps each bucket's low and high
MAX_TIMELINE_RANKS = 8  # the ranks with the highest peaks are drawn; the table lists all
MAX_ROWS = 50
_MIB = float(1 << 20)


def memory(trial: Any, stamp: Hashable) -> dict[str, Any]:
    return _cached(trial, stamp, "memory", lambda: _memory(trial))


def _memory(trial: Any) -> dict[str, Any]:
    traces = _traces(trial)
    if traces is None:
        return {"available": False, "reason": "no detailed traces in this job (profile some steps with the plugins' detailed profiling)"}
    ranks = traces.memory_ranks()
    if ranks.empty:
        return {"available": False, "reason": "the detailed traces hold no allocator events (record them with ProfilerConfig(profile_memory=True))"}
    shown = ranks.assign(peak_allocated_mib=ranks["peak_allocated"] / _MIB, peak_reserved_mib=ranks["peak_reserved"] / _MIB)
    top = ranks.loc[ranks["peak_allocated"].idxmax()]
    drawn = sorted(ranks.sort_values("peak_allocated", ascending=False)["rank"].drop_duplicates().head(MAX_TIMELINE_RANKS).tolist())
    return {
        "available": True,
        "ranks": table(shown[["rank", "device", "step", "peak_allocated_mib", "peak_reserved_mib", "vs_median"]]),
        "timelines": {f"rank {rank}": _timeline(traces, int(rank)) for rank in drawn},
        "peak": {
            "rank": int(top["rank"]), "device": str(top["device"]), "step": int(top["step"]), "allocated": int(top["peak_allocated"]),
            "live": table(traces.memory_peak(rank=int(top["rank"]), device=str(top["device"])).head(MAX_ROWS)),
        },  # fmt: skip
        "tables": {
            "Per step": table(traces.memory_steps().head(MAX_ROWS)),
            "Growth (allocations outliving their step)": table(traces.memory_growth().head(MAX_ROWS)),
            "Allocating operators": table(traces.allocating_ops(k=MAX_ROWS)),
        },
    }


def _timeline(traces: Any, rank: int) -> dict[str, Any]:
    """{devices: {device: {t, allocated, reserved}}, step_starts: [t], steps: [n]}: t in
    seconds from the rank's first allocator event, bytes in MiB."""
    line = traces.memory_timeline(rank=rank, max_points=MAX_TIMELINE_POINTS)
    origin = int(line["ts_ns"].min())
    devices = {}
    for device, rows in line.groupby("device", sort=True):
        devices[str(device)] = {
            "t": ((rows["ts_ns"] - origin) / 1e9).round(6).tolist(),
            "allocated": (rows["allocated"] / _MIB).round(4).tolist(),
            "reserved": (rows["reserved"].clip(lower=0) / _MIB).round(4).tolist(),
        }
    spans = traces.step_spans(rank=rank)
    return {"devices": devices, "steps": spans["step"].astype(int).tolist(), "step_starts": [round((int(t) - origin) / 1e9, 6) for t in spans["ts_ns"].tolist()]}
