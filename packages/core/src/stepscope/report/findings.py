"""The rules' results as the report shows them: one `Finding` per rule, read from the JSON
every rule report serialises to (tensor and profiler rules alike), so the report follows
whatever the rule engine writes. Results come from `rule-output/` (what `stepscope check`
wrote) or from running the default rules now."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from ..exceptions import StepscopeError
from ..job_files import read_json

MAX_RULE_REPORT_BYTES = 64 << 20  # a report lists at most a few thousand firings

logger = logging.getLogger("stepscope")

_STATUS_ORDER = {"fired": 0, "error": 1, "not enough data": 2, "no data": 3, "ok": 4}


@dataclass(frozen=True)
class Evidence:
    where: str
    message: str
    step: int | None = None
    tensor: str | None = None
    value: Any = None
    threshold: Any = None


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
    def from_json(cls, body: dict[str, Any]) -> Finding:
        """From a rule report's JSON: today's tensor reports (`details` list), profiler reports
        (`details` dict) and the rule model's (`evidence`, `explanation`)."""
        rule = str(body.get("rule") or body.get("rule_name") or "?")
        fired = bool(body.get("fired") or body.get("status") == "fired")
        error = body.get("error") or (body.get("errors") or [None])[0]
        status = str(body.get("status") or ("fired" if fired else "error" if error else "ok"))
        if fired:
            status = "fired"
        elif status == "ok" and "datapoints" in body and not body.get("datapoints") and "steps_evaluated" not in body:
            status = "no data"  # a whole-job rule that saw no sample judged nothing
        kind = str(body.get("kind") or ("tensor" if "steps_evaluated" in body else "job"))
        items = body.get("evidence")
        if items is None:
            details = body.get("details")
            items = details if isinstance(details, list) else []
        evidence = tuple(
            Evidence(
                str(e.get("where") or (f"step {e['step']}" if e.get("step") is not None else "the whole job")), str(e.get("message", "")),
                e["step"] if type(e.get("step")) is int else None, e.get("tensor"), e.get("value"), e.get("threshold"),
            )
            for e in items if isinstance(e, dict)
        )
        statistics = body.get("statistics")
        if statistics is None and isinstance(body.get("details"), dict):
            statistics = body["details"]
        explanation = body.get("explanation") or {}
        advice = tuple(explanation.get("advice") or body.get("advice") or ())
        violations = _count(body.get("violations") or 0, "violations")
        needed = body.get("evidence_needed")
        to_save = str(needed.get("to_save") or "") if isinstance(needed, dict) else ""
        return cls(
            rule=rule, kind=kind, status=status, violations=violations, parameters=dict(body.get("parameters") or {}),
            summary=_summary(body, status, violations, evidence, error), evidence=evidence,
            fired_steps=tuple(_count(s, "fired_steps[]") for s in _list(body.get("fired_steps"))), advice=advice,
            definition=str(explanation.get("definition") or ""), statistics=dict(statistics or {}), to_save=to_save,
        )


def _count(value: Any, what: str) -> int:
    """A non-negative integer of a rule report, or ValueError (1.5, "many", 1e20, NaN)."""
    if type(value) is not int or not 0 <= value < 1 << 62:
        raise ValueError(f"{what} must be a non-negative integer, got {value!r:.60}")
    return value


def _list(value: Any) -> list[Any]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise ValueError(f"expected a list, got {type(value).__name__}")
    return value


def _summary(body: dict[str, Any], status: str, violations: int, evidence: tuple[Evidence, ...], error: Any) -> str:
    if body.get("summary") and isinstance(body["summary"], str):
        return body["summary"]
    if status == "fired":
        first = f": {evidence[0].message}" if evidence else ""
        return f"{violations} violation(s){first}"
    if status == "error":
        return str(error)
    if status == "no data":
        return str(body.get("no_data_reason") or "the data this rule needs was not saved")
    count = body.get("steps_evaluated") or body.get("datapoints") or 0
    return f"ok over {count} {'step(s)' if 'steps_evaluated' in body else 'datapoint(s)'}"


def ranked(findings: list[Finding]) -> list[Finding]:
    """Fired first (most violations first), then errors, not enough data, no data, ok."""
    return sorted(findings, key=lambda f: (_STATUS_ORDER.get(f.status, 9), -f.violations, f.rule))


def saved_findings(store: Any) -> list[Finding] | None:
    """The reports `stepscope check` wrote to rule-output/, or None when there are none."""
    from ..layout import RULE_OUTPUT_DIR

    keys = [k for k in store.list(RULE_OUTPUT_DIR + "/") if k.endswith(".json") and not k.endswith("/summary.json")]
    if not keys:
        return None
    out = []
    for key in sorted(keys):
        try:
            out.append(Finding.from_json(read_json(store, key, MAX_RULE_REPORT_BYTES, allow_nan=True)))
        except (StepscopeError, OSError, ValueError, TypeError, AttributeError) as exc:
            logger.warning("stepscope report: skipping unreadable rule report %s: %s", store.describe(key), exc)
    return out


def run_default_rules(trial: Any) -> list[Finding]:
    """Run stepscope's default rule set for this job now (`stepscope.rules.default_rules`:
    the tensor rules whose inputs were saved, the profiler rules when there is profiler data)."""
    from ..rules import default_rules, run_rules

    return [Finding.from_json(report.to_json()) for report in run_rules(default_rules(trial))]
