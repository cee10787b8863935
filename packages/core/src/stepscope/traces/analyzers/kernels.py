"""Kernel statistics: count, total, mean, p50, p95, max per kernel, with the precision class
read from the name; grouped further by stream, step or annotation; top-k by time or launches."""

from __future__ import annotations

import numpy as np
import pandas as pd

from ..schema import precision_class
from .common import STAT_COLUMNS, duration_stats, innermost, launch_start_of, of_kind, user_annotations

GROUPINGS = ("name", "stream", "step", "annotation", "precision")


def kernel_stats(events: pd.DataFrame, by: str = "name") -> pd.DataFrame:
    """One row per kernel name (and `by` group when it is not "name"); times in µs."""
    if by not in GROUPINGS:
        raise ValueError(f"by must be one of {', '.join(GROUPINGS)}, got {by!r}")
    kernels = with_annotation(events, of_kind(events, "kernel")) if by == "annotation" else of_kind(events, "kernel")
    if by == "precision":
        kernels = kernels.assign(precision=precisions(kernels["name"]))
        return duration_stats(kernels, ["precision"]).sort_values("total_us", ascending=False, ignore_index=True)
    keys = ["name"] if by == "name" else [by, "name"]
    out = duration_stats(kernels, keys)
    out.insert(len(keys), "precision", precisions(out["name"]))
    out["name"] = out["name"].astype(str)
    return out.sort_values([*keys[:-1], "total_us"], ascending=[True] * (len(keys) - 1) + [False], ignore_index=True)


def top_kernels(events: pd.DataFrame, k: int = 10, by: str = "time") -> pd.DataFrame:
    """The k kernels with the most total time (`by="time"`) or launches (`by="launches"`),
    with their share of all kernel time."""
    if by not in ("time", "launches"):
        raise ValueError(f"by must be 'time' or 'launches', got {by!r}")
    stats = kernel_stats(events)
    total = stats["total_us"].sum()
    stats["time_share"] = stats["total_us"] / total if total else 0.0
    column = "total_us" if by == "time" else "count"
    return stats.sort_values(column, ascending=False, ignore_index=True).head(k)


def precisions(names: pd.Series) -> pd.Series:
    """Precision class per row, computed once per distinct name."""
    values = names.astype("category") if not isinstance(names.dtype, pd.CategoricalDtype) else names
    labels = [precision_class(str(n)) for n in values.cat.categories]
    codes = values.cat.codes.to_numpy()
    return pd.Series(np.asarray(labels, dtype=object)[codes] if labels else np.array([], dtype=object), index=names.index)


def with_annotation(events: pd.DataFrame, gpu: pd.DataFrame) -> pd.DataFrame:
    """GPU rows with the innermost user annotation around the host call that launched them."""
    annotations = user_annotations(events)
    launch = launch_start_of(events, gpu)
    points = np.where(launch >= 0, launch, gpu["ts_ns"].to_numpy())
    starts = annotations["ts_ns"].to_numpy()
    index = innermost(points, starts, starts + annotations["dur_ns"].to_numpy())
    names = np.asarray(annotations["name"].astype(str).to_numpy(), dtype=object)
    label = np.where(index >= 0, names[np.maximum(index, 0)] if names.size else "", "(none)")
    return gpu.assign(annotation=label)


__all__ = ["kernel_stats", "top_kernels", "precisions", "with_annotation", "STAT_COLUMNS"]
