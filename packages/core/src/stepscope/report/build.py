"""Building a report from a job and writing it: `build_report` fills the sections from the
trial, its profiler side and the rules; `write_report` renders the HTML (and the PDF)."""

from __future__ import annotations

import logging
import os
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from ..exceptions import StepscopeError
from ..layout import REPORT_NAME
from ..outputs import atomic_output, check_output_target
from ..rules.report import RuleReport
from ..store import Store
from ..trial import Trial, create_trial
from .context import ReportContext
from .findings import Finding, run_default_rules, saved_findings
from .html import render_html
from .model import Report, Section
from .sections import BUILDERS

logger = logging.getLogger("stepscope")



@dataclass(frozen=True)
class WrittenReport:
    html: str  # where the HTML went (a local path or s3:// URL)
    pdf: str | None
    report: Report


def build_report(
    job: Trial | str | Store, findings: Sequence[Finding | RuleReport | dict[str, Any]] | None = None, *,
    rules: str = "auto", progress: Callable[[int, int], None] | None = None,
) -> Report:
    """The report of `job`. `findings` (rule reports or their JSON) are shown as given; else
    `rules` says where they come from: "saved" (rule-output/), "run" (the default rules,
    now), "auto" (saved when present, else run) or "none"."""
    if rules not in ("auto", "saved", "run", "none"):
        from ..exceptions import ConfigError

        raise ConfigError(f"rules must be auto, saved, run or none, got {rules!r}")
    trial = job if isinstance(job, Trial) else create_trial(job)
    total = len(BUILDERS) + 1
    if progress:
        progress(0, total)
    if findings is not None:
        chosen = [f if isinstance(f, Finding) else Finding.from_report(f) if isinstance(f, RuleReport) else Finding.from_json(f) for f in findings]
    else:
        chosen = _findings(trial, rules)
    if progress:
        progress(1, total)
    ctx = ReportContext(trial, chosen)
    report = Report(title=f"stepscope report: {trial.name}", source=trial.path, generated_at=time.time())
    for done, build in enumerate(BUILDERS, start=2):
        report.sections.append(_guarded(build, ctx))
        if progress:
            progress(done, total)
    return report


def _findings(trial: Trial, rules: str) -> list[Finding]:
    if rules == "none":
        return []
    saved = saved_findings(trial.store) if rules in ("auto", "saved") else None
    if saved is not None or rules == "saved":
        return saved or []
    return run_default_rules(trial)


def _guarded(build: Callable[[ReportContext], Section], ctx: ReportContext) -> Section:
    """One failing section must not lose the report: it shows the error instead."""
    try:
        return build(ctx)
    except Exception as exc:
        if isinstance(exc, (StepscopeError, OSError)):  # unreadable job data: its message names the file
            logger.warning("stepscope report: section %s failed: %s", build.__module__, exc)
        else:
            logger.exception("stepscope report: section %s failed", build.__module__)
        name = build.__module__.rsplit(".", 1)[-1]
        return Section(name, name.capitalize(), missing=[f"This section could not be built: {type(exc).__name__}: {exc}"])


def write_report(
    job: Trial | str | Store, output: str | None = None, *, pdf: bool = False,
    findings: Sequence[Finding | RuleReport | dict[str, Any]] | None = None, rules: str = "auto",
    progress: Callable[[int, int], None] | None = None, key: str = REPORT_NAME,
) -> WrittenReport:
    """Build the report and write it to `output` (a local path), or into the job's store
    at `key` (default `<job>/stepscope-report.html`, local or S3) when `output` is None.
    With `pdf`, also the PDF beside the HTML."""
    trial = job if isinstance(job, Trial) else create_trial(job)
    report = build_report(trial, findings, rules=rules, progress=progress)
    html = render_html(report).encode("utf-8")
    if output is None:
        store = trial.store
        store.write(key, html)
        html_where = store.describe(key)
        pdf_where = None
        if pdf:
            pdf_where = _pdf_into_store(store, html, os.path.splitext(key)[0] + ".pdf")
        return WrittenReport(html_where, pdf_where, report)
    pdf_path = os.path.splitext(output)[0] + ".pdf" if pdf else None
    check_output_target(output)
    if pdf_path is not None:
        check_output_target(pdf_path)  # refused before anything is written
    with atomic_output(output) as f:
        f.write(html)
    if pdf_path is not None:
        with atomic_output(pdf_path) as f:
            f.write(_pdf_bytes(html))
    return WrittenReport(output, pdf_path, report)


def _pdf_bytes(html: bytes) -> bytes:
    """The report printed by Chromium, which writes files only in a private folder."""
    from .pdf import html_to_pdf

    with tempfile.TemporaryDirectory(prefix="stepscope-report-") as tmp:
        html_path = os.path.join(tmp, REPORT_NAME)
        with open(html_path, "wb") as f:
            f.write(html)
        pdf_path = html_to_pdf(html_path, os.path.join(tmp, "report.pdf"))
        with open(pdf_path, "rb") as f:
            return f.read()


def _pdf_into_store(store: Store, html: bytes, key: str) -> str:
    store.write(key, _pdf_bytes(html))
    return store.describe(key)
