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


def test_a_compile_step_is_drawn_apart_from_the_step_histogram(tmp_path):
    """A first step of 8.3 s among 10 ms steps: the histogram spreads the others over its bins
    and its caption names the step it left out; the line chart is on a log axis."""
    import re

    import numpy as np

    from stepscope.modes import ModeKeys
    from stepscope.profiler import TimelineWriter
    from stepscope.store import open_store

    store = open_store(str(tmp_path / "job"))
    writer = TimelineWriter(store, node_id="algo-1", flush_interval_s=3600)
    rng = np.random.default_rng(3)
    now = 1_700_000_000 * 10**9
    durations = [8300.0] + list(10 + rng.random(99))
    for step, ms in enumerate(durations):
        writer.add_spans([("step", now, now + int(ms * 1e6))], step=step, mode=ModeKeys.TRAIN)
        now += int(ms * 1e6) + 1000
    writer.close()
    section = build_report(str(tmp_path / "job"), rules="none").section("steps")
    histogram = next(b for b in section.blocks if b.key == "step-histogram")
    assert "1 step drawn apart" in histogram.caption and "8.3 s (TRAIN step 0)" in histogram.caption
    # matplotlib draws each bar as a filled rectangle path (M x0 y0 L x1 y0 L x1 y1 L x0 y1 z)
    bars = re.findall(r'<path d="M [\d.]+ ([\d.]+) \s*L [\d.]+ [\d.]+ \s*L [\d.]+ ([\d.]+) [^"]*"[^>]*fill: #1f77b4', histogram.svg)
    heights = [abs(float(y0) - float(y1)) for y0, y1 in bars]
    assert sum(h > 0.01 for h in heights) > 10
    over_time = next(b for b in section.blocks if b.key == "step-over-time")
    assert "log scale" in over_time.caption
