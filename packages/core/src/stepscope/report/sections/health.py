"""Training health: loss and metric curves per mode, gradient norms per layer, weight-update
ratios, activation findings; the steps where rules fired are marked on the curves."""

from __future__ import annotations

import numpy as np

from ... import health
from ..context import ReportContext
from ..figures import line_chart
from ..model import Callout, Figure, Section, Table

MAX_LAYERS = 10
MAX_POINTS_PER_LAYER = 200  # gradient norms and update ratios are read at this many TRAIN steps at most


def build(ctx: ReportContext) -> Section:
    return ctx.fill(Section("health", "Training health"), _curves, _gradient_norms, _update_ratios, _activations)


def _collection_names(ctx: ReportContext, collection: str, fallback: str) -> list[str]:
    trial = ctx.trial
    if collection in trial.collections():
        names = trial.tensor_names(collection=collection)
    else:
        names = trial.tensor_names(regex=fallback)
    return [n for n in names if not n.startswith("smdebug/reductions/")]


def _global_series(ctx: ReportContext, name: str) -> dict[str, tuple[list[int], list[float]]]:
    """{mode: (global steps, values)} of a scalar tensor."""
    trial = ctx.trial
    tensor = trial.tensor(name)
    out = {}
    for mode in trial.modes():
        values = tensor.values(mode=mode)
        if not values:
            continue
        steps = sorted(values)
        out[mode.name] = ([trial.global_step(mode, s) for s in steps], [float(np.asarray(values[s]).reshape(-1)[0]) for s in steps])
    return out


def _curves(ctx: ReportContext, section: Section) -> None:
    names = _collection_names(ctx, "losses", r"(?i)loss") + _collection_names(ctx, "metrics", r"(?i)(acc|metric)")
    names = [n for n in dict.fromkeys(names) if n not in health.STEP_COUNTERS]
    if not names:
        section.missing.append("Loss and metric curves need the losses (and metrics) collection: register the loss with the hook (hook.register_loss) or save it with hook.save_scalar.")
        return
    rows = []
    marks = ctx.fired_marks()
    for name in names:
        series = _global_series(ctx, name)
        if not series:
            continue
        for mode, (steps, values) in series.items():
            rows.append((name, mode, len(values), steps[0], values[0], steps[-1], values[-1]))
        # NaN/inf values are not drawn (the line ends where the loss blew up): say so.
        bad = health.non_finite_points((step, value) for steps, values in series.values() for step, value in zip(steps, values))
        not_drawn = f"; {bad[0] + bad[1]} NaN or infinite value(s) not drawn, the first at global step {bad[2]}" if bad else ""
        caption = f"{name} per mode" + (" (dashed: steps where rules fired)" if marks else "") + not_drawn
        section.add(Figure(line_chart(series, xlabel="global step", ylabel=name, marks=marks), caption=caption, key=f"curve-{name}"))
    section.add(Table(("tensor", "mode", "points", "first global step", "first value", "last global step", "last value"), tuple(rows), caption="Loss and metric values", key="curves"))


def _gradient_norms(ctx: ReportContext, section: Section) -> None:
    names = _collection_names(ctx, "gradients", r"^gradient")
    if not names:
        section.missing.append("Gradient norms need the gradients collection: include_collections=['gradients'] (raw or with reductions=['l2']).")
        return
    found = [health.gradient_norm_series(ctx.trial, name, MAX_POINTS_PER_LAYER) for name in ctx.flagged_first(names)[:MAX_LAYERS]]
    series = {s.name: (s.steps, s.values) for s in found if s.steps}
    if not series:
        section.missing.append("No gradient value or l2 reduction could be read at a TRAIN step.")
        return
    more = f" ({MAX_LAYERS} of {len(names)}: those a rule flagged, then the first)" if len(names) > MAX_LAYERS else ""
    section.add(Figure(line_chart(series, xlabel="global step (TRAIN steps)", ylabel="l2 norm", marks=ctx.fired_marks(), logy=True, flagged=ctx.flagged_tensors()),
                       caption=f"Gradient l2 norm per layer at the saved TRAIN steps{more}", key="gradient-norms"))
    section.add(Table(("tensor", "mode", "steps", "last global step", "last l2"), tuple((n, "TRAIN", len(s), s[-1], v[-1]) for n, (s, v) in series.items()),
                      caption="Gradient norms", key="gradient-norms"))


def _update_ratios(ctx: ReportContext, section: Section) -> None:
    names = [n for n in _collection_names(ctx, "weights", r"weight") if not n.startswith("gradient")]
    found = [health.update_ratio_series(ctx.trial, name, MAX_POINTS_PER_LAYER) for name in ctx.flagged_first(names)[:MAX_LAYERS]]
    series = {s.name: (s.steps, s.values) for s in found if s.steps}
    if not series:
        section.missing.append("Weight-update ratios need raw weights at two or more TRAIN steps: include_collections=['weights'].")
        return
    section.add(Figure(line_chart(series, xlabel="global step (TRAIN steps)", ylabel="|w' - w| / max(|w|, 1e-3 sqrt(n))", marks=ctx.fired_marks(), logy=True, flagged=ctx.flagged_tensors()),
                       caption="Weight-update ratio between consecutive saved TRAIN steps", key="update-ratios"))
    section.add(Table(("tensor", "mode", "ratios", "last global step", "last ratio"), tuple((n, "TRAIN", len(s), s[-1], v[-1]) for n, (s, v) in series.items()),
                      caption="Weight-update ratios", key="update-ratios"))


def _activations(ctx: ReportContext, section: Section) -> None:
    from ...rules.activations import default_inactive_series

    rows, persistence = default_inactive_series(ctx.trial)
    rows = [r for r in rows if r.steps]
    if rows:
        section.add(Table(("layer (state, mode)", "shares", "last global step", "last % of units"), tuple((r.name, len(r.steps), r.steps[-1], r.values[-1]) for r in rows[:MAX_LAYERS * 2]),
                          caption=f"Dead / saturated units: % of each layer's units off at each of its last {persistence.get('dead', 1)} (dead) / "
                                  f"{persistence.get('saturated', 1)} (saturated) saved steps of a mode, as DeadRelu and SaturatedActivation judge them",
                          key="inactive-units"))
    shown = bool(rows)
    for rule in ("DeadRelu", "SaturatedActivation"):
        finding = ctx.finding(rule)
        if finding is None or finding.status == "no data":
            continue
        shown = True
        level = "bad" if finding.fired else "ok"
        section.add(Callout(level, f"{rule}: {finding.status}", finding.summary, finding.advice))
    if not shown:
        section.missing.append("Activation saturation and dead units need layer outputs (include_collections=['outputs'] or a relu/tanh regex) and the DeadRelu / SaturatedActivation rules (`stepscope check --rule DeadRelu`).")
