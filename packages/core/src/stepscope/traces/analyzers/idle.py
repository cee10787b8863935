"""GPU busy and idle time. The temporal breakdown (HTA's): over the span from the first GPU
activity's start to the last one's end, idle = span - union of all GPU activity; compute =
union of computation kernels (not memcpy/memset, not NCCL); non-compute = the rest of the
busy time. The idle breakdown (HTA's, per stream): each gap between consecutive activities
on a stream is host wait when the next activity's launch call started after the previous
activity ended (the CPU was late), kernel wait when it is shorter than `kernel_wait_us`
(back-to-back launch overhead), other otherwise."""

from __future__ import annotations

import numpy as np
import pandas as pd

from ..schema import BEFORE_FIRST_STEP, KIND_CODE, is_communication
from .common import launch_start_of, of_kind, sort_order, union_ns

KERNEL_WAIT_US = 30.0  # HTA's consecutive_kernel_delay (HTA's docs say ns; it compares µs)
BREAKDOWN_COLUMNS = ["span_us", "busy_us", "idle_us", "compute_us", "non_compute_us", "idle_pct", "compute_pct", "non_compute_pct"]


def _is_compute(gpu: pd.DataFrame) -> np.ndarray:
    kernels = gpu["kind"].to_numpy() == KIND_CODE["kernel"]
    names = gpu["name"].astype("category")
    nccl = np.asarray([is_communication(str(c)) for c in names.cat.categories], dtype=bool)
    return kernels & ~(nccl[names.cat.codes.to_numpy()] if nccl.size else np.zeros(len(gpu), dtype=bool))


def _breakdown(gpu: pd.DataFrame) -> dict[str, float]:
    start = gpu["ts_ns"].to_numpy()
    end = start + gpu["dur_ns"].to_numpy()
    if start.size == 0:
        return dict.fromkeys(BREAKDOWN_COLUMNS, 0.0)
    span = int(end.max() - start.min())
    order = np.argsort(start, kind="stable")  # one sort serves both unions
    compute_mask = _is_compute(gpu)[order]
    start, end = start[order], end[order]
    busy = union_ns(start, end, presorted=True)
    compute = union_ns(start[compute_mask], end[compute_mask], presorted=True)
    row = {"span_us": span / 1000, "busy_us": busy / 1000, "idle_us": (span - busy) / 1000, "compute_us": compute / 1000, "non_compute_us": (busy - compute) / 1000}
    for name in ("idle", "compute", "non_compute"):
        row[f"{name}_pct"] = 100.0 * row[f"{name}_us"] / row["span_us"] if span else 0.0
    return row


def temporal_breakdown(events: pd.DataFrame, per_step: bool = False) -> pd.DataFrame:
    """One row (or one per step): span, busy, idle, compute, non-compute time and shares."""
    gpu = of_kind(events, "kernel", "memcpy", "memset")
    if gpu.empty:  # a CPU-only trace
        return pd.DataFrame(columns=["step", *BREAKDOWN_COLUMNS] if per_step else BREAKDOWN_COLUMNS)
    if not per_step:
        return pd.DataFrame([_breakdown(gpu)], columns=BREAKDOWN_COLUMNS)
    rows = []
    for step, group in gpu.groupby("step", sort=True):
        if step < 0 and step != BEFORE_FIRST_STEP:  # outside the profiled steps (no launch to go by)
            continue
        rows.append({"step": int(step), **_breakdown(group)})
    return pd.DataFrame(rows, columns=["step", *BREAKDOWN_COLUMNS])


ACTIVE_COLUMNS = ["span_us", "kernel_us", "memory_us", "sync_us", "idle_us"]


def _active(kernels: pd.DataFrame, memory: pd.DataFrame, sync: pd.DataFrame) -> dict[str, float]:
    # Each instant of the span counts once, for the first of kernel > memcpy/memset > sync
    # that covers it, so the four parts add up to the span (a pie, as SageMaker's dashboard).
    def bounds(*frames: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
        start = np.concatenate([f["ts_ns"].to_numpy(np.int64) for f in frames])
        return start, start + np.concatenate([f["dur_ns"].to_numpy(np.int64) for f in frames])

    k = union_ns(*bounds(kernels))
    km = union_ns(*bounds(kernels, memory))
    kms_start, kms_end = bounds(kernels, memory, sync)
    if kms_start.size == 0:
        return dict.fromkeys(ACTIVE_COLUMNS, 0.0)
    kms = union_ns(kms_start, kms_end)
    span = int(kms_end.max() - kms_start.min())
    return {"span_us": span / 1000, "kernel_us": k / 1000, "memory_us": (km - k) / 1000, "sync_us": (kms - km) / 1000, "idle_us": (span - kms) / 1000}


def active_time(events: pd.DataFrame, per_step: bool = False) -> pd.DataFrame:
    """GPU time split into kernels, memory operations (memcpy/memset), sync (GPU-side
    synchronization records: stream waits, event syncs) and idle, over the span from the first
    GPU activity to the last; the four parts add up to the span."""
    kernels, memory = of_kind(events, "kernel"), of_kind(events, "memcpy", "memset")
    sync = of_kind(events, "gpu_sync")  # GPU-side records (any stream, -1 for event/context syncs)
    if not per_step:
        return pd.DataFrame([_active(kernels, memory, sync)], columns=ACTIVE_COLUMNS)
    rows = []
    steps = sorted({int(s) for frame in (kernels, memory, sync) for s in frame["step"].unique() if s >= 0 or s == BEFORE_FIRST_STEP})
    for step in steps:
        pick = [frame[frame["step"].to_numpy() == step] for frame in (kernels, memory, sync)]
        rows.append({"step": step, **_active(*pick)})
    return pd.DataFrame(rows, columns=["step", *ACTIVE_COLUMNS])


def idle_breakdown(events: pd.DataFrame, kernel_wait_us: float = KERNEL_WAIT_US, per_step: bool = False) -> pd.DataFrame:
    """Idle time per stream (and step) split into host_wait, kernel_wait and other (µs)."""
    gpu = of_kind(events, "kernel", "memcpy", "memset")
    keys = ["stream", "step"] if per_step else ["stream"]
    columns = [*keys, "host_wait_us", "kernel_wait_us", "other_us", "idle_us"]
    if gpu.empty:
        return pd.DataFrame(columns=columns)
    launch = launch_start_of(events, gpu)
    stream = gpu["stream"].to_numpy()
    start = gpu["ts_ns"].to_numpy()
    order = sort_order(stream, start)
    stream, start, launch = stream[order], start[order], launch[order]
    end = start + gpu["dur_ns"].to_numpy()[order]
    step = gpu["step"].to_numpy()[order]
    # Gaps between consecutive activities of one stream; each belongs to the later activity.
    same = np.zeros(stream.size, dtype=bool)
    same[1:] = stream[1:] == stream[:-1]
    previous_end = np.empty_like(end)
    previous_end[0] = 0
    previous_end[1:] = end[:-1]
    gap = start - previous_end
    host_wait = (launch >= 0) & (launch > previous_end)  # unknown launch: not host wait, as in HTA
    kernel_wait = ~host_wait & (gap < kernel_wait_us * 1000)
    category = np.where(host_wait, 0, np.where(kernel_wait, 1, 2))[same]
    gap = gap[same]
    # One group code per (stream[, step]) from one 64-bit key (both are int32), then a
    # weighted bincount per category.
    stream = stream[same].astype(np.int64)
    key = (stream << 32) | (step[same].astype(np.int64) & 0xFFFFFFFF) if per_step else stream
    if per_step:
        unique, group = np.unique(key, return_inverse=True)
    else:  # sorted by stream already: groups start where the stream changes
        new_group = np.concatenate(([True], key[1:] != key[:-1])) if key.size else np.zeros(0, dtype=bool)
        unique, group = key[new_group], np.cumsum(new_group) - 1
    out = pd.DataFrame({"stream": (unique >> 32 if per_step else unique).astype(np.int32)})
    if per_step:
        out["step"] = (unique & 0xFFFFFFFF).astype(np.uint32).astype(np.int32)
    groups = len(out)
    for code, name in enumerate(("host_wait_us", "kernel_wait_us", "other_us")):
        pick = category == code
        out[name] = np.bincount(group[pick], weights=gap[pick], minlength=groups) / 1000.0
    out["idle_us"] = out["host_wait_us"] + out["kernel_wait_us"] + out["other_us"]
    return out[columns]
