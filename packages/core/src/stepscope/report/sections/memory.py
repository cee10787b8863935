"""Memory, when the detailed traces hold allocator events (profile_memory=True): each rank's
peak per device, the memory timeline per device with the step boundaries, what was live at
the highest peak, the steps that kept memory (growth) and the operators that allocate most,
as the trace engine computes them (docs/traces.md "Memory")."""

from __future__ import annotations

from typing import Any

from ..figures import line_chart
from ..model import Figure, Paragraph, Section, Table
from .gpu import _call, _cell, needs_traces

MAX_ROWS = 15
MAX_TIMELINES = 4  # ranks drawn (the highest peaks first); the table lists every rank
TIMELINE_POINTS = 1500  # per device: the engine keeps each bucket's lowest and highest point
_MIB = float(1 << 20)

WHAT_TO_SAVE = (
    "Memory needs allocator events in the detailed traces: profile a few steps with "
    "ProfilerConfig(detailed_windows=..., profile_memory=True) (the default of stepscope's torch windows; docs/traces.md)."
)


@needs_traces("memory", "Memory", WHAT_TO_SAVE)
def build(section: Section, traces: Any) -> None:
    ranks = _call(section, "Memory", lambda: traces.memory_ranks())
    if ranks is None:  # unreadable traces: said so, the report goes on
        return
    if ranks.empty:
        section.missing.append("The detailed traces hold no allocator events. " + WHAT_TO_SAVE)
        return
    mib = ranks.assign(peak_allocated_mib=ranks["peak_allocated"] / _MIB, peak_reserved_mib=ranks["peak_reserved"] / _MIB)
    section.add(_table(mib[["rank", "device", "step", "peak_allocated_mib", "peak_reserved_mib", "vs_median"]], "Peak memory per rank and device (the highest step)", "memory-ranks"))
    drawn = ranks.sort_values("peak_allocated", ascending=False)["rank"].drop_duplicates().head(MAX_TIMELINES)
    for rank in sorted(drawn.tolist()):
        _timeline(section, traces, int(rank))
    top = ranks.loc[ranks["peak_allocated"].idxmax()]
    _add(section, f"What was live at the highest peak (rank {int(top['rank'])}, {top['device']}, step {int(top['step'])}), by operator",
         "memory-peak", lambda: traces.memory_peak(rank=int(top["rank"]), device=str(top["device"])))  # fmt: skip
    _add(section, "Memory per step: peaks and the operator at each peak", "memory-steps", lambda: traces.memory_steps())
    growth = _call(section, "Growth", lambda: traces.memory_growth())
    if growth is not None and len(growth):
        kept = growth[growth["outliving_bytes"] > 0]
        if len(kept):
            section.add(_table(kept, "Steps whose allocations outlive them (a leak grows here)", "memory-growth"))
        else:
            section.add(Paragraph("No profiled step kept memory past its end: every allocation made in a step was freed within it."))
    _add(section, "Operators that allocate most", "memory-ops", lambda: traces.allocating_ops(k=MAX_ROWS))


def _timeline(section: Section, traces: Any, rank: int) -> None:
    line = _call(section, f"Memory timeline of rank {rank}", lambda: traces.memory_timeline(rank=rank, max_points=TIMELINE_POINTS))
    if line is None or not len(line):
        return
    origin = int(line["ts_ns"].min())
    series = {}
    for device, rows in line.groupby("device", sort=True):
        seconds = ((rows["ts_ns"] - origin) / 1e9).tolist()
        series[f"{device} allocated"] = (seconds, (rows["allocated"] / _MIB).tolist())
        if (rows["reserved"] > 0).any():
            series[f"{device} reserved"] = (seconds, (rows["reserved"] / _MIB).tolist())
    spans = traces.step_spans(rank=rank)
    marks = [((int(ts) - origin) / 1e9, "step start") for ts in spans["ts_ns"].tolist()]
    svg = line_chart(series, xlabel="seconds into the profiled window", ylabel="MiB", marks=marks)
    section.add(Figure(svg, caption=f"Memory of rank {rank} per device (dashed: step starts)", key=f"memory-timeline-rank{rank}"))


def _add(section: Section, title: str, key: str, call: Any) -> None:
    frame = _call(section, title, call)
    if frame is not None and len(frame):
        section.add(_table(frame, title, key))


def _table(frame: Any, title: str, key: str) -> Table:
    head = frame.head(MAX_ROWS)
    rows = tuple(tuple(_cell(v) for v in row) for row in head.itertuples(index=False))
    more = f" (first {MAX_ROWS} of {len(frame)})" if len(frame) > MAX_ROWS else ""
    return Table(tuple(str(c) for c in head.columns), rows, caption=title + more, key=key)
