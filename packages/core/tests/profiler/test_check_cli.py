"""`stepscope check` on profiler data: the default set includes the profiler rules when a
job has profiler output, and a ProfilerReport entry in a rules file expands to every rule."""

import json

from stepscope.cli import main


def test_default_check_runs_profiler_rules(tmp_path, metrics_job, capsys):
    healthy = metrics_job(tmp_path / "healthy")
    idle_gpus = metrics_job(tmp_path / "idle", gpus=(3.0, 4.0), cpu=95.0)
    assert main(["check", str(healthy), "--quiet", "--no-write"]) == 0
    assert "LowGPUUtilization" in capsys.readouterr().out
    assert main(["check", str(idle_gpus), "--quiet", "--no-write"]) == 1
    out = capsys.readouterr().out
    assert "CPUBottleneck" in out and "fired" in out


def test_profiler_report_entry_expands_with_overrides(tmp_path, metrics_job, capsys):
    idle_gpus = metrics_job(tmp_path / "idle", gpus=(3.0, 4.0))
    config = tmp_path / "rules.json"
    report = {"RuleConfigurationName": "ProfilerReport", "RuleParameters": {"rule_to_invoke": "ProfilerReport"}}
    config.write_text(json.dumps([report]))
    assert main(["check", str(idle_gpus), "--rules-config", str(config), "--json", "--no-write", "--quiet"]) == 1
    reports = {r["rule"]: r for r in json.loads(capsys.readouterr().out)}
    # every profiler rule, and the ProfilerReport rule that wrote the report from them
    assert len(reports) == 11 and reports["LowGPUUtilization"]["fired"] is True and reports["ProfilerReport"]["fired"] is True
    # <rule>_<parameter> overrides reach the rule they name
    report["RuleParameters"]["LowGPUUtilization_threshold_p95"] = "2"
    report["RuleParameters"]["LowGPUUtilization_threshold_p5"] = "0"
    config.write_text(json.dumps([report]))
    main(["check", str(idle_gpus), "--rules-config", str(config), "--json", "--no-write", "--quiet"])
    reports = {r["rule"]: r for r in json.loads(capsys.readouterr().out)}
    assert reports["LowGPUUtilization"]["fired"] is False and reports["LowGPUUtilization"]["parameters"]["threshold_p95"] == 2.0
