"""What a rule run produces: one `RuleReport` per rule (tensor or whole-job), made of
`Evidence` items (where, what was measured, against which threshold) and the rule's
`Explanation` (definition, likely causes, advice). Also the one JSON sanitizer and the one
table formatter every consumer (CLI, report, UI, webhooks) uses."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, TextIO

import numpy as np

# A report keeps this many evidence items; the violation count keeps going.
MAX_EVIDENCE = 100
MAX_FIRED_STEPS = 1000
MAX_ERRORS = 20

STATUSES = ("fired", "error", "no data", "not enough data", "ok")
# The statuses of a rule that judged the job (found a problem or found none with the
# evidence it needs); the others could not judge.
JUDGED = ("fired", "ok")


def jsonable(value: Any) -> Any:
    """`value` made of plain JSON types. numpy scalars and arrays become numbers and lists;
    non-finite floats become the strings "NaN", "Infinity", "-Infinity" (what JavaScript's
    Number() reads back), so a NaN loss stays visible in a report instead of turning null."""
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    if isinstance(value, np.integer):
        return int(value)
    if isinstance(value, (float, np.floating)):
        number = float(value)
        if math.isfinite(number):
            return number
        return "NaN" if math.isnan(number) else ("Infinity" if number > 0 else "-Infinity")
    if isinstance(value, np.ndarray):
        return jsonable(value.tolist())
    if isinstance(value, Mapping):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [jsonable(v) for v in value]
    if hasattr(value, "to_json"):
        return jsonable(value.to_json())
    if value is None or isinstance(value, (str, int)):
        return value
    return str(value)


def step_label(step: int | None, mode: str | None = None, mode_step: int | None = None) -> str:
    """`TRAIN step 250 (global 270)`; `global step 270 (TRAIN)` when only the global step
    is known; `global step 270` when the mode is not known."""
    if step is None:
        return f"{mode} step {mode_step}" if mode is not None and mode_step is not None else "the whole job"
    if mode is None or mode == "GLOBAL":
        return f"global step {step}"
    if mode_step is None:  # a timeline's step: its global step, with its mode
        return f"global step {step} ({mode})"
    return f"{mode} step {mode_step} (global {step})"


@dataclass(frozen=True)
class Explanation:
    """What a rule checks and what to do when it fires: shown by `stepscope check
    --explain RULE`, in reports and in the web UI."""

    definition: str
    causes: tuple[str, ...] = ()
    advice: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {"definition": self.definition, "causes": list(self.causes), "advice": list(self.advice)}

    def render(self) -> str:
        lines = [self.definition]
        if self.causes:
            lines += ["", "Likely causes:"] + [f"  - {c}" for c in self.causes]
        if self.advice:
            lines += ["", "What to do:"] + [f"  - {a}" for a in self.advice]
        return "\n".join(lines)


@dataclass(frozen=True)
class Evidence:
    """One violation: where (global step and its mode step; None for whole-job findings),
    which tensor or resource, the measured value and the threshold it crossed, a message,
    and rule-specific extras in `data`."""

    message: str
    step: int | None = None
    mode: str | None = None
    mode_step: int | None = None
    tensor: str | None = None
    value: float | None = None
    threshold: float | None = None
    data: Mapping[str, Any] = field(default_factory=dict)
    # The `where` a saved report gave (older ones wrote "step 12"); None: from the step.
    label: str | None = None

    @property
    def where(self) -> str:
        return self.label or step_label(self.step, self.mode, self.mode_step)

    @classmethod
    def from_json(cls, item: Mapping[str, Any]) -> Evidence:
        """One evidence item of a saved report (untrusted: fields of the wrong type are dropped)."""
        step, mode_step, mode = _int_or_none(item.get("step")), _int_or_none(item.get("mode_step")), item.get("mode")
        where = item.get("where")
        label = str(where) if where else (f"step {step}" if step is not None and mode is None else None)
        tensor = item.get("tensor")
        data = {k: v for k, v in item.items() if k not in _EVIDENCE_FIELDS}
        return cls(
            str(item.get("message", "")), step, str(mode) if isinstance(mode, str) else None, mode_step,
            str(tensor) if tensor is not None else None, item.get("value"), item.get("threshold"), data, label,
        )

    def to_json(self) -> dict[str, Any]:
        body = {
            "step": self.step, "mode": self.mode, "mode_step": self.mode_step, "where": self.where,
            "tensor": self.tensor, "value": self.value, "threshold": self.threshold, "message": self.message,
        }
        body.update({k: v for k, v in self.data.items() if k not in body})
        return jsonable(body)


@dataclass
class RuleReport:
    """What one rule found. `fired` follows from the violations the rule reported; `status`
    is "fired", "error" (the rule could not judge some data), "no data" (nothing it needs was
    saved) or "ok". Tensor rules count `steps_evaluated`; whole-job rules count `datapoints`
    (samples, steps) and put their measurements in `statistics`."""

    rule: str
    rule_class: str
    kind: str  # "tensor" (step by step) or "job" (whole job: profiler data, traces)
    parameters: dict[str, Any]
    explanation: Explanation | None = None
    evidence: list[Evidence] = field(default_factory=list)
    violations: int = 0
    fired_steps: list[int] = field(default_factory=list)
    steps_evaluated: int = 0
    first_step: int | None = None
    last_step: int | None = None
    datapoints: int = 0
    tensors_inspected: int = 0
    statistics: dict[str, Any] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)
    no_data_reason: str | None = None
    # The evidence the rule needs to judge, and what it had: `needed` and `available` count
    # `evidence_unit` ("saved TRAIN losses", "evaluations", ...); `to_save` says how a job
    # gives it. Set by the rule (Rule.need); None where the rule did not say.
    needed: int | None = None
    available: int | None = None
    evidence_unit: str = ""
    to_save: str = ""
    # Values of that kind the job saved but the rule could not use: NaN or infinite (a loss
    # that blew up). Where they made the shortfall, saving more often would not help, and
    # `to_save` says so (`need`).
    non_finite: int = 0
    # A report read back from its JSON (from_json) keeps the status and summary it was
    # saved with, whatever version of stepscope wrote it.
    saved_status: str | None = field(default=None, repr=False)
    saved_summary: str | None = field(default=None, repr=False)

    @property
    def fired(self) -> bool:
        return self.violations > 0 if self.saved_status is None else self.saved_status == "fired"

    @property
    def details(self) -> list[dict[str, Any]]:
        """The evidence as JSON dicts (extras flattened in)."""
        return [e.to_json() for e in self.evidence]

    @property
    def status(self) -> str:
        if self.saved_status is not None:
            return self.saved_status
        if self.fired:
            return "fired"
        if self.errors:
            return "error"
        if self.needed is not None and (self.available or 0) < self.needed:
            return "no data" if not self.available else "not enough data"
        if self.no_data_reason is not None:
            return "no data"
        if self.kind == "tensor" and (not self.steps_evaluated or not self.tensors_inspected):
            return "no data"
        if self.kind == "job" and not self.datapoints:
            return "no data"
        return "ok"

    @property
    def judged(self) -> bool:
        """Whether the rule could judge the job: it fired, or found nothing with the
        evidence it needs ("ok"). "no data", "not enough data" and "error" could not."""
        return self.status in JUDGED

    def need(self, needed: int, available: int, unit: str, to_save: str = "", *, non_finite: int = 0, finite_what: str = "values") -> None:
        """State the evidence the rule needs (`needed` `unit`) and what the job gave it;
        `non_finite`: how many more it saved that were NaN or infinite. When those would
        have been enough, what to save is `finite_what` that stay finite, not more of them."""
        self.needed, self.available, self.evidence_unit = int(needed), int(available), unit
        self.non_finite = int(non_finite)
        if to_save:
            self.to_save = to_save
        if self.available < self.needed <= self.available + self.non_finite:
            self.to_save = f"finite {finite_what}, not NaN/inf ones"

    def add(self, evidence: Evidence) -> None:
        """Record one violation (kept up to MAX_EVIDENCE items; the count keeps going)."""
        self.violations += 1
        if len(self.evidence) < MAX_EVIDENCE:
            self.evidence.append(evidence)
        if evidence.step is not None and len(self.fired_steps) < MAX_FIRED_STEPS and evidence.step not in self.fired_steps:
            self.fired_steps.append(evidence.step)

    def error(self, message: str) -> None:
        if len(self.errors) < MAX_ERRORS:
            self.errors.append(message)

    def summary(self) -> str:
        """One line: the first violation with its step, or why there is nothing to say."""
        if self.saved_summary is not None:
            return self.saved_summary
        status = self.status
        if status == "fired":
            first = self.evidence[0] if self.evidence else None
            where = f"first at {first.where}: {first.message}" if first else ""
            steps = f" at {len(self.fired_steps)} step(s)" if self.fired_steps else ""
            return f"{self.violations} violation(s){steps}; {where}".rstrip("; ")
        if status == "error":
            return self.errors[0]
        if status == "not enough data":
            return f"not enough data (needs {self.needed} {self.evidence_unit}, has {self.available}{self._non_finite_note()})"
        if status == "no data":
            if self.no_data_reason:
                return self.no_data_reason
            if self.needed is not None:
                return f"no data (needs {self.needed} {self.evidence_unit}, has 0{self._non_finite_note()})"
            if self.kind == "tensor" and not self.steps_evaluated:
                return "no steps to evaluate"
            return "no matching tensors were saved" if self.kind == "tensor" else "no data"
        if self.kind == "job":
            return f"ok over {self.datapoints} datapoint(s)"
        return f"ok over {self.steps_evaluated} step(s)"

    def _non_finite_note(self) -> str:
        return f"; {self.non_finite} more were NaN or infinite" if self.non_finite else ""

    def to_json(self) -> dict[str, Any]:
        return jsonable(
            {
                "rule": self.rule, "rule_class": self.rule_class, "kind": self.kind, "status": self.status,
                "fired": self.fired, "violations": self.violations, "summary": self.summary(),
                "fired_steps": self.fired_steps, "details": self.details, "parameters": self.parameters,
                "steps_evaluated": self.steps_evaluated, "first_step": self.first_step, "last_step": self.last_step,
                "datapoints": self.datapoints, "tensors_inspected": self.tensors_inspected,
                "statistics": self.statistics, "errors": self.errors, "no_data_reason": self.no_data_reason,
                "judged": self.judged, "evidence_needed": self.evidence_json(), "explanation": self.explanation,
            }
        )

    def evidence_json(self) -> dict[str, Any] | None:
        """{"needed", "available", "unit", "to_save"} where the rule stated its evidence, with
        "non_finite" where some of it was NaN or infinite."""
        if self.needed is None:
            return {"to_save": self.to_save} if self.to_save else None
        body = {"needed": self.needed, "available": self.available, "unit": self.evidence_unit, "to_save": self.to_save}
        if self.non_finite:
            body["non_finite"] = self.non_finite
        return body

    @classmethod
    def from_json(cls, body: Any) -> RuleReport:
        """A report back from its JSON: `to_json()`'s, or the shapes older versions wrote
        (tensor reports with a `details` list, profiler reports with `details` statistics
        and an `error` string). A saved report is untrusted input: `violations` and
        `fired_steps` that are not non-negative integers raise ValueError naming them;
        other fields of the wrong type are dropped. The saved status and summary are kept."""
        if not isinstance(body, Mapping):
            raise ValueError(f"a rule report must be a JSON object, got {type(body).__name__}")
        errors = [str(e) for e in _list(body.get("errors"), "errors")] or ([str(body["error"])] if body.get("error") else [])
        fired = bool(body.get("fired") or body.get("status") == "fired")
        status = "fired" if fired else str(body.get("status") or ("error" if errors else "ok"))
        if status == "ok" and "datapoints" in body and not body.get("datapoints") and "steps_evaluated" not in body:
            status = "no data"  # a whole-job rule that saw no sample judged nothing
        details = body.get("details")
        items = body.get("evidence")
        items = items if isinstance(items, list) else details if isinstance(details, list) else []
        statistics = body.get("statistics")
        statistics = statistics if isinstance(statistics, Mapping) else details if isinstance(details, Mapping) else {}
        raw_needed = body.get("evidence_needed")
        needed: Mapping[str, Any] = raw_needed if isinstance(raw_needed, Mapping) else {}
        parameters = body.get("parameters")
        report = cls(
            rule=str(body.get("rule") or body.get("rule_name") or "?"),
            rule_class=str(body.get("rule_class") or body.get("rule") or "?"),
            kind=str(body.get("kind") or ("tensor" if "steps_evaluated" in body else "job")),
            parameters=dict(parameters) if isinstance(parameters, Mapping) else {},
            explanation=_explanation(body),
            evidence=[Evidence.from_json(e) for e in items if isinstance(e, Mapping)],
            violations=_count(body.get("violations") or 0, "violations"),
            fired_steps=[_count(s, "fired_steps[]") for s in _list(body.get("fired_steps"), "fired_steps")],
            steps_evaluated=_int_or_none(body.get("steps_evaluated")) or 0,
            first_step=_int_or_none(body.get("first_step")),
            last_step=_int_or_none(body.get("last_step")),
            datapoints=_int_or_none(body.get("datapoints")) or 0,
            tensors_inspected=_int_or_none(body.get("tensors_inspected")) or 0,
            statistics=dict(statistics),
            errors=errors,
            no_data_reason=str(body["no_data_reason"]) if body.get("no_data_reason") else None,
            needed=_int_or_none(needed.get("needed")),
            available=_int_or_none(needed.get("available")),
            evidence_unit=str(needed.get("unit") or ""),
            to_save=str(needed.get("to_save") or body.get("to_save") or ""),
            non_finite=_int_or_none(needed.get("non_finite")) or 0,
            saved_status=status,
        )
        summary = body.get("summary")
        report.saved_summary = summary if isinstance(summary, str) and summary else report._saved_default_summary()
        return report

    def _saved_default_summary(self) -> str:
        """The summary of a saved report that carries none (older versions)."""
        status = self.status
        if status == "fired":
            return f"{self.violations} violation(s)" + (f": {self.evidence[0].message}" if self.evidence else "")
        if status == "error":
            return self.errors[0] if self.errors else "error"
        if status == "no data":
            return self.no_data_reason or "the data this rule needs was not saved"
        if self.kind == "tensor" or self.steps_evaluated:
            return f"ok over {self.steps_evaluated} step(s)"
        return f"ok over {self.datapoints} datapoint(s)"

    def row(self) -> dict[str, Any]:
        """The report's one-line form: rule, kind, status, violations, summary, and for a
        rule that could not judge, what to save for it."""
        row = {"rule": self.rule, "kind": self.kind, "status": self.status, "fired": self.fired, "violations": self.violations, "summary": self.summary()}
        if not self.judged and self.to_save:
            row["to_save"] = self.to_save
        return row


_EVIDENCE_FIELDS = frozenset(("message", "step", "mode", "mode_step", "tensor", "value", "threshold", "where"))


def _int_or_none(value: Any) -> int | None:
    """A saved integer field: a plain int (not a bool, not a float), else None."""
    return value if type(value) is int else None


def _count(value: Any, what: str) -> int:
    """A non-negative integer of a saved report, or ValueError (1.5, "many", 1e20, NaN)."""
    if type(value) is not int or not 0 <= value < 1 << 62:
        raise ValueError(f"{what} must be a non-negative integer, got {value!r:.60}")
    return value


def _list(value: Any, what: str) -> list[Any]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise ValueError(f"{what} must be a list, got {type(value).__name__}")
    return value


def _strings(value: Any) -> tuple[str, ...]:
    return tuple(str(v) for v in value) if isinstance(value, (list, tuple)) else ()


def _explanation(body: Mapping[str, Any]) -> Explanation | None:
    """A saved report's explanation (advice may sit at the top level in older reports)."""
    raw = body.get("explanation")
    raw = raw if isinstance(raw, Mapping) else {}
    advice = _strings(raw.get("advice") or body.get("advice"))
    if not raw and not advice:
        return None
    return Explanation(str(raw.get("definition") or ""), _strings(raw.get("causes")), advice)


def judged_line(reports: Iterable[RuleReport]) -> str:
    """`7 of 9 rule(s) could judge; for the others save: losses every step (LossNotDecreasing,
    Overfit)` (CLI, report and app summaries)."""
    reports = list(reports)
    judged = [r for r in reports if r.judged]
    line = f"{len(judged)} of {len(reports)} rule(s) could judge"
    if len(judged) < len(reports):
        hints = to_save_hints((r.rule, r.to_save) for r in reports if not r.judged)
        line += "; for the others save: " + hints if hints else "; see their status for why the others could not"
    return line


def to_save_hints(needs: Iterable[tuple[str, str]]) -> str:
    """`losses every step (A, B); weights (C)` from (rule, what to save) pairs."""
    by_hint: dict[str, list[str]] = {}
    for rule, hint in needs:
        if hint:
            by_hint.setdefault(hint, []).append(rule)
    return "; ".join(f"{hint} ({', '.join(rules)})" for hint, rules in by_hint.items())


def format_table(reports: Iterable[RuleReport], out: TextIO, *, width: int = 110) -> None:
    """The reports as a table, one row each (the CLI's output)."""
    reports = list(reports)
    rows = [r.row() for r in reports]
    if not rows:
        print("no rules were run", file=out)
        return
    name_width = max(len(r["rule"]) for r in rows)
    status_width = max(7, *(len(r["status"]) for r in rows))
    print(f"{'RULE':<{name_width}}  {'STATUS':<{status_width}}  {'VIOLATIONS':>10}  DETAIL", file=out)
    for row in rows:
        summary = row["summary"] if len(row["summary"]) <= width else row["summary"][: width - 3] + "..."
        print(f"{row['rule']:<{name_width}}  {row['status']:<{status_width}}  {row['violations']:>10}  {summary}", file=out)
    print(judged_line(reports), file=out)


__all__ = ["Evidence", "Explanation", "RuleReport", "jsonable", "step_label", "format_table", "judged_line", "to_save_hints", "MAX_EVIDENCE", "STATUSES", "JUDGED"]
