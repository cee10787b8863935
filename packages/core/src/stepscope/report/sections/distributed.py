"""Distributed: the ranks side by side (step time, compute / communication kernel time, GPU
idle per rank), the stragglers and the RankStraggler rule's verdict, all from the per-rank
trace summaries queried with DuckDB (stepscope.traces.cluster.JobQuery), so memory stays
O(summaries) whatever the number of ranks."""

from __future__ import annotations

from ...exceptions import ConfigError
from ..context import ReportContext
from ..model import Callout, Paragraph, Section, Table

# A job with thousands of ranks: the table lists the slowest ones (the caption says so).
MAX_RANK_ROWS = 64
MAX_STRAGGLER_ROWS = 50

RANK_COLUMNS = ("rank", "steps", "mean step us", "compute kernels us", "communication kernels us", "GPU idle us", "vs median rank %")
STRAGGLER_COLUMNS = ("rank", "slow steps", "of steps", "first step", "last step", "median excess us", "median excess %", "slowest part", "kernel class", "kernel")


def build(ctx: ReportContext) -> Section:
    section = Section("distributed", "Distributed")
    if not ctx.profiler.traces.trace_keys():
        section.missing.append("The per-rank comparison needs detailed traces: set ProfilerConfig.detailed_windows in the hook (docs/traces.md).")
        return section
    try:
        from ...traces.cluster import JobQuery

        query = JobQuery(ctx.trial.store)
    except ConfigError as exc:  # DuckDB not installed
        section.missing.append(str(exc))
        return section
    with query:
        ranks = query.ranks
        if len(ranks) < 2:
            section.add(Paragraph(f"Single-rank job ({len(ranks)} rank with traces): nothing to compare across ranks."))
            return section
        _ranks(section, query)
        _stragglers(section, query)
    _verdict(ctx, section)
    return section


def _ranks(section: Section, query) -> None:
    table = query.rank_comparison()
    shown = table if len(table) <= MAX_RANK_ROWS else table.sort_values("mean_step_us", ascending=False).head(MAX_RANK_ROWS).sort_values("rank")
    rows = tuple(
        (int(r.rank), int(r.steps), float(r.mean_step_us), float(r.compute_kernel_us), float(r.comm_kernel_us), float(r.gpu_idle_us), float(r.vs_median_pct))
        for r in shown.itertuples(index=False)
    )
    caption = f"Per rank, mean per profiled step ({len(table)} ranks"
    caption += f"; the {MAX_RANK_ROWS} slowest shown)" if len(shown) < len(table) else ")"
    section.add(Table(RANK_COLUMNS, rows, caption=caption, key="distributed-ranks"))


def _stragglers(section: Section, query) -> None:
    found = query.straggler_ranks()
    if found.empty:
        section.add(Callout("ok", "No straggling rank", "No rank's step or compute-kernel time is an outlier among the step's ranks (or fewer than 4 ranks were judged)."))
        return
    rows = tuple(
        (int(r.rank), int(r.slow_steps), int(r.steps), int(r.first_step), int(r.last_step), float(r.median_excess_us), float(r.median_excess_pct),
         r.slowest_part, r.kernel_class, r.kernel)
        for r in found.head(MAX_STRAGGLER_ROWS).itertuples(index=False)
    )
    section.add(Table(STRAGGLER_COLUMNS, rows, caption=f"Stragglers: {len(found)} rank(s) slower than the step's median rank in some steps", key="distributed-stragglers"))


def _verdict(ctx: ReportContext, section: Section) -> None:
    finding = ctx.finding("RankStraggler")
    if finding is None:
        section.missing.append("The RankStraggler rule's verdict: run `stepscope check PATH` (it runs with detailed traces).")
        return
    level = "bad" if finding.fired else "ok" if finding.status == "ok" else "info"
    section.add(Callout(level, f"RankStraggler: {finding.status}", finding.summary, tuple(e.message for e in finding.evidence[:10])))
