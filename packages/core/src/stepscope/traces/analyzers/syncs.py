"""Synchronizations: time the host spent in device/stream/event synchronize calls, and what
it waited for: the GPU work that was still running when the call began and the last GPU
activity to finish before it returned."""

from __future__ import annotations

import numpy as np
import pandas as pd

from .common import of_kind


def sync_events(events: pd.DataFrame) -> pd.DataFrame:
    """One row per host sync call: name, step, start, duration, gpu_wait_ns (how much of
    the call overlapped GPU work still to finish), waited_for (the last GPU activity that
    finished inside the call)."""
    syncs = of_kind(events, "sync")  # host calls only: GPU-side records are `gpu_sync` rows
    gpu = of_kind(events, "kernel", "memcpy", "memset")
    start = syncs["ts_ns"].to_numpy()
    end = start + syncs["dur_ns"].to_numpy()
    gpu_end = gpu["ts_ns"].to_numpy() + gpu["dur_ns"].to_numpy()
    order = np.argsort(gpu_end, kind="stable")
    sorted_end = gpu_end[order]
    last = np.searchsorted(sorted_end, end, side="right") - 1
    found = last >= 0
    last_end = np.where(found, sorted_end[np.maximum(last, 0)] if sorted_end.size else 0, 0)
    inside = found & (last_end > start)
    gpu_names = np.asarray(gpu["name"].astype(str).to_numpy(), dtype=object)
    waited_for = np.where(inside, gpu_names[order][np.maximum(last, 0)] if gpu_names.size else "", "")
    return pd.DataFrame(
        {
            "name": syncs["name"].astype(str).to_numpy(),
            "step": syncs["step"].to_numpy(),
            "ts_ns": start,
            "dur_ns": end - start,
            "gpu_wait_ns": np.where(inside, np.minimum(last_end, end) - start, 0),
            "waited_for": waited_for,
        }
    )


def sync_stats(events: pd.DataFrame) -> pd.DataFrame:
    """Per sync call: count, total_us, mean_us, max_us, gpu_wait_us, and the GPU activity it
    most often waited for."""
    rows = sync_events(events)
    columns = ["name", "count", "total_us", "mean_us", "max_us", "gpu_wait_us", "waited_for"]
    if rows.empty:
        return pd.DataFrame(columns=columns)
    grouped = rows.groupby("name", sort=False)
    out = grouped.agg(count=("dur_ns", "size"), total=("dur_ns", "sum"), mean=("dur_ns", "mean"), max=("dur_ns", "max"), wait=("gpu_wait_ns", "sum"))
    out["waited_for"] = grouped["waited_for"].agg(lambda s: s[s != ""].mode().iloc[0] if (s != "").any() else "")
    out = out.reset_index()
    for column in ("total", "mean", "max", "wait"):
        out[column] = out[column] / 1000.0
    out = out.rename(columns={"total": "total_us", "mean": "mean_us", "max": "max_us", "wait": "gpu_wait_us"})
    return out[columns].sort_values("total_us", ascending=False, ignore_index=True)
