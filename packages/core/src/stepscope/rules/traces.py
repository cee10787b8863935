"""Profiler rules over the detailed traces, on the one rule model (stepscope.rules.JobRule):
high launch latency, small kernels dominating, many syncs per step, memcpy-bound steps.
Each judges every profiled step of every rank with a check from traces/checks.py and
reports one violation (evidence at that step, with the rank) per step over its threshold;
a job without detailed traces gives "no data". Registered in the rule catalog
(rules.registry), so `stepscope check --rule HighLaunchLatency` and rules files name them
like any other."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import pandas as pd

from ..traces import checks
from .base import JobRule
from .params import RuleParams, ranged

_MAX_LISTED = 20


class TraceRule(JobRule):
    """Base: `check`, the name of a traces.checks function called with the analysis and
    the rule's parameters, returns checks.CHECK_COLUMNS rows; violations are the fired ones."""

    check: ClassVar[str]

    def evaluate(self) -> None:
        analysis = self.detailed_traces()
        if analysis is None:
            return
        rows = self._measure(analysis)
        report = self.report
        report.datapoints = len(rows)
        fired = rows[rows["fired"]]
        report.statistics = {
            "steps_judged": len(rows),
            "steps_over_threshold": len(fired),
            "max_value": float(rows["value"].max()) if len(rows) else None,
            "median_value": float(rows["value"].median()) if len(rows) else None,
        }
        for row in fired.head(_MAX_LISTED).itertuples(index=False):
            self.violation(int(row.step), f"rank {row.rank}: {row.detail}", value=float(row.value), threshold=float(row.threshold), rank=int(row.rank))
        if len(fired) > _MAX_LISTED:
            report.statistics["not_listed"] = len(fired) - _MAX_LISTED

    def _measure(self, analysis: Any) -> pd.DataFrame:
        return getattr(checks, self.check)(analysis, **self.params.to_json())


@dataclass(frozen=True)
class HighLaunchLatencyParams(RuleParams):
    threshold_us: float = ranged(50.0, "positive")


class HighLaunchLatency(TraceRule):
    """The p95 launch delay of a step's kernels (GPU start minus the end of its launch call)
    is above `threshold_us`."""

    params: HighLaunchLatencyParams
    check = "high_launch_latency"


@dataclass(frozen=True)
class SmallKernelsParams(RuleParams):
    max_kernel_us: float = ranged(10.0, "positive")
    min_share: float = ranged(0.5, "fraction")


class SmallKernelsDominating(TraceRule):
    """More than `min_share` of a step's kernel launches are shorter than `max_kernel_us`:
    the step is bound by launch overhead."""

    params: SmallKernelsParams
    check = "small_kernels_dominating"


@dataclass(frozen=True)
class ManySyncsParams(RuleParams):
    max_syncs: int = ranged(10, "count")


class ManySyncsPerStep(TraceRule):
    """More than `max_syncs` host synchronize calls in one step."""

    params: ManySyncsParams
    check = "many_syncs_per_step"


@dataclass(frozen=True)
class MemcpyBoundParams(RuleParams):
    max_share: float = ranged(0.3, "fraction")


class MemcpyBoundStep(TraceRule):
    """memcpy/memset take more than `max_share` of a step's duration."""

    params: MemcpyBoundParams
    check = "memcpy_bound_steps"


@dataclass(frozen=True)
class RankStragglerParams(RuleParams):
    z: float = ranged(3.5, "positive")
    min_excess: float = ranged(0.05, "fraction")
    min_ranks: int = ranged(4, "positive_int")


class RankStraggler(JobRule):
    """Per profiled step, a rank whose step time or compute-kernel time is an outlier among
    the step's ranks (more than `z` robust standard deviations and `min_excess` of the
    median above the median rank); judged from the per-rank trace summaries with DuckDB
    (stepscope.traces.cluster), so it scales to thousands of ranks. The evidence names the
    rank, the step, and the part (phase, compute / communication kernels, memcpy, syncs,
    host wait) and kernel class that make it slow."""

    params: RankStragglerParams

    def evaluate(self) -> None:
        from ..exceptions import ConfigError
        from ..traces.cluster import JobQuery, StragglerParams
        from ..traces.fanout import summarise_loaded

        analysis = self.detailed_traces()
        if analysis is None:
            return
        try:
            settings = StragglerParams(z=self.params.z, min_excess=self.params.min_excess, min_ranks=self.params.min_ranks)
            analysis.wait_persisted()
            summarise_loaded(analysis)  # traces other rules parsed already are not parsed again
            query = JobQuery(self.profiler.store)
        except ConfigError as exc:  # DuckDB missing, min_ranks below 3
            self.no_data(str(exc))
            return
        with query:
            ranks = query.ranks
            if len(ranks) < settings.min_ranks:
                self.no_data(f"{len(ranks)} ranks with traces; stragglers are judged among {settings.min_ranks} or more")
                return
            judged = query.sql("SELECT count(*) AS n FROM (SELECT DISTINCT step, rank FROM summary_steps WHERE step >= 0 AND step_ns IS NOT NULL)")["n"].iloc[0]
            slow = query.stragglers(settings)
            by_rank = query.straggler_ranks(settings) if not slow.empty else slow
        report = self.report
        report.datapoints = int(judged)
        report.statistics = {
            "ranks": len(ranks),
            "rank_steps_judged": int(judged),
            "slow_rank_steps": len(slow),
            "straggler_ranks": [int(r) for r in by_rank["rank"]] if not slow.empty else [],
        }
        # The ranks slow in the most steps first (a straggler), then single slow steps.
        if not slow.empty:
            slow = slow.assign(rank_slow_steps=slow["rank"].map(slow["rank"].value_counts())).sort_values(["rank_slow_steps", "excess_us"], ascending=False)
        for row in slow.head(_MAX_LISTED).itertuples(index=False):
            where = f"; most of it in {row.slowest_part} (+{row.part_excess_us:,.0f} us)" if row.slowest_part else ""
            kernel = f"; kernel class {row.kernel_class} (+{row.class_excess_us:,.0f} us), kernel {row.kernel}" if row.kernel_class else ""
            self.violation(
                int(row.step),
                f"rank {row.rank} is a straggler by {row.by}: step {row.step_us:,.0f} us vs the median rank's {row.median_step_us:,.0f} us "
                f"(+{row.excess_pct:.0f}%), compute kernels {row.compute_kernel_us:,.0f} us vs {row.median_compute_kernel_us:,.0f} us{where}{kernel}",
                value=float(row.step_us), threshold=float(row.median_step_us), rank=int(row.rank), part=row.slowest_part,
                kernel_class=row.kernel_class, kernel=row.kernel,
            )
        if len(slow) > _MAX_LISTED:
            report.statistics["not_listed"] = len(slow) - _MAX_LISTED


TRACE_RULES: dict[str, type[JobRule]] = {rule.__name__: rule for rule in (HighLaunchLatency, SmallKernelsDominating, ManySyncsPerStep, MemcpyBoundStep, RankStraggler)}
