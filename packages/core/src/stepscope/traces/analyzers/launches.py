"""Launch-to-run latency: each GPU activity joined with the runtime call that launched it
by correlation id. Delay (HTA's definition) = gpu.ts - (runtime.ts + runtime.dur), clipped
at 0: how long the work waited after the host call returned."""

from __future__ import annotations

import numpy as np
import pandas as pd

from .common import duration_stats, launch_lookup, of_kind

OUTLIER_US = 100.0  # HTA's default launch_delay_cutoff


def launches(events: pd.DataFrame) -> pd.DataFrame:
    """One row per GPU activity with a known launch: name, kind, stream, step, launch call,
    launch start/end, GPU start, delay (ns)."""
    gpu = of_kind(events, "kernel", "memcpy", "memset")
    calls, position = launch_lookup(events, gpu["correlation"].to_numpy())
    rows = np.flatnonzero(position >= 0)
    call = position[rows]
    out = pd.DataFrame({name: _take(gpu[name], rows) for name in ("name", "kind", "stream", "step", "ts_ns", "dur_ns", "correlation")})
    out["launch_call"] = _take(calls["name"], call)
    out["launch_ts_ns"] = calls["ts_ns"].to_numpy()[call]
    out["launch_dur_ns"] = calls["dur_ns"].to_numpy()[call]
    launch_end = out["launch_ts_ns"].to_numpy() + out["launch_dur_ns"].to_numpy()
    out["delay_ns"] = np.maximum(out["ts_ns"].to_numpy() - launch_end, 0)
    return out


def _take(column: pd.Series, rows: np.ndarray) -> pd.Series:
    return column.take(rows).reset_index(drop=True)


def launch_latency(events: pd.DataFrame, outlier_us: float = OUTLIER_US) -> pd.DataFrame:
    """Per kernel: launches, delay mean/p50/p95/max (µs) and how many exceeded `outlier_us`."""
    kernels = of_kind(events, "kernel")
    calls, position = launch_lookup(events, kernels["correlation"].to_numpy())
    rows = np.flatnonzero(position >= 0)
    call = position[rows]
    launch_end = calls["ts_ns"].to_numpy()[call] + calls["dur_ns"].to_numpy()[call]
    delays = pd.DataFrame({"name": _take(kernels["name"], rows), "delay_ns": np.maximum(kernels["ts_ns"].to_numpy()[rows] - launch_end, 0)})
    out = duration_stats(delays, ["name"], value="delay_ns").rename(
        columns={"total_us": "total_delay_us", "mean_us": "mean_delay_us", "p50_us": "p50_delay_us", "p95_us": "p95_delay_us", "max_us": "max_delay_us", "count": "launches"}
    )
    if delays.empty:
        out["outliers"] = pd.Series(dtype=np.int64)
        return out
    late = delays["delay_ns"].to_numpy() > outlier_us * 1000
    outliers = delays["name"][late].value_counts()
    out["outliers"] = out["name"].map(outliers).fillna(0).astype(np.int64)
    out["name"] = out["name"].astype(str)
    return out.sort_values("total_delay_us", ascending=False, ignore_index=True)
