"""stepscope's own cost: time spent in the hooks and in the writer against step time, and
bytes written, as the hooks measured them during the run (stepscope-cost/)."""

from __future__ import annotations

from ...job_files import read_costs
from ..context import ReportContext
from ..figures import line_chart
from ..model import Figure, Section, Table


def build(ctx: ReportContext) -> Section:
    section = Section("cost", "stepscope's own cost")
    costs = read_costs(ctx.trial.store)
    if not costs:
        section.missing.append("The hooks' own cost is measured by stepscope's hooks and written at close (stepscope-cost/): close the hook (hook.close() or the with-block) so it is published.")
        return section
    rows = []
    series = {}
    for worker, cost in sorted(costs.items()):
        share = f"{100 * cost.hook_s / cost.step_s:.2f} %" if cost.step_s else "n/a"
        per_step = 1000 * cost.hook_s / cost.steps if cost.steps else 0.0
        writer_per_step = 1000 * cost.writer_s / cost.steps if cost.steps else 0.0
        rows.append((worker, cost.steps, round(cost.step_s, 4), round(cost.hook_s, 4), share, round(per_step, 4), round(writer_per_step, 4), cost.bytes_written))
        if cost.samples:
            series[f"{worker} hook ms"] = ([s for s, _, _ in cost.samples], [1000 * h for _, _, h in cost.samples])
            series[f"{worker} step ms"] = ([s for s, _, _ in cost.samples], [1000 * t for _, t, _ in cost.samples])
    section.add(Table(
        ("worker", "steps", "step time s", "in hooks s", "hooks / step time", "hook ms per step", "writer ms per step (background)", "bytes written"),
        tuple(rows), caption="Measured by the hooks during the run", key="cost",
    ))
    if series:
        section.add(Figure(line_chart(series, xlabel="step", ylabel="ms", logy=True), caption="Time in hooks against step time", key="cost-over-time"))
    return section
