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
    section.add(Table(
        ("rule", "kind", "status", "violations", "summary", "parameters"),
        tuple((f.rule, f.kind, f.status, f.violations, f.summary, _parameters(f.parameters)) for f in findings),
        caption="Every rule that ran", key="rules",
    ))
    for finding in findings:
        if finding.status not in ("fired", "error"):
            continue  # the table says all there is about rules that found nothing
        level = "bad" if finding.fired else "warn"
        section.add(Callout(level, f"{finding.rule}: {finding.status}", finding.summary, finding.advice))
        if finding.definition:
            section.add(Paragraph(finding.definition))
        if finding.evidence:
            shown = finding.evidence[:MAX_EVIDENCE_ROWS]
            rows = tuple((e.where, e.tensor or "", _plain(e.value), _plain(e.threshold), e.message) for e in shown)
            more = len(finding.evidence) - len(rows)
            caption = f"{finding.rule}: evidence" + (f" (first {len(rows)}, {more} more)" if more > 0 else "")
            section.add(Table(("where", "tensor / resource", "value", "threshold", "evidence"), rows, caption=caption, key=f"evidence-{finding.rule}"))
    return section


def _plain(value: object) -> object:
    """A cell for a measured value: numbers as numbers, nothing for None, else its text."""
    if value is None:
        return ""
    return value if isinstance(value, (int, float)) and not isinstance(value, bool) else str(value)


def _parameters(parameters: dict) -> str:
    return ", ".join(f"{k}={json.dumps(v, default=str)}" for k, v in sorted(parameters.items())) or "(none)"
