"""Steps: duration histogram and over time, outliers (the StepOutlier rule's), and the phase
breakdown (data / forward / backward / optimizer / compute / other) from the step timeline."""

from __future__ import annotations

from ... import chart_scales
from ...capture.phases import PHASES
from ...profiler import STEP_PHASES
from ..context import ReportContext
from ..figures import histogram, line_chart
from ..model import Figure, Section, Table

# The phases a step is split into (data, forward, backward, optimizer, compute, other);
# together they tile each step on the timeline.
BREAKDOWN_PHASES = PHASES


def build(ctx: ReportContext) -> Section:
    section = Section("steps", "Steps")
    timeline = ctx.timeline
    steps = timeline[timeline["phase"].isin(STEP_PHASES)] if len(timeline) else timeline
    if not len(steps):
        section.missing.append("Step times need the step timeline: keep ProfilerConfig(step_timeline=True) (the default) in the hook.")
        return section
    rows = []
    series = {}
    for (mode, rank), group in steps.groupby(["mode", "rank"], sort=True):
        durations = group["duration_ms"]
        label = f"{mode} rank {rank}"
        series[label] = (group["step"].tolist(), durations.tolist())
        rows.append((mode, int(rank), len(group), float(durations.mean()), float(durations.median()), float(durations.quantile(0.95)), float(durations.max())))
    section.add(Table(("mode", "rank", "steps", "mean ms", "p50 ms", "p95 ms", "max ms"), tuple(rows), caption="Step durations", key="step-durations"))
    # one mode per histogram (an EVAL step is a whole validation pass): TRAIN when there is any
    mode = "TRAIN" if (steps["mode"] == "TRAIN").any() else str(steps["mode"].iloc[0])
    of_mode = steps[steps["mode"] == mode]
    durations = of_mode["duration_ms"].to_numpy(dtype=float)
    split = chart_scales.split_far(durations)
    names = [f"{m} step {int(s)}" for m, s in zip(of_mode["mode"].astype(str), of_mode["step"])]
    apart = split.statement("ms", "step", names)
    section.add(Figure(histogram(durations[split.keep].tolist(), xlabel="step duration (ms)"),
                       caption=f"Step duration histogram ({mode} steps, every rank)" + (f"; {apart}" if apart else ""), key="step-histogram"))
    logy = chart_scales.wants_log(steps["duration_ms"].to_numpy(dtype=float))
    section.add(Figure(line_chart(series, xlabel="global step", ylabel="duration (ms)", logy=logy),
                       caption="Step duration over global steps, per mode and rank" + (" (log scale: the durations span more than two decades)" if logy else ""),
                       key="step-over-time"))
    _outliers(ctx, section)
    _phases(ctx, section, timeline)
    return section


def _outliers(ctx: ReportContext, section: Section) -> None:
    finding = ctx.finding("StepOutlier")
    if finding is None:
        section.missing.append("Outliers come from the StepOutlier rule: run `stepscope check PATH` (it runs with profiler data).")
        return
    outliers = finding.statistics.get("outliers") or []
    groups = finding.statistics.get("groups") or {}

    def limit(o: dict) -> float | None:
        return (groups.get(f"{o.get('node_id')}/rank{o.get('rank')}/{o.get('mode')}") or {}).get("limit_ms")

    rows = tuple((o.get("mode"), o.get("rank"), o.get("step"), o.get("duration_ms"), limit(o)) for o in outliers[:20])
    # The rule lists every outlier in its statistics; it fires only above n_outliers of them.
    p = finding.parameters
    caption = (
        f"Step outliers: {len(outliers)} step(s) over their rank and mode's limit, max(mean + {p.get('stddev', 3)} std, "
        f"{p.get('min_ratio', 0)} x median, median + {p.get('min_excess_ms', 0)} ms) without the first step "
        f"(StepOutlier {finding.status}; it fires above {p.get('n_outliers', 10)})"
    )
    section.add(Table(("mode", "rank", "global step", "duration ms", "limit ms"), rows, caption=caption, key="step-outliers"))


def _phases(ctx: ReportContext, section: Section, timeline) -> None:
    phases = timeline[timeline["phase"].isin(BREAKDOWN_PHASES)]
    if not len(phases):
        section.missing.append("The phase breakdown needs phase spans: the hooks record them with the step timeline (ProfilerConfig(step_timeline=True), the default).")
        return
    steps = timeline[timeline["phase"].isin(STEP_PHASES)]
    total_step_ms = float(steps["duration_ms"].sum()) or None
    rows = []
    for phase in BREAKDOWN_PHASES:
        part = phases[phases["phase"] == phase]["duration_ms"]
        if not len(part):
            continue
        share = f"{100 * float(part.sum()) / total_step_ms:.1f} %" if total_step_ms else "n/a"
        rows.append((phase, len(part), float(part.mean()), float(part.median()), float(part.sum()), share))
    section.add(Table(("phase", "spans", "mean ms", "p50 ms", "total ms", "share of step time"), tuple(rows), caption="Phase breakdown", key="phases"))
