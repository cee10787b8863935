"""CPU<->GPU memory operations: H2D / D2H / D2D / memset counts, bytes, time and bandwidth,
and whether the host memory was pinned or pageable where Kineto's activity name says so."""

from __future__ import annotations

import numpy as np
import pandas as pd

from ..schema import memcpy_direction, memcpy_host_memory
from .common import of_kind


def memory_ops(events: pd.DataFrame) -> pd.DataFrame:
    """One row per (direction, host memory): count, bytes, total_us, bandwidth_gbps."""
    ops = of_kind(events, "memcpy", "memset")
    columns = ["direction", "host_memory", "count", "bytes", "total_us", "bandwidth_gbps"]
    if ops.empty:
        return pd.DataFrame(columns=columns)
    names = ops["name"].astype("category")
    categories = [str(c) for c in names.cat.categories]
    codes = names.cat.codes.to_numpy()
    direction = np.asarray([memcpy_direction(c) for c in categories], dtype=object)[codes]
    host = np.asarray([memcpy_host_memory(c) for c in categories], dtype=object)[codes]
    frame = pd.DataFrame({"direction": direction, "host_memory": host, "bytes": np.maximum(ops["bytes"].to_numpy(), 0), "dur_ns": ops["dur_ns"].to_numpy()})
    out = frame.groupby(["direction", "host_memory"], sort=True).agg(count=("bytes", "size"), bytes=("bytes", "sum"), total_ns=("dur_ns", "sum")).reset_index()
    out["total_us"] = out["total_ns"] / 1000.0
    # bytes per nanosecond is GB/s.
    out["bandwidth_gbps"] = np.where(out["total_ns"] > 0, out["bytes"] / out["total_ns"].where(out["total_ns"] > 0, 1), np.nan)
    return out[columns]
