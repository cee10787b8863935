"""Allocator events (Kineto's `[memory]` instants, recorded with `profile_memory=True`): the
memory timeline per device, peak allocated and reserved per step with the operator,
annotation and module live at each peak, allocations that outlive their step, and the
operators that allocate most. Definitions in docs/traces.md ("Memory")."""

from __future__ import annotations

import numpy as np
import pandas as pd

from ..schema import MISSING
from .common import innermost, of_kind, user_annotations
from .steps import profiler_steps

# c10::DeviceType codes Kineto writes as "Device Type" (torch/c10/core/DeviceType.h).
DEVICE_TYPES = {0: "cpu", 1: "cuda", 6: "hip", 12: "xpu", 13: "mps", 15: "hpu", 19: "mtia"}
NO_OP = "(no op)"  # an allocation made outside every operator of its thread
MODULE_PREFIX = "nn.Module: "  # the python_function events torch names after modules (with_stack)

ALLOCATION_COLUMNS = ["ts_ns", "step", "device", "bytes", "total_allocated", "total_reserved", "addr", "pid", "tid"]
STEP_COLUMNS = [
    "step", "device", "allocations", "frees", "allocated_bytes", "freed_bytes", "start_allocated", "end_allocated",
    "peak_allocated", "peak_reserved", "reserved_at_peak", "peak_ts_ns", "peak_op", "peak_annotation", "peak_module",
]  # fmt: skip
GROWTH_COLUMNS = ["step", "device", "allocations", "allocated_bytes", "outliving", "outliving_bytes", "unfreed", "unfreed_bytes", "net_bytes"]
OP_COLUMNS = ["op", "allocations", "allocated_bytes", "frees", "freed_bytes", "self_bytes", "max_bytes", "outliving_bytes"]


def device_label(device_type: int, device_id: int) -> str:
    """cpu, cuda:0, ... from Kineto's Device Type and Device Id (old traces have only the
    id: -1 is the host, others are CUDA devices)."""
    if device_type == MISSING:
        return "cpu" if device_id < 0 else f"cuda:{device_id}"
    name = DEVICE_TYPES.get(int(device_type), f"device{int(device_type)}")
    return name if name == "cpu" else f"{name}:{max(int(device_id), 0)}"


def allocations(events: pd.DataFrame) -> pd.DataFrame:
    """The allocator events in time order (ALLOCATION_COLUMNS): bytes > 0 allocated, < 0
    freed; total_allocated / total_reserved are the device's totals after the event."""
    rows = of_kind(events, "memory")
    if rows.empty:
        return pd.DataFrame({c: pd.Series(dtype=object if c == "device" else np.int64) for c in ALLOCATION_COLUMNS})
    device_type = rows["device_type"].to_numpy() if "device_type" in rows.columns else np.full(len(rows), MISSING)
    device_id = rows["device"].to_numpy()
    pairs = pd.MultiIndex.from_arrays([device_type, device_id])
    labels = {(t, d): device_label(int(t), int(d)) for t, d in pairs.unique()}
    out = pd.DataFrame(
        {
            "ts_ns": rows["ts_ns"].to_numpy(),
            "step": rows["step"].to_numpy(),
            "device": [labels[(t, d)] for t, d in zip(device_type, device_id)],
            "bytes": rows["bytes"].to_numpy(),
            "total_allocated": rows["total_allocated"].to_numpy(),
            "total_reserved": rows["total_reserved"].to_numpy() if "total_reserved" in rows.columns else MISSING,
            "addr": rows["addr"].to_numpy() if "addr" in rows.columns else MISSING,
            "pid": rows["pid"].to_numpy(),
            "tid": rows["tid"].to_numpy(),
        }
    )
    return out.sort_values("ts_ns", kind="stable", ignore_index=True)


def _innermost_name(events: pd.DataFrame, intervals: pd.DataFrame, points: pd.DataFrame, default: str) -> np.ndarray:
    """For each point (ts_ns, pid, tid), the name of the innermost interval of its thread
    that holds it, else `default`. Intervals of one thread nest (operators, annotations)."""
    out = np.full(len(points), default, dtype=object)
    if intervals.empty or points.empty:
        return out
    names = intervals["name"].astype(str).to_numpy()
    starts, ends = intervals["ts_ns"].to_numpy(), (intervals["ts_ns"] + intervals["dur_ns"]).to_numpy()
    # One code per (pid, tid) over intervals and points together.
    pids = np.concatenate([intervals["pid"].to_numpy(), points["pid"].to_numpy()])
    tids = np.concatenate([intervals["tid"].to_numpy(), points["tid"].to_numpy()])
    codes, _ = pd.factorize(pd.MultiIndex.from_arrays([pids, tids]))
    threads, point_threads = codes[: len(intervals)], codes[len(intervals) :]
    times = points["ts_ns"].to_numpy()
    for thread in np.unique(point_threads):
        mine = np.flatnonzero(threads == thread)
        if mine.size == 0:
            continue
        at = np.flatnonzero(point_threads == thread)
        found = innermost(times[at], starts[mine], ends[mine])
        held = found >= 0
        out[at[held]] = names[mine[found[held]]]
    return out


def attribute(events: pd.DataFrame, points: pd.DataFrame) -> pd.DataFrame:
    """op, annotation and module live at each point (allocator rows): the innermost CPU
    operator, user annotation (not the step markers) and nn.Module of the point's thread."""
    ops = of_kind(events, "cpu_op")
    python = of_kind(events, "python")
    if not python.empty:
        python = python[python["name"].astype(str).str.startswith(MODULE_PREFIX).to_numpy()]
    return pd.DataFrame(
        {
            "op": _innermost_name(events, ops, points, NO_OP),
            "annotation": _innermost_name(events, user_annotations(events), points, ""),
            "module": [name[len(MODULE_PREFIX) :] if name else "" for name in _innermost_name(events, python, points, "")],
        },
        index=points.index,
    )


def memory_timeline(events: pd.DataFrame, max_points: int = 4000) -> pd.DataFrame:
    """Per device, total allocated and reserved after each allocator event (ts_ns, step,
    device, allocated, reserved). Over `max_points` per device, time is cut into
    max_points / 2 equal buckets and each keeps its lowest and highest point, so the peak
    and the troughs survive while the table stays bounded."""
    table = allocations(events)
    columns = ["ts_ns", "step", "device", "allocated", "reserved"]
    if table.empty:
        return pd.DataFrame(columns=columns)
    table = table.rename(columns={"total_allocated": "allocated", "total_reserved": "reserved"})
    frames = []
    for _, group in table.groupby("device", sort=True):
        if len(group) > max_points:
            times = group["ts_ns"].to_numpy()
            buckets = max(max_points // 2, 1)
            span = max(int(times[-1] - times[0]), 1)
            bucket = ((times - times[0]) * (buckets - 1)) // span
            allocated = group["allocated"].to_numpy()
            keep = np.zeros(len(group), dtype=bool)
            keyed = pd.Series(allocated).groupby(bucket)
            keep[keyed.idxmax().to_numpy()] = True
            keep[keyed.idxmin().to_numpy()] = True
            keep[[0, -1]] = True
            group = group.iloc[np.flatnonzero(keep)]
        frames.append(group[columns])
    return pd.concat(frames, ignore_index=True)


def memory_steps(events: pd.DataFrame) -> pd.DataFrame:
    """One row per (step, device): allocator events, bytes allocated and freed, the total
    allocated before the step's first event and after its last, the peak allocated (the
    highest total after any event of the step) and reserved, the reserved total at the
    peak, and the operator, annotation and module live at the peak."""
    table = allocations(events)
    if table.empty:
        return pd.DataFrame(columns=STEP_COLUMNS)
    rows = []
    for (step, device), group in table.groupby(["step", "device"], sort=True):
        sizes = group["bytes"].to_numpy()
        allocated = group["total_allocated"].to_numpy()
        peak = int(np.argmax(allocated))
        rows.append(
            {
                "step": int(step),
                "device": device,
                "allocations": int((sizes > 0).sum()),
                "frees": int((sizes < 0).sum()),
                "allocated_bytes": int(sizes[sizes > 0].sum()),
                "freed_bytes": int(-sizes[sizes < 0].sum()),
                "start_allocated": int(allocated[0] - sizes[0]),
                "end_allocated": int(allocated[-1]),
                "peak_allocated": int(allocated[peak]),
                "peak_reserved": int(group["total_reserved"].max()),
                "reserved_at_peak": int(group["total_reserved"].iloc[peak]),
                "peak_ts_ns": int(group["ts_ns"].iloc[peak]),
                "_peak_index": group.index[peak],
            }
        )
    out = pd.DataFrame(rows)
    where = attribute(events, table.loc[out["_peak_index"].to_numpy()])
    out["peak_op"] = where["op"].to_numpy()
    out["peak_annotation"] = where["annotation"].to_numpy()
    out["peak_module"] = where["module"].to_numpy()
    return out[STEP_COLUMNS]


def lifetimes(events: pd.DataFrame) -> pd.DataFrame:
    """One row per allocation: its time, step, device, bytes, op, and when (free_ts_ns,
    free_step) the same address of the same device was next freed, -1 when not in the
    trace. A free whose allocation came before the trace began pairs with nothing."""
    table = allocations(events)
    columns = ["ts_ns", "step", "device", "addr", "bytes", "op", "free_ts_ns", "free_step"]
    if table.empty:
        return pd.DataFrame(columns=columns)
    order = table.sort_values(["device", "addr", "ts_ns"], kind="stable").index.to_numpy()
    ordered = table.loc[order]
    sizes = ordered["bytes"].to_numpy()
    same = np.zeros(len(ordered), dtype=bool)
    same[:-1] = (ordered["device"].to_numpy()[1:] == ordered["device"].to_numpy()[:-1]) & (ordered["addr"].to_numpy()[1:] == ordered["addr"].to_numpy()[:-1])
    freed_next = np.zeros(len(ordered), dtype=bool)
    freed_next[:-1] = same[:-1] & (sizes[1:] < 0)
    is_alloc = sizes > 0
    next_ts = np.append(ordered["ts_ns"].to_numpy()[1:], MISSING)
    next_step = np.append(ordered["step"].to_numpy()[1:], MISSING)
    paired = is_alloc & freed_next
    allocs = ordered[is_alloc]
    out = allocs[["ts_ns", "step", "device", "addr", "bytes"]].copy()
    out["op"] = attribute(events, allocs)["op"].to_numpy()
    out["free_ts_ns"] = np.where(paired[is_alloc], next_ts[is_alloc], MISSING)
    out["free_step"] = np.where(paired[is_alloc], next_step[is_alloc], MISSING)
    return out.sort_values("ts_ns", kind="stable", ignore_index=True)[columns]


def memory_growth(events: pd.DataFrame) -> pd.DataFrame:
    """Per (step, device): allocations made in the step, how many of them (and bytes)
    outlive it (freed in a later step or not at all in the trace), how many are never
    freed in the trace, and the step's net change of the total allocated. A job whose
    steps each leave bytes behind grows until it runs out of memory."""
    life = lifetimes(events)
    if life.empty:
        return pd.DataFrame(columns=GROWTH_COLUMNS)
    ends = _step_ends(events)
    step_end = life["step"].map(ends).fillna(np.iinfo(np.int64).max).to_numpy(dtype=np.int64)
    freed = life["free_ts_ns"].to_numpy()
    unfreed = freed == MISSING
    outliving = unfreed | (freed >= step_end)
    frame = life.assign(outliving=outliving, unfreed=unfreed, outliving_bytes=np.where(outliving, life["bytes"], 0), unfreed_bytes=np.where(unfreed, life["bytes"], 0))
    out = (
        frame.groupby(["step", "device"], sort=True)
        .agg(
            allocations=("bytes", "size"),
            allocated_bytes=("bytes", "sum"),
            outliving=("outliving", "sum"),
            outliving_bytes=("outliving_bytes", "sum"),
            unfreed=("unfreed", "sum"),
            unfreed_bytes=("unfreed_bytes", "sum"),
        )
        .reset_index()
    )
    net = memory_steps(events).set_index(["step", "device"])
    delta = (net["end_allocated"] - net["start_allocated"]).rename("net_bytes")
    out = out.join(delta, on=["step", "device"])
    out["net_bytes"] = out["net_bytes"].fillna(0).astype(np.int64)
    return out[GROWTH_COLUMNS]


def _step_ends(events: pd.DataFrame) -> dict[int, int]:
    steps = profiler_steps(events)
    return {int(s): int(t + d) for s, t, d in zip(steps["step"], steps["ts_ns"], steps["dur_ns"])}


def top_allocating_ops(events: pd.DataFrame, k: int | None = 20) -> pd.DataFrame:
    """Per operator (the innermost CPU op around each allocator event, NO_OP outside every
    op): allocations and bytes, frees and bytes, self_bytes = allocated - freed (what
    torch's `key_averages()` calls self memory usage), the largest allocation, and the bytes
    of its allocations that outlive their step. Sorted by bytes allocated."""
    table = allocations(events)
    if table.empty:
        return pd.DataFrame(columns=OP_COLUMNS)
    table["op"] = attribute(events, table)["op"].to_numpy()
    sizes = table["bytes"].to_numpy()
    table["alloc"] = np.where(sizes > 0, sizes, 0)
    table["free"] = np.where(sizes < 0, -sizes, 0)
    table["is_alloc"] = sizes > 0
    table["is_free"] = sizes < 0
    out = (
        table.groupby("op", sort=False)
        .agg(allocations=("is_alloc", "sum"), allocated_bytes=("alloc", "sum"), frees=("is_free", "sum"), freed_bytes=("free", "sum"), max_bytes=("alloc", "max"))
        .reset_index()
    )
    out["self_bytes"] = out["allocated_bytes"] - out["freed_bytes"]
    growth = lifetimes(events)
    if not growth.empty:
        ends = _step_ends(events)
        step_end = growth["step"].map(ends).fillna(np.iinfo(np.int64).max).to_numpy(dtype=np.int64)
        freed = growth["free_ts_ns"].to_numpy()
        outliving = (freed == MISSING) | (freed >= step_end)
        by_op = pd.Series(np.where(outliving, growth["bytes"], 0)).groupby(growth["op"].to_numpy()).sum()
        out["outliving_bytes"] = out["op"].map(by_op).fillna(0).astype(np.int64)
    else:
        out["outliving_bytes"] = 0
    for column in ("allocations", "frees"):
        out[column] = out[column].astype(np.int64)
    out = out.sort_values(["allocated_bytes", "op"], ascending=[False, True], ignore_index=True)[OP_COLUMNS]
    return out if k is None else out.head(k)


def peak_breakdown(events: pd.DataFrame, device: str | None = None) -> pd.DataFrame:
    """What was live at the trace's highest peak (of `device`, else of the device with the
    highest peak): the allocations made before the peak and not freed by then, by operator
    (op, allocations, bytes), largest first. Allocations made before the trace began are
    not in it: their bytes are the row `(before the trace)`."""
    table = allocations(events)
    columns = ["op", "allocations", "bytes"]
    if table.empty:
        return pd.DataFrame(columns=columns)
    if device is None:
        device = str(table.loc[table["total_allocated"].idxmax(), "device"])
    table = table[table["device"] == device]
    if table.empty:
        return pd.DataFrame(columns=columns)
    peak_row = table["total_allocated"].idxmax()
    peak_ts, peak_total = int(table.loc[peak_row, "ts_ns"]), int(table.loc[peak_row, "total_allocated"])
    life = lifetimes(events)
    life = life[life["device"] == device]
    # Live at the peak: allocated at or before it (the peak's own event included) and freed after.
    live = life[(life["ts_ns"] <= peak_ts) & ((life["free_ts_ns"] == MISSING) | (life["free_ts_ns"] > peak_ts))]
    out = live.groupby("op", sort=False).agg(allocations=("bytes", "size"), bytes=("bytes", "sum")).reset_index()
    out = out.sort_values(["bytes", "op"], ascending=[False, True], ignore_index=True)
    before = peak_total - int(live["bytes"].sum())
    if before > 0:
        out = pd.concat([out, pd.DataFrame([{"op": "(before the trace)", "allocations": 0, "bytes": before}])], ignore_index=True)
    return out[columns]


def rank_peaks(per_rank: dict[int, pd.DataFrame]) -> pd.DataFrame:
    """Per rank and device: the highest peak allocated and reserved over the rank's
    profiled steps, the step it came in, and the rank's ratio to the median rank's peak."""
    rows = []
    for rank, steps in per_rank.items():
        if steps.empty:
            continue
        for device, group in steps.groupby("device", sort=True):
            top = group.loc[group["peak_allocated"].idxmax()]
            rows.append({"rank": rank, "device": device, "step": int(top["step"]), "peak_allocated": int(top["peak_allocated"]), "peak_reserved": int(group["peak_reserved"].max())})
    columns = ["rank", "device", "step", "peak_allocated", "peak_reserved", "vs_median"]
    if not rows:
        return pd.DataFrame(columns=columns)
    out = pd.DataFrame(rows)
    # Ranks are compared on the same kind of device (cuda:3 of rank 3 with cuda:0 of rank 0).
    kind = out["device"].str.split(":").str[0]
    median = out.groupby(kind)["peak_allocated"].transform("median")
    out["vs_median"] = np.where(median > 0, out["peak_allocated"] / median.where(median > 0, 1), np.nan)
    return out.sort_values(["device", "rank"], ignore_index=True)[columns]
