"""Summary: the verdict first (what is wrong, ranked, with advice), then job times, nodes,
workers, versions, and what was saved and how often."""

from __future__ import annotations

import json
import logging

from ...exceptions import StepscopeError
from ...job_files import MAX_COLLECTIONS_BYTES, read_json
from ...layout import COLLECTIONS_DIR
from ...modes import ModeKeys
from ...profiler import STEP_PHASES
from ..context import ReportContext
from ..findings import Finding, ranked
from ..model import Callout, Paragraph, Section, Table

logger = logging.getLogger("stepscope")


def build(ctx: ReportContext) -> Section:
    return ctx.fill(Section("summary", "Summary"), _verdict, _times, _job, _saved)


def judged_text(findings: list[Finding]) -> str:
    """`7 of 9 rule(s) could judge; for the others save: losses every step (Overfit)`."""
    judged = sum(1 for f in findings if f.judged)
    text = f"{judged} of {len(findings)} rule(s) could judge"
    if judged < len(findings):
        needs: dict[str, list[str]] = {}
        for f in findings:
            if not f.judged and f.to_save:
                needs.setdefault(f.to_save, []).append(f.rule)
        hints = "; ".join(f"{what} ({', '.join(rules)})" for what, rules in needs.items())
        text += f"; for the others save: {hints}" if hints else "; the others had no data or too little"
    return text


def _verdict(ctx: ReportContext, section: Section) -> None:
    fired = [f for f in ranked(ctx.findings) if f.fired]
    if not ctx.findings:
        section.add(Callout("info", "No rule results", "Run `stepscope check PATH` or save tensors for the default rules."))
    elif not any(f.judged for f in ctx.findings):
        section.add(Callout("warn", "No rule could judge this job", judged_text(ctx.findings) + "."))
    elif not fired:
        section.add(Callout("ok", "No rule fired", f"{judged_text(ctx.findings)}; none found a problem."))
    else:
        section.add(Paragraph(judged_text(ctx.findings) + "."))
    for rank, finding in enumerate(fired, start=1):
        # The rule model's summary names the first step; older reports only list fired steps.
        steps = f" First at step {finding.fired_steps[0]}." if finding.fired_steps and "first" not in finding.summary.lower() else ""
        section.add(Callout("bad", f"{rank}. {finding.rule}", f"{finding.summary}.{steps}", finding.advice))


def _times(ctx: ReportContext, section: Section) -> None:
    timeline = ctx.timeline
    steps = timeline[timeline["phase"].isin(STEP_PHASES)] if len(timeline) else timeline
    if not len(steps):
        section.missing.append("Job times need the step timeline: keep ProfilerConfig(step_timeline=True) (the default) in the hook.")
        return
    first_start, last_end = float(steps["start_ns"].min()) / 1e9, float(steps["end_ns"].max()) / 1e9
    job_start = ctx.profiler.job_start()
    span = ctx.profiler.time_range()
    job_end = max(span[1], last_end) if span else None
    rows = [
        ("initialisation", _seconds(first_start - job_start) if job_start is not None else "not recorded"),
        ("training loop", _seconds(last_end - first_start)),
        ("finalisation", _seconds(job_end - last_end) if job_end is not None else "not recorded (no system metrics)"),
    ]
    section.add(Table(("phase", "duration"), tuple(rows), caption="Job times (from the step timeline and system metrics)", key="job-times"))


def _seconds(value: float) -> str:
    return f"{max(value, 0.0):.2f} s"


def _job(ctx: ReportContext, section: Section) -> None:
    trial = ctx.trial
    timeline = ctx.timeline
    frameworks = sorted({str(f) for f in timeline["framework"].dropna().unique()}) if len(timeline) else []
    try:
        nodes = ctx.profiler.nodes()
    except Exception:
        nodes = []
    rows = [
        ("job", trial.path),
        ("complete", "yes" if trial.is_complete() else "no (still running or ended without closing the hook)"),
        ("workers", ", ".join(trial.workers()) or "none saved tensors"),
        ("nodes", ", ".join(nodes) or (", ".join(sorted({str(n) for n in timeline["node_id"].unique()})) if len(timeline) else "no system metrics")),
        ("framework", ", ".join(frameworks) or "not recorded"),
        ("writer", _writer_version(ctx) or "not recorded"),
    ]
    rows += [(f"{k} version", v) for k, v in sorted(_versions(ctx).items())]
    section.add(Table(("", ""), tuple(rows), caption="The job", key="job"))


def _writer_version(ctx: ReportContext) -> str | None:
    store = ctx.trial.store
    for key in store.list(COLLECTIONS_DIR + "/"):
        try:
            body = read_json(store, key, MAX_COLLECTIONS_BYTES)
        except (StepscopeError, OSError):
            continue
        meta = body.get("_meta") if isinstance(body, dict) else None
        writer = meta.get("writer") if isinstance(meta, dict) else None
        return writer if isinstance(writer, str) else None
    return None


def _versions(ctx: ReportContext) -> dict[str, str]:
    from ...job_files import read_costs

    versions: dict[str, str] = {}
    for cost in read_costs(ctx.trial.store).values():
        versions.update(cost.versions)
    return versions


def _saved(ctx: ReportContext, section: Section) -> None:
    trial = ctx.trial
    collections = trial.collections()
    if not trial.steps():
        section.missing.append("No tensors were saved: register the hook (see docs/pytorch.md, docs/keras.md) and include collections.")
        return
    mode_counts = ", ".join(f"{m.name}: {len(trial.steps(mode=m))}" for m in trial.modes())
    rows = []
    for name, collection in sorted(collections.items()):
        tensors = [n for n in trial.tensor_names() if collection.matches(n)]
        if not tensors:
            continue
        config = collection.save_config.to_json() if collection.save_config else {}
        train = config.get(ModeKeys.TRAIN.name) if isinstance(config, dict) else None
        rows.append((name, len(tensors), _how_often(train) if train else "the hook's save_config"))
    section.add(Table(("collection", "tensors", "saved (TRAIN)"), tuple(rows), caption=f"What was saved: {len(trial.steps())} steps ({mode_counts})", key="saved"))


def _how_often(config: dict) -> str:
    """`every 100 steps from 0`, `steps 5, 10`, ... from a SaveConfigMode's JSON."""
    parts = []
    interval = config.get("save_interval")
    if interval:
        parts.append(f"every {interval} step{'s' if interval != 1 else ''}")
        start, end = config.get("start_step") or 0, config.get("end_step")
        if start or end is not None:
            parts.append(f"from {start}" + (f" to {end}" if end is not None else ""))
    if config.get("save_steps"):
        parts.append("at steps " + ", ".join(str(s) for s in config["save_steps"][:10]) + (" ..." if len(config["save_steps"]) > 10 else ""))
    return " ".join(parts) or json.dumps(config)
