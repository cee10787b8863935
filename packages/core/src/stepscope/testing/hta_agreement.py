"""stepscope next to HTA 0.5 on one real Kineto trace, point by point (used by
test_real_traces.py on the committed fixtures and by bench/bench_hta_agreement.py on any
folder of traces).

Each point compares one number of one analysis (a kernel's count and total, a stream's
idle time by category, one launch's delay ...). A point *agrees* when stepscope's value,
from the trace as it is, equals HTA's; it is *explained* when it differs but stepscope's
value, recomputed from the trace with HTA's three documented bugs applied to the events
(docs/traces.md, "HTA 0.5, compared"), equals HTA's; it *differs* otherwise. A trace
agrees when all its points agree, is explained when every point agrees or is explained.

HTA's bugs, applied by `hta_view` (and, the fourth, by `_ours`):
1. It drops GPU work whose launch started at or after the last ProfilerStep's start (and
   work launched before the trace), and host events from that step on, when the trace has
   two or more steps.
2. It rounds ns-resolution traces to whole microseconds (start up, end down).
3. It counts as a kernel any GPU record with a `stream` field >= 0 and a correlation id,
   and the `Event Sync` / `Context Sync` records (stream -1): the GPU-side sync records
   (its temporal and idle breakdowns: any event whose stream is not -1).
4. Its launch statistics know four launch calls only (HTA_LAUNCH_CALLS): no HIP launches,
   no driver-API cuLaunchKernel (Triton), no synchronous cudaMemcpy, no graph launches;
   and it gives an iteration (step) to GPU work on streams > 0 only (ROCm's stream 0 has
   none)."""

from __future__ import annotations

import logging
import math
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from stepscope.traces.analyzers import idle, kernels, launches, memory, steps, syncs
from stepscope.traces.analyzers.common import of_kind
from stepscope.traces.reader import read_trace
from stepscope.traces.schema import KIND_CODE, MISSING, STEP_NAME_RE, SYNC_CALLS

_GPU = [KIND_CODE[k] for k in ("kernel", "memcpy", "memset", "gpu_sync")]


@dataclass
class Point:
    analysis: str
    key: str
    ours: float
    theirs: float
    view: float  # ours, with HTA's bugs applied to the events

    @property
    def status(self) -> str:
        if _same(self.ours, self.theirs):
            return "agrees"
        if _same(self.view, self.theirs):
            return "explained"
        return "differs"


@dataclass
class Agreement:
    trace: str
    points: list[Point] = field(default_factory=list)
    error: str = ""  # HTA could not analyse the trace

    def count(self, status: str) -> int:
        return sum(1 for p in self.points if p.status == status)

    @property
    def status(self) -> str:
        if self.error:
            return "not read" if self.error.startswith("stepscope:") else "hta failed"
        if self.count("differs"):
            return "differs"
        return "explained" if self.count("explained") else "agrees"

    def differing(self) -> list[Point]:
        return [p for p in self.points if p.status == "differs"]


def _same(a: float, b: float) -> bool:
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    return bool(abs(a - b) <= 1e-6 + 1e-9 * abs(b))


def hta_view(events: pd.DataFrame, fractional: bool, breakdown: bool = False, base_ns: int = 0, streamed_syncs: frozenset[int] = frozenset()) -> pd.DataFrame:
    """The events as HTA 0.5 sees them (its three bugs, see the module's docstring).
    `breakdown`: the set its temporal and idle breakdowns take as kernels (every event whose
    raw stream is not -1: `streamed_syncs` are the correlation ids of the sync records whose
    raw `stream` was not -1, e.g. 4294967295, which the table stores as -1) instead of its
    kernel filter's."""
    frame = events.copy()
    kind = frame["kind"].to_numpy().copy()
    names = frame["name"].astype(str).to_numpy()
    # 3: records with a stream counted as kernels (sync records, Triton's cpu_ops, MTIA's).
    if breakdown:
        as_kernel = (frame["stream"].to_numpy() != -1) | ((kind == KIND_CODE["gpu_sync"]) & frame["correlation"].isin(list(streamed_syncs)).to_numpy())
    else:
        as_kernel = ((frame["stream"].to_numpy() >= 0) & (frame["correlation"].to_numpy() >= 0)) | ((kind == KIND_CODE["gpu_sync"]) & np.isin(names, ["Event Sync", "Context Sync"]))
    not_kernel = np.isin(kind, [KIND_CODE["kernel"], KIND_CODE["gpu_sync"]]) & ~as_kernel
    copies = np.isin(kind, [KIND_CODE["memcpy"], KIND_CODE["memset"]])
    kind[as_kernel & ~copies] = KIND_CODE["kernel"]
    if breakdown:
        # HTA's compute regex leaves names matching `.*Sync` out of compute (Stream Wait Event
        # stays compute): busy, not compute, which a memset row is to the breakdown.
        kind[as_kernel & (kind == KIND_CODE["kernel"]) & (events["kind"].to_numpy() == KIND_CODE["gpu_sync"]) & np.char.endswith(names.astype(str), "Sync")] = KIND_CODE["memset"]
    frame["kind"] = kind
    frame = frame[~not_kernel]
    # 1: the last step and work launched outside the traced steps.
    is_step = np.array([bool(STEP_NAME_RE.match(n)) for n in frame["name"].astype(str)], dtype=bool) & np.isin(frame["kind"].to_numpy(), [KIND_CODE["annotation"], KIND_CODE["cpu_op"]])
    if is_step.sum() >= 2:
        last_start = int(frame["ts_ns"].to_numpy()[is_step].max())
        host = ~np.isin(frame["kind"].to_numpy(), _GPU + [KIND_CODE["gpu_annotation"]])
        calls = frame[np.isin(frame["kind"].to_numpy(), [KIND_CODE["runtime"], KIND_CODE["sync"]]) & (frame["ts_ns"].to_numpy() < last_start)]
        launched_in = set(calls["correlation"].to_numpy().tolist()) - {MISSING}
        gpu = np.isin(frame["kind"].to_numpy(), _GPU)
        keep = (host & (frame["ts_ns"].to_numpy() < last_start)) | (gpu & frame["correlation"].isin(launched_in).to_numpy())
        frame = frame[keep]
    # 2: ns-resolution traces rounded to whole µs (start up, end down).
    if fractional:
        # In float64 as HTA does it (epoch µs there have a resolution of 0.25 µs).
        # On the trace's own clock (before baseTimeNanoseconds is added), as HTA reads it.
        start, dur = frame["ts_ns"].to_numpy() - base_ns, frame["dur_ns"].to_numpy()
        start_f = (start // 1000).astype(np.float64) + (start % 1000) / 1000.0
        end_f = start_f + ((dur // 1000).astype(np.float64) + (dur % 1000) / 1000.0)
        start_us, end_us = np.ceil(start_f).astype(np.int64), np.floor(end_f).astype(np.int64)
        frame = frame.assign(ts_ns=start_us * 1000 + base_ns, dur_ns=(end_us - start_us) * 1000)
    frame = frame.sort_values("kind", kind="stable", ignore_index=True)
    frame["step"] = frame["step"].to_numpy()
    return frame


# 4: HTA's launch statistics know these launch calls only (no HIP, no driver cuLaunchKernel,
# no synchronous cudaMemcpy, no graph launches).
HTA_LAUNCH_CALLS = ("cudaLaunchKernel", "cudaLaunchKernelExC", "cudaMemcpyAsync", "cudaMemsetAsync")


def _ours(events: pd.DataFrame, breakdown_events: pd.DataFrame | None = None, launch_calls: tuple[str, ...] | None = None) -> dict[str, dict[str, float]]:
    """Every compared number of stepscope's analyses, by analysis and key (the temporal and
    idle breakdowns over `breakdown_events` when given)."""
    out: dict[str, dict[str, float]] = {}
    breakdown_events = events if breakdown_events is None else breakdown_events
    stats = kernels.kernel_stats(events, by="name") if not of_kind(events, "kernel").empty else pd.DataFrame(columns=["name", "count", "total_us"])
    copies = of_kind(events, "memcpy", "memset")
    out["kernel count"] = {str(r.name): float(r.count) for r in stats.itertuples()}
    out["kernel total_us"] = {str(r.name): float(r.total_us) for r in stats.itertuples()}
    for name, group in copies.groupby(copies["name"].astype(str)):
        out["kernel count"][name] = float(len(group))
        out["kernel total_us"][name] = group["dur_ns"].sum() / 1000
    temporal = idle.temporal_breakdown(breakdown_events)
    if not temporal.empty:
        row = temporal.iloc[0]
        out["temporal"] = {"span_us": row.span_us, "idle_us": row.idle_us, "compute_us": row.compute_us, "non_compute_us": row.non_compute_us}
    by_stream = idle.idle_breakdown(breakdown_events)
    out["idle per stream"] = {f"{int(r.stream)} {c}": float(getattr(r, f"{c}_us")) for r in by_stream.itertuples() for c in ("host_wait", "kernel_wait", "other")}
    launched = launches.launches(events)
    if launch_calls is not None and not launched.empty:
        launched = launched[launched["launch_call"].astype(str).isin(launch_calls).to_numpy()]
    out["launch delay_us"] = {str(int(c)): d / 1000 for c, d in zip(launched["correlation"], launched["delay_ns"]) if d >= 0}
    out["launch cpu_us"] = {str(int(c)): d / 1000 for c, d in zip(launched["correlation"], launched["launch_dur_ns"]) if d >= 0}
    ops = memory.memory_ops(events)
    out["memory"] = {}
    for direction, group in ops.groupby("direction"):
        out["memory"][f"{direction} count"] = float(group["count"].sum())
        out["memory"][f"{direction} bytes"] = float(group["bytes"].sum())
        out["memory"][f"{direction} total_us"] = float(group["total_us"].sum())
    sync_table = syncs.sync_stats(events)
    out["syncs"] = {}
    for r in sync_table.itertuples():
        out["syncs"][f"{r.name} count"] = float(r.count)
        out["syncs"][f"{r.name} total_us"] = float(r.total_us)
    per_step = steps.step_breakdown(events)
    out["step kernel_us"] = {str(int(r.step)): float(r.kernel_us) for r in per_step.itertuples() if r.step >= 0 and not math.isnan(r.kernel_us)}
    return out


def _theirs(path: Path) -> dict[str, dict[str, float]]:
    """The same numbers from HTA 0.5."""
    from hta.trace_analysis import TraceAnalysis as HTA

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        logging.disable(logging.WARNING)
        try:
            hta = HTA(trace_files={0: str(path)}, trace_dir=str(path.parent))
            trace = hta.t.get_trace(0)
            symbols = hta.t.symbol_table.sym_table
            out: dict[str, dict[str, float]] = {}
            names = trace["name"].map(lambda i: symbols[i]).astype(str)
            cats = trace["cat"].map(lambda i: symbols[i]).astype(str)
            kernel_rows = trace[((trace["stream"] >= 0) & (trace["correlation"] >= 0)) | names.isin(["Event Sync", "Context Sync"])]
            kernel_names = names[kernel_rows.index]
            out["kernel count"] = {n: float(c) for n, c in kernel_names.value_counts().items()}
            out["kernel total_us"] = {n: float(s) for n, s in kernel_rows.groupby(kernel_names)["dur"].sum().items()}
            if len(kernel_rows):
                t = hta.get_temporal_breakdown(visualize=False).iloc[0]
                out["temporal"] = {"span_us": float(t["kernel_time(us)"]), "idle_us": float(t["idle_time(us)"]), "compute_us": float(t["compute_time(us)"]), "non_compute_us": float(t["non_compute_time(us)"])}
                idle_table = hta.get_idle_time_breakdown(visualize=False)[0]
                out["idle per stream"] = {f"{int(r.stream)} {r.idle_category}": float(r.idle_time) for r in idle_table.itertuples()}
                launch = hta.get_cuda_kernel_launch_stats(visualize=False).get(0, pd.DataFrame())
                out["launch delay_us"] = {str(int(r.correlation)): float(r.launch_delay) for r in launch.itertuples()}
                out["launch cpu_us"] = {str(int(r.correlation)): float(r.cpu_duration) for r in launch.itertuples()}
            copies = trace[cats.isin(["gpu_memcpy", "gpu_memset", "Memcpy", "Memset"])]
            out["memory"] = {}
            for label, group in copies.groupby(names[copies.index].map(_direction)):
                out["memory"][f"{label} count"] = float(len(group))
                out["memory"][f"{label} bytes"] = float(group["bytes"].clip(lower=0).sum())
                out["memory"][f"{label} total_us"] = float(group["dur"].sum())
            sync_calls = trace[names.isin(SYNC_CALLS) & cats.isin(["cuda_runtime", "Runtime", "cuda_driver", "hip_runtime"])]
            out["syncs"] = {}
            for name, group in sync_calls.groupby(names[sync_calls.index]):
                out["syncs"][f"{name} count"] = float(len(group))
                out["syncs"][f"{name} total_us"] = float(group["dur"].sum())
            kernels_only = trace[cats.isin(["kernel", "Kernel"]) & (trace["iteration"] >= 0)]
            out["step kernel_us"] = {str(int(i)): float(s) for i, s in kernels_only.groupby("iteration")["dur"].sum().items()}
        finally:
            logging.disable(logging.NOTSET)
    return out


def _direction(name: str) -> str:
    from stepscope.traces.schema import memcpy_direction

    return memcpy_direction(name)


def compare(path: Path) -> Agreement:
    """The points of one trace (HTA's failures to read it are recorded, not raised)."""
    try:
        raw = read_trace(path)
    except Exception as exc:  # noqa: BLE001 - e.g. an execution trace (not Kineto) in a folder of traces
        return Agreement(path.name, error=f"stepscope: {exc}"[:200])
    events = raw.table.to_pandas()
    fractional = bool(((events["ts_ns"] - raw.base_ns) % 1000 != 0).any() or (events["dur_ns"] % 1000 != 0).any())
    ours = _ours(events)
    base = raw.base_ns
    view = _ours(hta_view(events, fractional, base_ns=base), hta_view(events, fractional, breakdown=True, base_ns=base, streamed_syncs=_streamed_syncs(path)), HTA_LAUNCH_CALLS)
    # HTA's own view of the step kernels: by kernel category only (its iteration column).
    agreement = Agreement(path.name)
    try:
        theirs = _theirs(path)
    except Exception as exc:  # noqa: BLE001 - HTA's failure is a finding, not a crash
        agreement.error = f"{type(exc).__name__}: {exc}"[:200]
        return agreement
    for analysis, values in theirs.items():
        mine, seen = ours.get(analysis, {}), view.get(analysis, {})
        if analysis == "step kernel_us":  # HTA's per-iteration sums are of `kernel` rows only
            mine = _step_kernels(events)
            seen = _step_kernels(hta_view(events, fractional, base_ns=base), real_kernels_only=True)
        for key in sorted(set(values) | set(seen)):
            agreement.points.append(Point(analysis, key, float(mine.get(key, 0.0)), float(values.get(key, 0.0)), float(seen.get(key, 0.0))))
    return agreement


def _streamed_syncs(path: Path) -> frozenset[int]:
    """Correlation ids of the sync records whose raw `stream` is not -1 (read from the JSON)."""
    import gzip
    import json

    opener = gzip.open if path.name.endswith(".gz") else open
    with opener(path, "rt") as handle:
        trace = json.load(handle)
    events = trace.get("traceEvents", []) if isinstance(trace, dict) else trace
    return frozenset(
        int(e["args"]["correlation"]) for e in events if e.get("cat") == "cuda_sync" and e.get("args", {}).get("stream", -1) != -1 and "correlation" in e.get("args", {})
    )


def _step_kernels(events: pd.DataFrame, real_kernels_only: bool = False) -> dict[str, float]:
    frame = of_kind(events, "kernel")
    if real_kernels_only:
        frame = frame[frame["category"].astype(str).isin(["kernel", "Kernel"]).to_numpy()]
    if real_kernels_only:  # HTA gives an iteration to GPU work on streams > 0 only (ROCm's stream 0 has none)
        frame = frame[frame["stream"].to_numpy() > 0]
    frame = frame[frame["step"].to_numpy() >= 0]
    return {str(int(s)): d / 1000 for s, d in frame.groupby("step")["dur_ns"].sum().items()}


def summary(results: list[Agreement]) -> dict[str, Any]:
    counts: dict[str, int] = {}
    for result in results:
        counts[result.status] = counts.get(result.status, 0) + 1
    return {"traces": len(results), **counts, "points": sum(len(r.points) for r in results)}
