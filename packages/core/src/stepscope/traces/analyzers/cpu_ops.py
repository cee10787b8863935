"""Top CPU operators by inclusive time (an operator's time includes the operators it calls)."""

from __future__ import annotations

import pandas as pd

from .common import duration_stats, of_kind


def cpu_op_stats(events: pd.DataFrame, k: int | None = 20) -> pd.DataFrame:
    ops = of_kind(events, "cpu_op")
    out = duration_stats(ops, ["name"])
    out["name"] = out["name"].astype(str)
    out = out.sort_values("total_us", ascending=False, ignore_index=True)
    return out.head(k) if k else out
