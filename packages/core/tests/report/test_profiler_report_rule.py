"""The ProfilerReport rule (SageMaker's name) through `stepscope check`: it runs the
profiler rules and writes the report under rule-output/ProfilerReport/."""

from __future__ import annotations

import json
import os
import re

from stepscope.cli import main
from stepscope.report.profiler_report import REPORT_KEY, ProfilerReport
from stepscope.rules.profiler import run_profiler_rules
from stepscope.rules.registry import describe_rules, rule_class


def _rules_table(html: str) -> dict[str, list[str]]:
    """Both rule tables: those that could judge, and those that could not (folded)."""
    rows = []
    for key in ("rules", "rules-not-judged"):
        found = re.search(rf'<table data-table="{key}">.*?<tbody>(.*?)</tbody>', html, re.S)
        if found:
            rows += [re.findall(r"<td[^>]*>(.*?)</td>", row, re.S) for row in re.findall(r"<tr>(.*?)</tr>", found.group(1), re.S)]
    return {row[0]: row for row in rows}


def test_check_rule_profiler_report_writes_the_report(profiler_job, capsys):
    code = main(["check", profiler_job, "--rule", "ProfilerReport", "--json", "--quiet"])
    (body,) = json.loads(capsys.readouterr().out)
    expected = {r.rule: r for r in run_profiler_rules(profiler_job)}
    assert body["rule"] == "ProfilerReport" and body["statistics"]["rules"] == {name: r.status for name, r in expected.items()}
    fired = [name for name, r in expected.items() if r.fired]
    assert code == (1 if fired else 0) and body["violations"] == len(fired)
    path = os.path.join(profiler_job, REPORT_KEY)
    assert body["statistics"]["report"] == path
    rows = _rules_table(open(path, encoding="utf-8").read())
    assert set(rows) == set(expected)
    for name, report in expected.items():
        assert rows[name][2] == report.status and rows[name][3] == str(report.violations)


def test_overrides_reach_the_rule_they_name_and_bad_ones_are_named(profiler_job, capsys):
    assert main(["check", profiler_job, "--rule", "ProfilerReport:StepOutlier_stddev=100", "--json", "--quiet"]) == 0
    html = open(os.path.join(profiler_job, REPORT_KEY), encoding="utf-8").read()
    assert "stddev=100" in _rules_table(html)["StepOutlier"][5]
    capsys.readouterr()
    assert main(["check", profiler_job, "--rule", "ProfilerReport:StepOutlier_nonsense=1", "--quiet"]) == 2
    assert "nonsense" in capsys.readouterr().err


def test_rules_of_the_same_run_are_shown_not_run_again(profiler_job, capsys):
    main(["check", profiler_job, "--rule", "StepOutlier:stddev=1", "--rule", "ProfilerReport", "--json", "--quiet"])
    reports = {r["rule"]: r for r in json.loads(capsys.readouterr().out)}
    html = open(os.path.join(profiler_job, REPORT_KEY), encoding="utf-8").read()
    row = _rules_table(html)["StepOutlier"]
    assert "stddev=1" in row[5] and row[3] == str(reports["StepOutlier"]["violations"])


def test_known_by_name_not_in_the_default_set():
    assert rule_class("profilerreport") is ProfilerReport
    entry = next(e for e in describe_rules() if e["name"] == "ProfilerReport")
    assert entry["kind"] == "job" and entry["default"] is False and entry["parameters"] == {"pdf": False}
