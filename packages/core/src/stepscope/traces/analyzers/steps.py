"""Per-step breakdown (profiler steps joined with the step timeline's data / forward /
backward / optimizer phases) and the multi-rank view: per-rank step time and kernel time
side by side, and the slowest rank of each step (stragglers)."""

from __future__ import annotations

import numpy as np
import pandas as pd

from ..schema import BEFORE_FIRST_STEP, STEP_NAME_RE
from .common import of_kind, union_ns

PHASES = ("data", "forward", "backward", "optimizer")


def profiler_steps(events: pd.DataFrame) -> pd.DataFrame:
    """The ProfilerStep#N intervals: step, ts_ns, dur_ns."""
    annotations = of_kind(events, "annotation", "cpu_op")
    names = annotations["name"].astype(str)
    steps = annotations[names.str.match(STEP_NAME_RE.pattern).to_numpy()]
    numbers = steps["name"].astype(str).str.extract(STEP_NAME_RE.pattern)[0].astype(np.int64)
    return pd.DataFrame({"step": numbers.to_numpy(), "ts_ns": steps["ts_ns"].to_numpy(), "dur_ns": steps["dur_ns"].to_numpy()}).sort_values("step", ignore_index=True)


def step_breakdown(events: pd.DataFrame, timeline: pd.DataFrame | None = None, rank: int = 0) -> pd.DataFrame:
    """One row per profiled step: step_us, kernel_us (sum), gpu_busy_us (union), memcpy_us,
    sync_us (host time in syncs), cpu_op_us (top-level host ops), and, where the step
    timeline has them, the data / forward / backward / optimizer phase times (µs)."""
    steps = profiler_steps(events)
    rows = []
    gpu = of_kind(events, "kernel", "memcpy", "memset")
    by_step = {int(step): group for step, group in gpu.groupby("step", sort=False)}
    sync_time = of_kind(events, "sync").groupby("step")["dur_ns"].sum()
    for step, dur in zip(steps["step"].to_numpy(), steps["dur_ns"].to_numpy()):
        group = by_step.get(int(step))
        kernel_us = memcpy_us = busy_us = 0.0
        if group is not None:
            kinds = group["kind"].to_numpy()
            durations = group["dur_ns"].to_numpy()
            kernel_us = durations[kinds == 0].sum() / 1000
            memcpy_us = durations[kinds != 0].sum() / 1000
            start = group["ts_ns"].to_numpy()
            busy_us = union_ns(start, start + durations) / 1000
        rows.append({"step": int(step), "step_us": dur / 1000, "kernel_us": kernel_us, "gpu_busy_us": busy_us, "memcpy_us": memcpy_us, "sync_us": sync_time.get(step, 0) / 1000})
    early = by_step.get(BEFORE_FIRST_STEP)
    if early is not None:  # GPU work launched before the window: its own row, no step time
        kinds, durations = early["kind"].to_numpy(), early["dur_ns"].to_numpy()
        start = early["ts_ns"].to_numpy()
        rows.insert(0, {"step": BEFORE_FIRST_STEP, "step_us": np.nan, "kernel_us": durations[kinds == 0].sum() / 1000, "gpu_busy_us": union_ns(start, start + durations) / 1000,
                        "memcpy_us": durations[kinds != 0].sum() / 1000, "sync_us": 0.0})
    out = pd.DataFrame(rows, columns=["step", "step_us", "kernel_us", "gpu_busy_us", "memcpy_us", "sync_us"])
    out["gpu_idle_us"] = (out["step_us"] - out["gpu_busy_us"]).clip(lower=0)
    if gpu.empty:  # a CPU-only trace: no GPU time to speak of
        out[["kernel_us", "gpu_busy_us", "memcpy_us", "gpu_idle_us"]] = np.nan
    if timeline is not None and not timeline.empty:
        out = out.merge(_phases(timeline, rank), on="step", how="left")
    return out


def _phases(timeline: pd.DataFrame, rank: int) -> pd.DataFrame:
    frame = timeline
    if "rank" in frame.columns and (frame["rank"] == rank).any():
        frame = frame[frame["rank"] == rank]
    if "mode" in frame.columns:
        frame = frame[frame["mode"].astype(str) == "TRAIN"]
    frame = frame[frame["phase"].isin(PHASES)]
    if frame.empty:
        return pd.DataFrame(columns=["step", *(f"{p}_us" for p in PHASES)])
    pivot = frame.pivot_table(index="step", columns="phase", values="duration_ms", aggfunc="sum") * 1000.0
    pivot = pivot.reindex(columns=list(PHASES)).add_suffix("_us")
    pivot.columns.name = None
    return pivot.reset_index()


def rank_comparison(per_rank: dict[int, pd.DataFrame]) -> pd.DataFrame:
    """Per step and rank: step_us, kernel_us, the gap to the step's median rank, and whether
    this rank was the slowest of the step (the straggler)."""
    frames = [frame.assign(rank=rank)[["step", "rank", "step_us", "kernel_us", "gpu_idle_us"]] for rank, frame in per_rank.items() if not frame.empty]
    if not frames:
        return pd.DataFrame(columns=["step", "rank", "step_us", "kernel_us", "gpu_idle_us", "vs_median_us", "slowest"])
    table = pd.concat(frames, ignore_index=True).sort_values(["step", "rank"], ignore_index=True)
    median = table.groupby("step")["step_us"].transform("median")
    table["vs_median_us"] = table["step_us"] - median
    slowest = table.groupby("step")["step_us"].transform("max")
    table["slowest"] = (table["step_us"] == slowest) & (table.groupby("step")["rank"].transform("size") > 1)
    return table
