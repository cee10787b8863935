"""Memory rules over the allocator events of the detailed traces (profile_memory=True), on
the one rule model: a peak near the device's limit, memory growing step over step (a
leak), a fragmented caching allocator, one rank's peak far above the others'. Each reads
the trace engine's memory tables (`self.profiler.traces`, docs/traces.md "Memory") and
reports evidence with the rank, device, step and the operator involved."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pandas as pd

from .base import JobRule
from .params import RuleParams, ranged

_MAX_LISTED = 20
_MIB = 1 << 20


def _mib(value: float) -> str:
    return f"{value / _MIB:,.1f} MiB"


class MemoryRule(JobRule):
    """Base: the job's memory tables, or "no data" when its traces hold no allocator events."""

    def evaluate(self) -> None:
        analysis = self.detailed_traces()
        if analysis is None:
            return
        steps = analysis.memory_steps()
        if steps.empty:
            self.no_data("the detailed traces hold no allocator events (record them with ProfilerConfig(profile_memory=True))")
            return
        self._judge(analysis, steps)

    def _judge(self, analysis: Any, steps: pd.DataFrame) -> None:
        raise NotImplementedError

    def _judged(self, judged: int, statistics: dict[str, Any], none_judged: str) -> None:
        """Record how many steps / devices / ranks were judged and the statistics, or say
        why none could be (`none_judged`)."""
        self.report.datapoints = judged
        self.report.statistics.update(statistics)
        if not judged:
            self.no_data(none_judged)

    def _judge_devices(self, analysis: Any, steps: pd.DataFrame, fired: str, none_judged: str) -> None:
        """Judge each device of each rank with `_judge_device` (its profiled steps in, whether
        it could judge them out), then record the devices judged and those that fired
        (statistic `fired`), or why none could be judged."""
        groups = steps.groupby(["rank", "device"], sort=True)
        judged = sum(self._judge_device(analysis, rank, str(device), rows) for (rank, device), rows in groups)
        self._judged(judged, {"devices_judged": judged, fired: self.report.violations}, none_judged)

    def _judge_device(self, analysis: Any, rank: Any, device: str, rows: pd.DataFrame) -> bool:
        raise NotImplementedError

    def _listed(self, count: int) -> bool:
        """Whether one more violation is listed (the rest are counted in statistics)."""
        if self.report.violations < _MAX_LISTED:
            return True
        self.report.statistics["not_listed"] = self.report.statistics.get("not_listed", 0) + 1
        return False


@dataclass(frozen=True)
class MemoryNearLimitParams(RuleParams):
    max_fraction: float = ranged(0.9, "fraction")
    # The device's memory in bytes; 0: each GPU's `totalGlobalMem` from its trace. Set it to
    # judge the host (CPU traces carry no limit) or a smaller budget than the device.
    limit_bytes: int = ranged(0, "count")


class MemoryNearLimit(MemoryRule):
    """A step's peak (the higher of allocated and reserved) is above `max_fraction` of the
    device's memory: the next larger batch, longer sequence or fragmentation runs out."""

    params: MemoryNearLimitParams

    def _judge(self, analysis: Any, steps: pd.DataFrame) -> None:
        limits = {} if self.params.limit_bytes else {(int(r.rank), str(r.device)): int(r.total_bytes) for r in analysis.device_memory().itertuples()}
        judged = fired = 0
        highest = 0.0
        for row in steps.itertuples(index=False):
            limit = self.params.limit_bytes or limits.get((int(row.rank), str(row.device)), 0)
            if limit <= 0:
                continue  # a device whose limit nobody knows (the host, without limit_bytes)
            judged += 1
            peak = max(int(row.peak_allocated), int(row.peak_reserved))
            share = peak / limit
            highest = max(highest, share)
            if share > self.params.max_fraction:
                fired += 1
                if self._listed(fired):
                    where = f" in {row.peak_op}" + (f" ({row.peak_module})" if row.peak_module else "")
                    self.violation(
                        int(row.step),
                        f"rank {row.rank} {row.device}: peak {_mib(peak)} is {share:.0%} of {_mib(limit)}{where}",
                        value=share, threshold=self.params.max_fraction, rank=int(row.rank), device=str(row.device),
                        peak_bytes=peak, limit_bytes=limit, op=str(row.peak_op), module=str(row.peak_module), annotation=str(row.peak_annotation),
                    )  # fmt: skip
        self._judged(
            judged,
            {"steps_judged": judged, "steps_over_threshold": fired, "highest_share": highest if judged else None},
            "no device with a known memory limit (GPU traces carry it; for the host set limit_bytes)",
        )


@dataclass(frozen=True)
class MemoryGrowthParams(RuleParams):
    min_growth_bytes: int = ranged(1 << 20, "count")  # over the profiled steps, per device
    min_share: float = ranged(0.75, "fraction")  # of the judged steps that must grow
    min_steps: int = ranged(3, "positive_int")


class MemoryGrowth(MemoryRule):
    """The memory allocated grows step over step: in at least `min_share` of a device's
    profiled steps (after its first, which also makes gradients and optimizer state) more
    is allocated at the step's end than at its start, by `min_growth_bytes` or more in all:
    a reference keeps every step's tensors alive (a leak)."""

    params: MemoryGrowthParams

    def _judge(self, analysis: Any, steps: pd.DataFrame) -> None:
        none_judged = f"fewer than {self.params.min_steps + 1} profiled steps per device (a longer detailed window)"
        self._judge_devices(analysis, steps, "devices_growing", none_judged)

    def _judge_device(self, analysis: Any, rank: Any, device: str, rows: pd.DataFrame) -> bool:
        rows = rows.sort_values("step").iloc[1:]  # the first profiled step makes gradients and optimizer state
        if len(rows) < self.params.min_steps:
            return False
        delta = rows["end_allocated"] - rows["start_allocated"]
        share = float((delta > 0).mean())
        total = int(delta.sum())
        if share < self.params.min_share or total < self.params.min_growth_bytes:
            return True
        # What was kept, and by which operator: read for the growing device's rank only.
        growth = analysis.memory_growth(rank=int(rank))
        kept = growth[(growth["device"] == device) & growth["step"].isin(rows["step"])]
        mine = analysis.allocating_ops(k=None, rank=int(rank))
        culprit = mine.loc[mine["outliving_bytes"].idxmax()] if not mine.empty and mine["outliving_bytes"].max() > 0 else None
        named = f"; most kept by {culprit['op']} ({_mib(culprit['outliving_bytes'])})" if culprit is not None else ""
        self.violation(
            int(rows["step"].iloc[-1]),
            f"rank {rank} {device}: +{_mib(total)} over {len(rows)} steps, {share:.0%} of them growing "
            f"({_mib(total / len(rows))} a step){named}",
            value=total, threshold=self.params.min_growth_bytes, rank=int(rank), device=device, growing_share=share,
            outliving_bytes=int(kept["outliving_bytes"].sum()), op=str(culprit["op"]) if culprit is not None else "",
        )  # fmt: skip
        return True


@dataclass(frozen=True)
class MemoryFragmentationParams(RuleParams):
    max_share: float = ranged(0.3, "fraction")  # of the reserved memory not allocated at the step's peak
    min_reserved_bytes: int = ranged(256 << 20, "count")  # smaller pools are not worth judging


class MemoryFragmentation(MemoryRule):
    """At a device's highest peak (over its profiled steps) more than `max_share` of the
    caching allocator's reserved memory is not allocated: cached blocks that the requests
    of that moment could not use (fragmentation)."""

    params: MemoryFragmentationParams

    def _judge(self, analysis: Any, steps: pd.DataFrame) -> None:
        none_judged = f"no device with a reserved pool of {_mib(self.params.min_reserved_bytes)} or more at its peak (CUDA's caching allocator)"
        self._judge_devices(analysis, steps, "devices_over_threshold", none_judged)

    def _judge_device(self, analysis: Any, rank: Any, device: str, rows: pd.DataFrame) -> bool:
        top = rows.loc[rows["peak_allocated"].idxmax()]
        reserved = int(top["reserved_at_peak"])
        if reserved < max(self.params.min_reserved_bytes, 1):
            return False  # the host (no reserved pool) or a small pool
        share = 1.0 - int(top["peak_allocated"]) / reserved
        if share > self.params.max_share:
            self.violation(
                int(top["step"]),
                f"rank {rank} {device}: {share:.0%} of {_mib(reserved)} reserved is not allocated at the peak ({_mib(int(top['peak_allocated']))} allocated)",
                value=share, threshold=self.params.max_share, rank=int(rank), device=device, reserved_bytes=reserved,
                allocated_bytes=int(top["peak_allocated"]),
            )  # fmt: skip
        return True


@dataclass(frozen=True)
class RankMemoryImbalanceParams(RuleParams):
    max_ratio: float = ranged(1.5, "positive")  # a rank's peak over the median rank's
    min_peak_bytes: int = ranged(64 << 20, "count")  # peaks below this are not compared


class RankMemoryImbalance(MemoryRule):
    """One rank's highest peak is more than `max_ratio` times the median rank's on the same
    kind of device: that rank runs out of memory first."""

    params: RankMemoryImbalanceParams

    def _judge(self, analysis: Any, steps: pd.DataFrame) -> None:
        ranks = analysis.memory_ranks()
        kinds = ranks["device"].str.split(":").str[0]
        judged = 0
        for _, rows in ranks.groupby(kinds, sort=True):
            if rows["rank"].nunique() < 2:
                continue
            judged += len(rows)
            for row in rows.itertuples(index=False):
                if row.peak_allocated >= self.params.min_peak_bytes and row.vs_median > self.params.max_ratio:
                    self.violation(
                        int(row.step),
                        f"rank {row.rank} {row.device}: peak {_mib(row.peak_allocated)} is {row.vs_median:.2f}x the median rank's",
                        value=float(row.vs_median), threshold=self.params.max_ratio, rank=int(row.rank), device=str(row.device), peak_bytes=int(row.peak_allocated),
                    )  # fmt: skip
        self._judged(judged, {"ranks_judged": judged}, "fewer than two ranks with allocator events")


MEMORY_RULES: dict[str, type[MemoryRule]] = {rule.__name__: rule for rule in (MemoryNearLimit, MemoryGrowth, MemoryFragmentation, RankMemoryImbalance)}
