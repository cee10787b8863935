"""`ProfilerReport` (SageMaker's name): a whole-job rule that runs every profiler rule and
writes the job's report under `rule-output/ProfilerReport/profiler-output/`, so
`stepscope check --rule ProfilerReport` (or a rules configuration with a ProfilerReport
entry) leaves the report where SageMaker users look for it. The rule catalog
(rules.registry.REPORT_RULES) names it, so `rules/` never imports the report."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from ..layout import RULE_OUTPUT_DIR
from ..rules import Action, Explanation, JobRule, Rule, RuleParams

REPORT_KEY = f"{RULE_OUTPUT_DIR}/ProfilerReport/profiler-output/profiler-report.html"


@dataclass(frozen=True)
class ProfilerReportParams(RuleParams):
    pdf: bool = False  # also print the report to PDF (headless Chromium)


class ProfilerReport(JobRule):
    """Runs every profiler rule (with `<Rule>_<parameter>` overrides, as SageMaker's
    ProfilerReport took them) and writes the HTML report of the job; fires when one of
    them fires. Rules of the same `stepscope check` run (`companions`) are shown too, and
    not run again."""

    params: ProfilerReportParams
    explanation: ClassVar[Explanation | None] = Explanation(
        definition=(
            "Runs every profiler rule (CPU/IO bottlenecks, GPU utilisation and memory, batch size, load balancing, "
            "step outliers, initialisation time, data loading, overall system usage) and writes the job's report "
            f"to {REPORT_KEY}. It fires when one of those rules fires."
        ),
        causes=("One or more profiler rules found a problem: see their evidence in the report.",),
        advice=("Open the report (a self-contained HTML file) and follow the advice of each fired rule.",),
    )

    def __init__(self, base_trial: Any = None, *, name: str | None = None, actions: Sequence[Action] = (), companions: Sequence[Rule] = (), **params: Any):
        from ..rules.config import profiler_report_rules
        from ..rules.registry import system_rules

        prefixes = {n.lower() for n in system_rules()}
        overrides = {k: params.pop(k) for k in list(params) if str(k).partition("_")[0].lower() in prefixes}
        super().__init__(base_trial, name=name, actions=actions, **params)
        profiler_report_rules(overrides)  # a wrong override fails now, naming it
        self._overrides = overrides
        self.companions: list[Rule] = list(companions)

    def evaluate(self) -> None:
        from ..rules.config import profiler_report_rules
        from ..trial import Trial, create_trial
        from .build import write_report

        companions = [rule for rule in self.companions if rule is not self]
        done = {rule.name for rule in companions}
        reports = [rule.report for rule in companions]
        reports += [rule.run(self.base_trial) for rule in profiler_report_rules(self._overrides) if rule.name not in done]
        trial = self.base_trial if isinstance(self.base_trial, Trial) else create_trial(self.profiler.store)
        written = write_report(trial, findings=reports, key=REPORT_KEY, pdf=self.params.pdf)
        report = self.report
        report.datapoints = sum(int(getattr(r, "datapoints", 0) or 0) + int(getattr(r, "steps_evaluated", 0) or 0) for r in reports)
        report.statistics = {"report": written.html, "pdf": written.pdf, "rules": {r.rule: r.status for r in reports}}
        for fired in (r for r in reports if r.fired):
            self.violation(None, f"{fired.rule} fired: {fired.summary()}", rule=fired.rule, violations=fired.violations)


def with_companions(rules: list[Any]) -> list[Any]:
    """Give every ProfilerReport in `rules` the other rules of the run, so it shows their
    reports instead of running them again."""
    for rule in rules:
        if isinstance(rule, ProfilerReport):
            rule.companions = [other for other in rules if other is not rule]
    return rules

