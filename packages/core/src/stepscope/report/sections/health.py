"""Training health: loss and metric curves per mode, gradient norms per layer, weight-update
ratios, activation findings; the steps where rules fired are marked on the curves."""

from __future__ import annotations

import numpy as np

from ...exceptions import StepscopeError
from ...reductions import compute
from ..context import ReportContext
from ..figures import line_chart
from ..model import Callout, Figure, Section, Table

MAX_LAYERS = 10
MAX_POINTS_PER_LAYER = 200  # gradient norms and update ratios are read at this many steps at most


def build(ctx: ReportContext) -> Section:
    section = Section("health", "Training health")
    _curves(ctx, section)
    _gradient_norms(ctx, section)
    _update_ratios(ctx, section)
    _activations(ctx, section)
    return section


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
    names = list(dict.fromkeys(names))
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
        section.add(Figure(line_chart(series, xlabel="global step", ylabel=name, marks=marks), caption=f"{name} per mode" + (" (dashed: steps where rules fired)" if marks else ""), key=f"curve-{name}"))
    section.add(Table(("tensor", "mode", "points", "first step", "first value", "last step", "last value"), tuple(rows), caption="Loss and metric values", key="curves"))


def _sample(steps: list[int]) -> list[int]:
    if len(steps) <= MAX_POINTS_PER_LAYER:
        return steps
    keep = np.linspace(0, len(steps) - 1, MAX_POINTS_PER_LAYER).astype(int)
    return [steps[i] for i in keep]


def _gradient_norms(ctx: ReportContext, section: Section) -> None:
    trial = ctx.trial
    names = _collection_names(ctx, "gradients", r"^gradient")
    if not names:
        section.missing.append("Gradient norms need the gradients collection: include_collections=['gradients'] (raw or with reductions=['l2']).")
        return
    series = {}
    for name in names[:MAX_LAYERS]:
        tensor = trial.tensor(name)
        steps, values = [], []
        for step in _sample(tensor.steps()):
            try:
                values.append(tensor.reduction_value(step, "l2"))
                steps.append(step)
            except StepscopeError:
                continue
        if steps:
            series[name] = (steps, values)
    if not series:
        section.missing.append("No gradient value or l2 reduction could be read.")
        return
    more = f" (first {MAX_LAYERS} of {len(names)})" if len(names) > MAX_LAYERS else ""
    section.add(Figure(line_chart(series, xlabel="global step", ylabel="l2 norm", marks=ctx.fired_marks(), logy=True), caption=f"Gradient l2 norm per layer{more}", key="gradient-norms"))
    section.add(Table(("tensor", "steps", "last step", "last l2"), tuple((n, len(s), s[-1], v[-1]) for n, (s, v) in series.items()), caption="Gradient norms", key="gradient-norms"))


def _update_ratios(ctx: ReportContext, section: Section) -> None:
    trial = ctx.trial
    names = [n for n in _collection_names(ctx, "weights", r"weight") if not n.startswith("gradient")]
    series = {}
    for name in names[:MAX_LAYERS]:
        tensor = trial.tensor(name)
        steps = _sample(tensor.steps())
        arrays = trial.read_many((name, s, None, None) for s in steps)
        xs, ratios = [], []
        for (step, before), after in zip(zip(steps, arrays), arrays[1:]):
            if before is None or after is None or before.shape != after.shape:
                continue
            norm = float(compute(before, "l2"))
            if norm > 0:
                xs.append(step)
                ratios.append(float(compute(after - before, "l2")) / norm)
        if xs:
            series[name] = (xs, ratios)
    if not series:
        section.missing.append("Weight-update ratios need raw weights at two or more steps: include_collections=['weights'].")
        return
    section.add(Figure(line_chart(series, xlabel="global step", ylabel="|w' - w| / |w|", marks=ctx.fired_marks(), logy=True), caption="Weight-update ratio between consecutive saved steps", key="update-ratios"))


def _activations(ctx: ReportContext, section: Section) -> None:
    shown = False
    for rule in ("DeadRelu", "SaturatedActivation"):
        finding = ctx.finding(rule)
        if finding is None or finding.status == "no data":
            continue
        shown = True
        level = "bad" if finding.fired else "ok"
        section.add(Callout(level, f"{rule}: {finding.status}", finding.summary, finding.advice))
    if not shown:
        section.missing.append("Activation saturation and dead units need layer outputs (include_collections=['outputs'] or a relu/tanh regex) and the DeadRelu / SaturatedActivation rules (`stepscope check --rule DeadRelu`).")
