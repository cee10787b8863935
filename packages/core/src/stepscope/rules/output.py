"""The rule-output format, written and read in this one place: `stepscope check` saves one
`RuleReport` per rule as `rule-output/<rule>.json` (the name escaped by
layout.rule_output_key, since rule names come from configuration files) and the table of
the run as `rule-output/summary.json`; the report, the app and the trace timeline read
them back here. Every file read is untrusted: one that cannot be read is named in
`problems` (relative to the job, no machine path) and the others still load."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterable
from typing import Any

from ..exceptions import StepscopeError
from ..job_files import load_json
from ..layout import RULE_OUTPUT_DIR, rule_output_key
from .report import RuleReport

logger = logging.getLogger("stepscope")

SUMMARY_KEY = f"{RULE_OUTPUT_DIR}/summary.json"
MAX_RULE_REPORT_BYTES = 64 << 20  # a report lists at most a few thousand firings
MAX_SUMMARY_BYTES = 16 << 20

# What reading one untrusted file may raise: unreadable, too large, not JSON, too deep,
# or of the wrong types.
_UNREADABLE = (StepscopeError, OSError, ValueError, TypeError, RecursionError, MemoryError)


def report_key(rule: str) -> str:
    """Where the report of the rule named `rule` is saved."""
    return rule_output_key(rule)


def save_reports(store: Any, reports: Iterable[RuleReport], path: str = "") -> None:
    """Write each report and the run's summary (one row per rule; `path` names the job)."""
    reports = list(reports)
    for report in reports:
        store.write(report_key(report.rule), json.dumps(report.to_json(), indent=1).encode())
    summary = {"path": path, "time": time.time(), "rules": [report.row() for report in reports]}
    store.write(SUMMARY_KEY, json.dumps(summary, indent=1).encode())


def load_report(store: Any, rule: str, problems: list[str] | None = None) -> RuleReport | None:
    """The saved report of the rule named `rule`; None when there is none or it cannot be
    read (then `problems` gets a line naming the file and what was wrong)."""
    return _load(store, report_key(rule), problems, missing_ok=True)


def load_reports(store: Any, problems: list[str] | None = None) -> list[RuleReport] | None:
    """Every report saved under rule-output/, in file order; None when there are none.
    One that cannot be read is left out, logged, and named in `problems`."""
    keys = sorted(k for k in store.list(RULE_OUTPUT_DIR + "/") if k.endswith(".json") and k != SUMMARY_KEY and k.count("/") == 1)
    if not keys:
        return None
    loaded = (_load(store, key, problems) for key in keys)
    return [report for report in loaded if report is not None]


def load_summary(store: Any, problems: list[str] | None = None) -> list[dict[str, Any]]:
    """The rows of rule-output/summary.json (rule, kind, status, fired, violations,
    summary, to_save); [] when there is none or it cannot be read (named in `problems`)."""
    try:
        data = load_json(store.read(SUMMARY_KEY, max_size=MAX_SUMMARY_BYTES), SUMMARY_KEY, allow_nan=True)
    except FileNotFoundError:
        return []
    except _UNREADABLE as exc:
        _problem(problems, SUMMARY_KEY, exc)
        return []
    rows = data.get("rules") if isinstance(data, dict) else None
    if not isinstance(rows, list):
        _problem(problems, SUMMARY_KEY, "no list of rules")
        return []
    return [row for row in rows if isinstance(row, dict)]


def _load(store: Any, key: str, problems: list[str] | None, missing_ok: bool = False) -> RuleReport | None:
    try:
        body = load_json(store.read(key, max_size=MAX_RULE_REPORT_BYTES), key, allow_nan=True)
        return RuleReport.from_json(body)
    except FileNotFoundError:
        if not missing_ok:
            _problem(problems, key, "vanished while it was read")
        return None
    except _UNREADABLE as exc:
        logger.warning("stepscope: skipping unreadable rule report %s: %s", key, exc)
        _problem(problems, key, exc)
        return None


def _problem(problems: list[str] | None, key: str, fault: BaseException | str) -> None:
    """One line naming the job's file and its fault, without a path of the machine."""
    if problems is not None:
        text = str(fault)
        problems.append(text if text.startswith(key) else f"{key}: {text[:200]}")


__all__ = ["SUMMARY_KEY", "MAX_RULE_REPORT_BYTES", "report_key", "save_reports", "load_report", "load_reports", "load_summary"]
