"""What the section builders share: the trial, its profiler side and the rules' findings,
each read once through their public APIs."""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pandas as pd

from ..trial import Trial
from .findings import Finding
from .model import Section

logger = logging.getLogger("stepscope")


@dataclass
class ReportContext:
    trial: Trial
    findings: list[Finding]

    @functools.cached_property
    def profiler(self) -> Any:
        return self.trial.profiler

    @functools.cached_property
    def timeline(self) -> pd.DataFrame:
        """The step timeline (empty when the job recorded none or it cannot be read)."""
        try:
            return self.profiler.step_timeline()
        except Exception as exc:  # a broken timeline must not lose the rest of the report
            logger.warning("stepscope report: cannot read the step timeline: %s", exc)
            return pd.DataFrame(columns=["node_id", "rank", "framework", "mode", "step", "phase", "name", "start_ns", "end_ns", "duration_ms", "args"])

    def system_metrics(self, names: list[str]) -> pd.DataFrame:
        try:
            return self.profiler.system_metrics(names=names)
        except Exception as exc:
            logger.warning("stepscope report: cannot read system metrics: %s", exc)
            return pd.DataFrame(columns=["timestamp", "node_id", "type", "name", "dimension", "value"])

    def fill(self, section: Section, *parts: Callable[[ReportContext, Section], None]) -> Section:
        """`section` with each part (a function adding figures, tables or missing-data lines)
        run on it in order."""
        for part in parts:
            part(self, section)
        return section

    def finding(self, rule: str) -> Finding | None:
        return next((f for f in self.findings if f.rule == rule), None)

    def fired_marks(self) -> list[tuple[float, str]]:
        """(global step, rule) for the first steps where tensor rules fired, for the curves."""
        marks = []
        for finding in self.findings:
            if finding.fired and finding.kind == "tensor":
                marks += [(float(step), f"{finding.rule} fired") for step in finding.fired_steps[:5]]
        return marks

    def flagged_tensors(self) -> list[str]:
        """The tensors the rules' evidence names (fired rules first), so a chart that shows
        only some tensors always shows these."""
        names: list[str] = []
        for finding in sorted(self.findings, key=lambda f: not f.fired):
            names += [e.tensor for e in finding.evidence if e.tensor and e.tensor not in names]
        return names

    def flagged_first(self, names: list[str]) -> list[str]:
        """`names` with the flagged tensors among them moved to the front (a chart keeps the
        first N)."""
        flagged = set(self.flagged_tensors())
        return [n for n in names if n in flagged] + [n for n in names if n not in flagged]
