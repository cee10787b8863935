"""Launch-to-run latency: each GPU activity joined with the runtime call that launched it
by correlation id. Delay (HTA's definition) = gpu.ts - (runtime.ts + runtime.dur), clipped
at 0: how long the work waited after the host call returned."""

from __future__ import annotations

import numpy as np
import pandas as pd

from .common import duration_stats, of_kind

OUTLIER_US = 100.0  # HTA's default launch_delay_cutoff


def launches(events: pd.DataFrame) -> pd.DataFrame:
    """One row per GPU activity with a known launch: name, kind, stream, step, launch call,
    launch start/end, GPU start, delay (ns)."""
    gpu = of_kind(events, "kernel", "memcpy", "memset")
    gpu = gpu[gpu["correlation"].to_numpy() >= 0]
    runtime = of_kind(events, "runtime", "sync")
    runtime = runtime[runtime["correlation"].to_numpy() >= 0]
    runtime = runtime.drop_duplicates("correlation")
    joined = gpu[["name", "kind", "stream", "step", "ts_ns", "dur_ns", "correlation"]].merge(
        runtime[["correlation", "name", "ts_ns", "dur_ns"]].rename(columns={"name": "launch_call", "ts_ns": "launch_ts_ns", "dur_ns": "launch_dur_ns"}),
        on="correlation",
        how="inner",
    )
    launch_end = joined["launch_ts_ns"].to_numpy() + joined["launch_dur_ns"].to_numpy()
    joined["delay_ns"] = np.maximum(joined["ts_ns"].to_numpy() - launch_end, 0)
    return joined


def launch_latency(events: pd.DataFrame, outlier_us: float = OUTLIER_US) -> pd.DataFrame:
    """Per kernel: launches, delay mean/p50/p95/max (µs) and how many exceeded `outlier_us`."""
    rows = launches(events)
    rows = rows[rows["kind"].to_numpy() == 0]
    out = duration_stats(rows, ["name"], value="delay_ns").rename(
        columns={"total_us": "total_delay_us", "mean_us": "mean_delay_us", "p50_us": "p50_delay_us", "p95_us": "p95_delay_us", "max_us": "max_delay_us", "count": "launches"}
    )
    if rows.empty:
        out["outliers"] = pd.Series(dtype=np.int64)
        return out
    outliers = rows[rows["delay_ns"].to_numpy() > outlier_us * 1000].groupby("name", observed=True).size()
    out["outliers"] = out["name"].map(outliers).fillna(0).astype(np.int64)
    out["name"] = out["name"].astype(str)
    return out.sort_values("total_delay_us", ascending=False, ignore_index=True)
