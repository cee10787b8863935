"""Rules: every rule that ran, fired or not, with its parameters, evidence and advice."""

from __future__ import annotations

import json

from ..context import ReportContext
from ..findings import ranked
from ..model import Callout, Paragraph, Section, Table

MAX_EVIDENCE_ROWS = 10


def build(ctx: ReportContext) -> Section:
    section = Section("rules", "Rules")
    if not ctx.findings:
        section.missing.append("No rule results: run `stepscope check PATH` (it writes rule-output/), or save tensors so the default rules have data.")
        return section
    findings = ranked(ctx.findings)
    shown = [f for f in findings if f.judged or f.status == "error"]  # a rule that failed stays in sight
    unjudged = [f for f in findings if f not in shown]
    errors = sum(f.status == "error" for f in shown)
    columns = ("rule", "kind", "status", "violations", "summary", "parameters")
    if shown:
        caption = f"The {len(shown) - errors} rule(s) that could judge" + (f", and {errors} that failed" if errors else "")
        section.add(Table(columns, tuple(_row(f) for f in shown), caption=caption, key="rules"))
    else:
        section.add(Paragraph("No rule could judge this job: each lacked the data it needs (below)."))
    if unjudged:
        # what they need is in their summary: "not enough data (needs 30 saved TRAIN losses, has 12)"
        section.add(Table(columns, tuple(_row(f) for f in unjudged), key="rules-not-judged", collapsed=bool(shown),
                          caption=f"The {len(unjudged)} rule(s) that could not judge (no data / not enough data), with what each needs"))
    for finding in findings:
        if finding.status not in ("fired", "error"):
            continue  # the table says all there is about rules that found nothing
        level = "bad" if finding.fired else "warn"
        section.add(Callout(level, f"{finding.rule}: {finding.status}", finding.summary, finding.advice))
        if finding.definition:
            section.add(Paragraph(finding.definition))
        if finding.evidence:
            listed = finding.evidence[:MAX_EVIDENCE_ROWS]
            rows = tuple((e.where, e.tensor or "", _plain(e.value), _plain(e.threshold), e.message) for e in listed)
            more = len(finding.evidence) - len(rows)
            caption = f"{finding.rule}: evidence" + (f" (first {len(rows)}, {more} more)" if more > 0 else "")
            section.add(Table(("where", "tensor / resource", "value", "threshold", "evidence"), rows, caption=caption, key=f"evidence-{finding.rule}"))
    return section


def _row(f) -> tuple:
    return (f.rule, f.kind, f.status, f.violations, f.summary, _parameters(f.parameters))


def _plain(value: object) -> object:
    """A cell for a measured value: numbers as numbers, nothing for None, else its text."""
    if value is None:
        return ""
    return value if isinstance(value, (int, float)) and not isinstance(value, bool) else str(value)


def _parameters(parameters: dict) -> str:
    return ", ".join(f"{k}={json.dumps(v, default=str)}" for k, v in sorted(parameters.items())) or "(none)"
