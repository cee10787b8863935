"""The trace rules on the one rule model: violations at the steps the checks flag, with the
rank in the evidence; "no data" without traces; named like any rule in `stepscope check`."""

from __future__ import annotations

import json

from stepscope.cli import main
from stepscope.rules.traces import HighLaunchLatency, ManySyncsPerStep, MemcpyBoundStep, SmallKernelsDominating
from stepscope.traces import TraceAnalysis, checks


def test_rules_report_the_steps_the_checks_flag(synth_job):
    job, truths = synth_job()
    analysis = TraceAnalysis(job)
    expected = checks.high_launch_latency(analysis, threshold_us=100.0)
    report = HighLaunchLatency(str(job), threshold_us=100.0).run()
    assert report.fired == bool(expected.fired.any())
    flagged = sorted(zip(expected[expected.fired]["step"], expected[expected.fired]["rank"]))
    evidence = sorted((e.step, e.data["rank"]) for e in report.evidence)
    assert evidence == flagged and report.datapoints == len(expected)
    quiet = ManySyncsPerStep(str(job), max_syncs=1).run()  # the generator syncs once per step
    assert not quiet.fired and quiet.status == "ok"
    assert ManySyncsPerStep(str(job), max_syncs=0).run().violations == sum(len(t.step_ns) for t in truths.values())
    assert SmallKernelsDominating(str(job), max_kernel_us=1e6, min_share=0.5).run().fired


def test_no_traces_is_no_data(tmp_path):
    report = MemcpyBoundStep(str(tmp_path)).run()
    assert report.status == "no data" and "detailed traces" in report.no_data_reason


def test_check_cli_names_trace_rules(synth_job, capsys):
    job, _ = synth_job(world_size=1)
    assert main(["check", str(job), "--rule", "ManySyncsPerStep:max_syncs=0", "--json", "--no-write", "--quiet"]) == 1
    reports = {r["rule"]: r for r in json.loads(capsys.readouterr().out)}
    assert reports["ManySyncsPerStep"]["fired"] is True
