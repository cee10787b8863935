"""The rules' results as the report shows them: one `Finding` per rule, made from the one
`RuleReport` (tensor and profiler rules alike), so the report follows whatever the rule
engine writes. Results come from `rule-output/` (what `stepscope check` wrote, read by
stepscope.rules.output) or from running the default rules now."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..rules.output import MAX_RULE_REPORT_BYTES, load_reports
from ..rules.report import Evidence, RuleReport

_STATUS_ORDER = {"fired": 0, "error": 1, "not enough data": 2, "no data": 3, "ok": 4}


@dataclass(frozen=True)
class Finding:
    rule: str
    kind: str  # "tensor" or "job"
    status: str  # fired, error, no data, not enough data, ok
    violations: int
    parameters: dict[str, Any]
    summary: str
    evidence: tuple[Evidence, ...] = ()
    fired_steps: tuple[int, ...] = ()
    advice: tuple[str, ...] = ()
    definition: str = ""
    statistics: dict[str, Any] = field(default_factory=dict)
    to_save: str = ""  # what a job must save for the rule to judge it

    @property
    def fired(self) -> bool:
        return self.status == "fired"

    @property
    def judged(self) -> bool:
        """Fired, or found nothing with the evidence it needs; not: no data, not enough data, error."""
        return self.status in ("fired", "ok")

    @classmethod
    def from_report(cls, report: RuleReport) -> Finding:
        explanation = report.explanation
        return cls(
            rule=report.rule, kind=report.kind, status=report.status, violations=report.violations, parameters=dict(report.parameters),
            summary=report.summary(), evidence=tuple(report.evidence), fired_steps=tuple(report.fired_steps),
            advice=tuple(explanation.advice) if explanation else (), definition=explanation.definition if explanation else "",
            statistics=dict(report.statistics), to_save=report.to_save,
        )

    @classmethod
    def from_json(cls, body: dict[str, Any]) -> Finding:
        """From a rule report's JSON, in any shape RuleReport.from_json reads."""
        return cls.from_report(RuleReport.from_json(body))


def ranked(findings: list[Finding]) -> list[Finding]:
    """Fired first (most violations first), then errors, not enough data, no data, ok."""
    return sorted(findings, key=lambda f: (_STATUS_ORDER.get(f.status, 9), -f.violations, f.rule))


def saved_findings(store: Any) -> list[Finding] | None:
    """The reports `stepscope check` wrote to rule-output/, or None when there are none
    (one that cannot be read is skipped with a warning naming it)."""
    reports = load_reports(store)
    return None if reports is None else [Finding.from_report(report) for report in reports]


def run_default_rules(trial: Any) -> list[Finding]:
    """Run stepscope's default rule set for this job now (`stepscope.rules.default_rules`:
    the tensor rules whose inputs were saved, the profiler rules when there is profiler data)."""
    from ..rules import default_rules, run_rules

    return [Finding.from_report(report) for report in run_rules(default_rules(trial))]


__all__ = ["Finding", "Evidence", "MAX_RULE_REPORT_BYTES", "ranked", "saved_findings", "run_default_rules"]
