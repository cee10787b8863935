"""System usage and steps sections against what the profiler rules and reader return."""

from __future__ import annotations

import pytest

from stepscope.profiler import create_profiler_trial
from stepscope.report import build_report
from stepscope.rules.profiler import OverallSystemUsage


def test_system_usage_equals_the_rule(profiler_job):
    report = build_report(profiler_job, rules="none")
    section = report.section("system")
    expected = OverallSystemUsage().run(create_profiler_trial(profiler_job)).statistics["nodes"]["algo-1"]
    rows = {row[1]: row for row in section.table("system-usage").rows}
    assert set(rows) == set(expected)
    for dimension, stats in expected.items():
        assert rows[dimension][2:] == pytest.approx((stats["max"], stats["p99"], stats["p95"], stats["p50"], stats["min"]))
    assert any(b.key == "over-time-CPUUtilization" for b in section.blocks)
    assert any(b.key == "over-time-GPUUtilization" for b in section.blocks)


def test_steps_and_phases_equal_the_timeline(profiler_job):
    report = build_report(profiler_job, rules="run")
    section = report.section("steps")
    timeline = create_profiler_trial(profiler_job).step_timeline()
    steps = timeline[timeline["phase"] == "step"]["duration_ms"]
    (row,) = section.table("step-durations").rows
    assert row[:3] == ("TRAIN", 0, 40)
    assert row[3:] == pytest.approx((steps.mean(), steps.median(), steps.quantile(0.95), steps.max()))
    phases = {r[0]: r for r in section.table("phases").rows}
    assert list(phases) == ["data", "forward", "backward", "optimizer"]
    assert phases["forward"][4] == pytest.approx(timeline[timeline["phase"] == "forward"]["duration_ms"].sum())
    assert phases["forward"][5] == "40.0 %"
    outliers = section.table("step-outliers").rows
    assert [r[2] for r in outliers] == [25]
    # Job times: the training loop runs from the first step's start to the last one's end.
    times = dict(report.section("summary").table("job-times").rows)
    assert times["training loop"] == f"{(timeline['end_ns'].max() - timeline['start_ns'].min()) / 1e9:.2f} s"
