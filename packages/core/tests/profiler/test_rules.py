"""Profiler rules: each fires on a job that plants its condition and stays silent on a
healthy one; construction from keyword strings, smdebug_rulesconfig objects and dicts."""

from __future__ import annotations

import json
import time

import numpy as np
import pytest

from stepscope.exceptions import ConfigError
from stepscope.modes import ModeKeys
from stepscope.profiler import (
    PROFILER_RULES,
    BatchSize,
    CPUBottleneck,
    Dataloader,
    GPUMemoryIncrease,
    IOBottleneck,
    LoadBalancing,
    LowGPUUtilization,
    MaxInitializationTime,
    OverallSystemUsage,
    ProfilerTrial,
    StepOutlier,
    TimelineWriter,
    from_rulesconfig,
    profiler_report_rules,
    run_profiler_rules,
)

T0 = 1_700_000_000.0
REPORT_KEYS = {"rule", "rule_class", "kind", "status", "fired", "violations", "summary", "fired_steps", "details", "parameters", "steps_evaluated", "first_step", "last_step", "datapoints", "tensors_inspected", "statistics", "errors", "no_data_reason", "explanation",
               "judged", "evidence_needed"}


@pytest.fixture
def healthy(tmp_path, metrics_job, step_timeline_job):
    metrics_job(tmp_path)
    step_timeline_job(tmp_path)
    return ProfilerTrial(tmp_path)


def test_registry_has_the_ten_rules():
    assert sorted(PROFILER_RULES) == sorted(
        ["CPUBottleneck", "IOBottleneck", "LowGPUUtilization", "GPUMemoryIncrease", "BatchSize",
         "LoadBalancing", "StepOutlier", "MaxInitializationTime", "Dataloader", "OverallSystemUsage"]
    )


def test_a_healthy_job_fires_nothing_with_default_parameters(healthy):
    reports = [r.to_json() for r in run_profiler_rules(healthy)]
    assert [r["rule"] for r in reports] == list(PROFILER_RULES)
    for report in reports:
        assert set(report) == REPORT_KEYS, report
        assert report["fired"] is False, report
        json.dumps(report)  # plain JSON all the way down
    by_rule = {r["rule"]: r for r in reports}
    assert by_rule["CPUBottleneck"]["datapoints"] == 1300 - 1000  # after patience
    assert by_rule["StepOutlier"]["datapoints"] == 39
    assert by_rule["OverallSystemUsage"]["statistics"]["nodes"]["algo-1"]["GPUUtilization"]["p50"] == pytest.approx(85, abs=2)


def _fires(trial, rule):
    report = rule.run(trial).to_json()
    assert report["fired"] is True, report
    assert report["violations"] > 0 and report["datapoints"] > 0
    return report


def test_cpu_bottleneck(tmp_path, metrics_job):
    trial = ProfilerTrial(metrics_job(tmp_path, cpu=96.0, gpus=(5.0, 5.0)))
    report = _fires(trial, CPUBottleneck())
    assert report["statistics"]["bottleneck_percent"] > 90


def test_io_bottleneck(tmp_path, metrics_job):
    trial = ProfilerTrial(metrics_job(tmp_path, iowait=70.0, gpus=(4.0, 4.0)))
    _fires(trial, IOBottleneck())
    assert not CPUBottleneck().run(trial).fired


def test_low_gpu_utilization_underused_and_fluctuating(tmp_path, metrics_job):
    fluctuating = lambda i: np.where(i % 2 == 0, 0.0, 100.0)  # noqa: E731
    trial = ProfilerTrial(metrics_job(tmp_path, gpus=(85.0, 20.0), gpu_memory=(40.0, 40.0)))
    report = _fires(trial, LowGPUUtilization())
    assert report["statistics"]["gpus"]["algo-1/gpu1"]["underutilized_windows"] == 1
    assert report["statistics"]["gpus"]["algo-1/gpu0"]["underutilized_windows"] == 0
    other = ProfilerTrial(metrics_job(tmp_path / "f", gpus=(85.0, fluctuating)))
    report = _fires(other, LowGPUUtilization(patience="100", window="200"))
    assert report["statistics"]["gpus"]["algo-1/gpu1"]["fluctuating_windows"] == 6


def test_gpu_memory_increase(tmp_path, metrics_job):
    leak = lambda i: np.where(i < 1200, 30.0, 60.0)  # noqa: E731
    trial = ProfilerTrial(metrics_job(tmp_path, gpu_memory=(40.0, leak)))
    report = _fires(trial, GPUMemoryIncrease())
    assert report["violations"] == 1
    assert report["statistics"]["increases"][0]["gpu"] == "algo-1/gpu1"
    assert report["statistics"]["increases"][0]["to"] - report["statistics"]["increases"][0]["from"] == pytest.approx(30, abs=1)


def test_batch_size(tmp_path, metrics_job):
    trial = ProfilerTrial(metrics_job(tmp_path, cpu=20.0, gpus=(30.0, 30.0), gpu_memory=(15.0, 15.0)))
    report = _fires(trial, BatchSize())
    assert report["statistics"]["samples_over_threshold"] == 2  # one window per GPU


def test_load_balancing(tmp_path, metrics_job):
    trial = ProfilerTrial(metrics_job(tmp_path, gpus=(92.0, 15.0)))
    report = _fires(trial, LoadBalancing())
    assert report["statistics"]["worst_pairs"][0]["gpus"] == ["algo-1/gpu0", "algo-1/gpu1"]
    assert report["statistics"]["worst_pairs"][0]["distance"] == pytest.approx(0.77, abs=0.03)


def test_load_balancing_across_nodes(tmp_path, metrics_job):
    metrics_job(tmp_path, nodes=("algo-1",), gpus=(90.0,), gpu_memory=(40.0,))
    metrics_job(tmp_path, nodes=("algo-2",), gpus=(10.0,), gpu_memory=(40.0,))
    assert LoadBalancing().run(ProfilerTrial(tmp_path)).fired


def test_max_initialization_time(tmp_path, metrics_job, step_timeline_job):
    # System metrics from T0 every 30 s for 40 minutes; the first step comes 25 minutes in.
    metrics_job(tmp_path, samples=80, interval_s=30.0)
    step_timeline_job(tmp_path, first_step_at=T0 + 25 * 60)
    report = _fires(ProfilerTrial(tmp_path), MaxInitializationTime())
    assert report["statistics"]["initialization_minutes"] == pytest.approx(25, abs=0.01)
    assert not MaxInitializationTime(threshold="30").run(ProfilerTrial(tmp_path)).fired


def test_max_initialization_time_without_any_step(tmp_path, metrics_job):
    metrics_job(tmp_path, samples=50, interval_s=30.0)  # 24.5 minutes, no step at all
    report = _fires(ProfilerTrial(tmp_path), MaxInitializationTime())
    assert report["statistics"]["first_step_start"] is None


def test_dataloader(tmp_path, metrics_job, step_timeline_job):
    metrics_job(tmp_path, children=0, cores=4)
    step_timeline_job(tmp_path)
    report = _fires(ProfilerTrial(tmp_path), Dataloader())
    assert report["statistics"]["nodes"]["algo-1"] == {"cores": 4, "dataloader_processes": 0, "percent_of_cores": 0.0}
    assert report["statistics"]["data_wait_percent_of_step_time"] == pytest.approx(25, abs=1)
    too_many = ProfilerTrial(metrics_job(tmp_path / "many", children=12, cores=4))
    _fires(too_many, Dataloader())


def test_overall_system_usage_never_fires(tmp_path, metrics_job):
    report = OverallSystemUsage().run(ProfilerTrial(metrics_job(tmp_path, cpu=99.0, gpus=(1.0, 1.0)))).to_json()
    assert report["fired"] is False and report["datapoints"] > 0
    cpu = report["statistics"]["nodes"]["algo-1"]["CPUUtilization"]
    assert cpu["p50"] == pytest.approx(99, abs=1) and cpu["max"] <= 100
    # A job without system metrics says why there is nothing (it said a bare "no data").
    (tmp_path / "none").mkdir()
    empty = OverallSystemUsage().run(ProfilerTrial(tmp_path / "none"))
    assert empty.status == "no data" and "system monitor did not run" in empty.no_data_reason


def test_step_outlier_on_a_real_loop_with_one_slow_step(tmp_path):
    writer = TimelineWriter(tmp_path, node_id="algo-1", rank=0, framework="pytorch", flush_interval_s=0.1)
    for step in range(25):
        began = time.time_ns()
        time.sleep(0.001)
        loaded = time.time_ns()
        writer.add("data", began, loaded, step=step, mode=ModeKeys.TRAIN, phase="data")
        time.sleep(0.25 if step == 15 else 0.01)
        ended = time.time_ns()
        writer.add("forward", loaded, ended, step=step, mode=ModeKeys.TRAIN, phase="forward")
        writer.add(f"Step {step}", began, ended, step=step, mode=ModeKeys.TRAIN)
    writer.close()
    trial = ProfilerTrial(tmp_path)
    report = StepOutlier(n_outliers=0).run(trial).to_json()
    assert report["fired"] is True and report["status"] == "fired"
    assert report["details"][0]["where"] == "global step 15 (TRAIN)"  # the timeline's steps are global steps
    assert 15 in [o["step"] for o in report["statistics"]["outliers"]]
    # With smdebug's default of ten tolerated outliers one slow step is reported, not fired.
    default = StepOutlier().run(trial)
    assert default.fired is False and default.statistics["samples_over_threshold"] >= 1
    assert StepOutlier(mode="EVAL").run(trial).status == "no data"


def test_legacy_job_runs_too(tmp_path, metrics_job):
    trial = ProfilerTrial(metrics_job(tmp_path, cpu=96.0, gpus=(5.0,), gpu_memory=(40.0,), children=None, legacy_flat=True))
    reports = {r.rule: r for r in run_profiler_rules(trial)}
    assert reports["CPUBottleneck"].fired
    assert reports["Dataloader"].status == "no data" and not reports["Dataloader"].fired
    assert reports["StepOutlier"].no_data_reason


# --- construction -----------------------------------------------------------------------


def test_defaults_are_smdebug_rulesconfig_defaults():
    assert CPUBottleneck().parameters() == {"threshold": 50, "gpu_threshold": 10, "cpu_threshold": 90, "patience": 1000, "scan_interval_us": 60_000_000}
    assert LowGPUUtilization().parameters()["window"] == 500
    assert GPUMemoryIncrease().parameters() == {"increase": 5, "patience": 1000, "window": 10, "scan_interval_us": 60_000_000}
    assert BatchSize().parameters()["gpu_memory_threshold_p95"] == 70
    assert LoadBalancing().params.threshold == 0.5
    assert StepOutlier().parameters() == {"stddev": 3, "mode": None, "n_outliers": 10, "min_ratio": 0, "min_excess_ms": 0, "scan_interval_us": 60_000_000}
    assert MaxInitializationTime().params.threshold == 20
    assert Dataloader().parameters() == {"min_threshold": 70, "max_threshold": 200, "min_data_wait_percent": 0, "min_data_wait_ms": 0, "scan_interval_us": 60_000_000}


def test_strings_are_accepted():
    rule = LowGPUUtilization(threshold_p95="80", threshold_p5="5.5", window="100", patience="0", scan_interval_us="60000000.0")
    assert (rule.params.threshold_p95, rule.params.threshold_p5, rule.params.window, rule.params.patience, rule.params.scan_interval_us) == (80.0, 5.5, 100, 0, 60_000_000)
    assert StepOutlier(mode="ModeKeys.EVAL").params.mode == "EVAL"
    assert StepOutlier(mode="None").params.mode is None


@pytest.mark.parametrize(
    "build, message",
    [
        (lambda: CPUBottleneck(threshold="150"), "CPUBottleneck.threshold must be a percentage in [0, 100], got 150"),
        (lambda: LowGPUUtilization(window=0), "LowGPUUtilization.window must be an integer >= 1, got 0"),
        (lambda: GPUMemoryIncrease(patience="-1"), "GPUMemoryIncrease.patience must be an integer >= 0, got -1"),
        (lambda: BatchSize(window="2.5"), "BatchSize.window must be int, got '2.5'"),
        (lambda: StepOutlier(mode="training"), "StepOutlier.mode must be a mode (TRAIN, EVAL, PREDICT, GLOBAL), got 'training'"),
        (lambda: LoadBalancing(threshold=True), "LoadBalancing.threshold must be float, got True"),
        (lambda: from_rulesconfig({"rule_name": "CPUBottleneck", "rule_parameters": {"treshold": 1}}), "CPUBottleneck: unknown parameter(s) 'treshold'"),
        (lambda: from_rulesconfig({"rule_name": "NoSuchRule"}), "'NoSuchRule'"),
    ],
)
def test_bad_parameters_name_the_field_and_value(build, message):
    with pytest.raises(ConfigError) as info:
        build()
    assert message in str(info.value)


def test_from_dicts():
    assert from_rulesconfig({"rule_name": "IOBottleneck", "rule_parameters": {"io_threshold": "40"}}).params.io_threshold == 40
    sagemaker = {"RuleConfigurationName": "mine", "RuleParameters": {"rule_to_invoke": "StepOutlier", "stddev": "5"}}
    assert from_rulesconfig(sagemaker).params == StepOutlier(stddev=5).params
    assert from_rulesconfig({"rule_to_invoke": "Dataloader", "min_threshold": "50"}).params.min_threshold == 50


def test_from_smdebug_rulesconfig_objects():
    rulesconfig = pytest.importorskip("smdebug_rulesconfig.profiler_rules.rules")
    for name in PROFILER_RULES:
        built = from_rulesconfig(getattr(rulesconfig, name)())
        assert built.params == PROFILER_RULES[name]().params, name
    assert from_rulesconfig(rulesconfig.LowGPUUtilization(threshold_p95=60)).params.threshold_p95 == 60
    report = profiler_report_rules(rulesconfig.ProfilerReport(CPUBottleneck_threshold=70, lowgpuutilization_window=100))
    by_name = {r.name: r for r in report}
    assert len(report) == 10 and by_name["CPUBottleneck"].params.threshold == 70 and by_name["LowGPUUtilization"].params.window == 100
    with pytest.raises(ConfigError, match="ProfilerReport"):
        from_rulesconfig(rulesconfig.ProfilerReport())


def test_run_profiler_rules_accepts_names_objects_and_paths(tmp_path, metrics_job):
    metrics_job(tmp_path, cpu=96.0, gpus=(5.0, 5.0))
    reports = run_profiler_rules(str(tmp_path), ["CPUBottleneck", LowGPUUtilization(patience=0), {"rule_name": "IOBottleneck"}])
    assert [r.fired for r in reports] == [True, True, False]
    assert reports[1].parameters["patience"] == 0


def test_a_crashing_rule_gives_an_error_report(tmp_path, monkeypatch):
    def boom(self, trial):
        raise RuntimeError("kaput")

    monkeypatch.setattr(CPUBottleneck, "_measure", boom)
    (report,) = run_profiler_rules(ProfilerTrial(tmp_path), ["CPUBottleneck"])
    assert report.fired is False and report.status == "error" and "kaput" in report.errors[0]


def _data_timeline(root, step_s: float, data_share: float, steps: int = 40, stalls: dict[int, float] | None = None) -> None:
    """`steps` TRAIN steps of `step_s`, `data_share` of each waiting for data; `stalls`:
    {step: seconds} of data wait added before those steps."""
    writer = TimelineWriter(root, node_id="algo-1", rank=0, framework="pytorch", flush_interval_s=3600)
    t = int(T0 * 1e9)
    for step in range(steps):
        stall = int((stalls or {}).get(step, 0.0) * 1e9)
        end = t + stall + int(step_s * 1e9)
        loaded = t + stall + int(step_s * data_share * 1e9)
        writer.add("data", t, loaded, step=step, mode=ModeKeys.TRAIN, phase="data")
        writer.add("forward", loaded, end, step=step, mode=ModeKeys.TRAIN, phase="forward")
        writer.add(f"Step {step}", t, end, step=step, mode=ModeKeys.TRAIN)
        t = end
    writer.close()


def test_dataloader_in_the_default_set_judges_the_data_wait(tmp_path, metrics_job):
    # No worker processes in any of these jobs.
    for name, step_s, share in (("slow", 0.2, 0.4), ("tiny", 0.004, 0.4), ("loop", 0.2, 0.15)):
        metrics_job(tmp_path / name, children=0, cores=4)
        _data_timeline(tmp_path / name, step_s, share)
    slow = Dataloader(**Dataloader.preset).run(ProfilerTrial(tmp_path / "slow"))  # 80 ms of 200 waiting for data
    assert slow.fired and slow.evidence[0].value == pytest.approx(40, abs=0.5) and slow.evidence[0].threshold == 25
    assert slow.statistics["data_wait_ms_per_step"] == pytest.approx(80, rel=0.01)
    assert "0 worker process(es)" in slow.evidence[0].message
    for quiet in ("tiny", "loop"):  # 1.6 ms per step: nothing to win back; 15 %: not the bottleneck
        report = Dataloader(**Dataloader.preset).run(ProfilerTrial(tmp_path / quiet))
        assert not report.fired and report.status == "ok", quiet
        assert Dataloader().run(ProfilerTrial(tmp_path / quiet)).fired  # SageMaker's rule: the worker count alone
    no_timeline = Dataloader(**Dataloader.preset).run(ProfilerTrial(metrics_job(tmp_path / "bare", children=0, cores=4)))
    assert no_timeline.status == "no data"


def test_dataloader_in_the_default_set_judges_a_job_without_system_metrics(tmp_path):
    # ProfilerConfig(system_monitor=False): a step timeline and no system metrics. The
    # default set's verdict comes from the timeline's data wait (the worker count is only
    # evidence), so such a job is judged, not "no data" (it was: no ChildProcessCount).
    for name, share in (("slow", 0.4), ("quick", 0.05)):
        _data_timeline(tmp_path / name, 0.2, share)
    slow = Dataloader(**Dataloader.preset).run(ProfilerTrial(tmp_path / "slow"))
    assert slow.fired and slow.evidence[0].value == pytest.approx(40, abs=0.5)
    assert "worker processes not known" in slow.evidence[0].message and slow.datapoints == 40
    quick = Dataloader(**Dataloader.preset).run(ProfilerTrial(tmp_path / "quick"))
    assert quick.status == "ok" and not quick.fired
    # SageMaker's rule judges the worker count alone: without it, nothing to judge.
    assert Dataloader().run(ProfilerTrial(tmp_path / "slow")).status == "no data"
    # Neither a timeline nor metrics: no data, saying both are missing.
    (tmp_path / "empty").mkdir()
    empty = Dataloader(**Dataloader.preset).run(ProfilerTrial(tmp_path / "empty"))
    assert empty.status == "no data"


def test_dataloader_cannot_judge_steps_that_fetch_their_batch_inside_one_call(tmp_path, metrics_job):
    # Keras's fit runs each step (its next tf.data batch included) as one compiled call: the
    # callback's timeline has "data" (the loop between batches) then "compute". A slow input
    # pipeline is in "compute", so a small "data" is no evidence of a fast one: "no data",
    # not "ok". (Measured: a PyDataset sleeping 20 ms a batch read compute 21.4 ms, data 0.03.)
    metrics_job(tmp_path / "keras", children=0, cores=4)
    writer = TimelineWriter(tmp_path / "keras", node_id="algo-1", rank=0, framework="tensorflow", flush_interval_s=3600)
    t = int(T0 * 1e9)
    for step in range(40):
        writer.add("data", t, t + 30_000, step=step, mode=ModeKeys.TRAIN, phase="data")
        writer.add("compute", t + 30_000, t + 21_000_000, step=step, mode=ModeKeys.TRAIN, phase="compute")
        writer.add(f"Step {step}", t, t + 21_000_000, step=step, mode=ModeKeys.TRAIN)
        t += 21_000_000
    writer.close()
    report = Dataloader(**Dataloader.preset).run(ProfilerTrial(tmp_path / "keras"))
    assert report.status == "no data" and not report.fired
    assert "Keras" in report.no_data_reason and "inside" in report.no_data_reason
    # Steps whose forward the hook saw are judged as before, beside such steps.
    metrics_job(tmp_path / "mixed", children=0, cores=4)
    _data_timeline(tmp_path / "mixed", 0.2, 0.4)
    writer = TimelineWriter(tmp_path / "mixed", node_id="algo-1", rank=0, framework="pytorch", flush_interval_s=3600)
    t = int((T0 + 100) * 1e9)
    for step in range(40, 50):
        writer.add("compute", t, t + 200_000_000, step=step, mode=ModeKeys.TRAIN, phase="compute")
        writer.add(f"Step {step}", t, t + 200_000_000, step=step, mode=ModeKeys.TRAIN)
        t += 200_000_000
    writer.close()
    mixed = Dataloader(**Dataloader.preset).run(ProfilerTrial(tmp_path / "mixed"))
    assert mixed.fired and mixed.statistics["data_wait_ms_per_step"] == pytest.approx(80, rel=0.01)


def test_dataloader_sees_recurring_stalls_the_median_step_hides(tmp_path, metrics_job):
    # Lightning's PPO example as it ran here: the loader makes a rollout every 16th step
    # (130 ms) and the other steps (3.4 ms) wait for nothing: 70 % of the TRAIN time goes to
    # data, the median step waits 0. One slow first batch, or a few short stalls (an epoch's
    # iterator, 11 ms against 4 ms steps), are no loader bottleneck.
    cases = {
        "rollouts": (0.0034, {s: 0.130 for s in range(16, 208, 16)}),
        "first": (0.004, {0: 2.0}),
        "epochs": (0.004, {s: 0.011 for s in range(40, 208, 40)}),
        "three": (0.018, {1: 0.06, 116: 2.2, 232: 0.58}),  # a short Keras fit's epoch boundaries: a third of the time
    }
    for name, (step_s, stalls) in cases.items():
        metrics_job(tmp_path / name, children=0, cores=4)
        _data_timeline(tmp_path / name, step_s, 0.0, steps=300 if name == "three" else 208, stalls=stalls)
    report = Dataloader(**Dataloader.preset).run(ProfilerTrial(tmp_path / "rollouts"))
    expected = 100 * 12 * 0.130 / (207 * 0.0034 + 12 * 0.130)  # the first step left out
    assert report.fired and report.evidence[0].value == pytest.approx(expected, abs=0.1) and report.evidence[0].threshold == 25
    assert report.statistics["data_stalls"] == 12 and report.statistics["data_stall_ms"] == pytest.approx(130, rel=0.01)
    assert report.statistics["data_wait_ms_per_step"] == 0 and "12 steps waited 130 ms each for data" in report.evidence[0].message
    for quiet in ("first", "epochs", "three"):
        report = Dataloader(**Dataloader.preset).run(ProfilerTrial(tmp_path / quiet))
        assert not report.fired and report.status == "ok", (quiet, report.summary())
    # Eight epochs of a Keras fit with validation: the first TRAIN step after each
    # evaluation waits 0.5 s (the loop's turn, a new epoch's iterator), not the loader.
    metrics_job(tmp_path / "validated", children=0, cores=4)
    writer = TimelineWriter(tmp_path / "validated", node_id="algo-1", rank=0, framework="tensorflow", flush_interval_s=3600)
    t, step = int(T0 * 1e9), 0
    for epoch in range(8):
        for i in range(20):
            wait = int((0.5 if epoch and i == 0 else 0.0) * 1e9)
            writer.add("data", t, t + wait, step=step, mode=ModeKeys.TRAIN, phase="data")
            writer.add(f"Step {step}", t, t + wait + 4_000_000, step=step, mode=ModeKeys.TRAIN)
            t, step = t + wait + 4_000_000, step + 1
        for _ in range(3):
            writer.add(f"Eval {step}", t, t + 2_000_000, step=step, mode=ModeKeys.EVAL, phase="eval_step")
            t, step = t + 2_000_000, step + 1
    writer.close()
    report = Dataloader(**Dataloader.preset).run(ProfilerTrial(tmp_path / "validated"))
    assert not report.fired and report.statistics["data_stalls"] == 0, report.summary()


def test_step_outlier_in_the_default_set_ignores_jitter(tmp_path):
    # 400 steps of 4 ms with twelve 9 ms jitters (over mean + 3 std, 2x the median), and a
    # job with twelve 400 ms steps instead (checkpointing inside the step).
    jitter = {s: 0.009 for s in range(5, 400, 33)}
    for name, slow in (("jitter", jitter), ("checkpoints", {s: 0.4 for s in jitter})):
        writer = TimelineWriter(tmp_path / name, node_id="algo-1", rank=0, framework="pytorch", flush_interval_s=3600)
        t = int(T0 * 1e9)
        for step in range(400):
            end = t + int(slow.get(step, 0.004) * 1e9)
            writer.add(f"Step {step}", t, end, step=step, mode=ModeKeys.TRAIN)
            t = end
        writer.close()
    assert StepOutlier().run(ProfilerTrial(tmp_path / "jitter")).fired  # SageMaker's statistic alone
    assert not StepOutlier(**StepOutlier.preset).run(ProfilerTrial(tmp_path / "jitter")).fired
    report = StepOutlier(**StepOutlier.preset).run(ProfilerTrial(tmp_path / "checkpoints"))
    assert report.fired and report.evidence[0].value == pytest.approx(400, rel=0.01)


def test_too_few_samples_after_patience_is_not_enough_data_not_ok(tmp_path, metrics_job):
    from stepscope.rules.profiler import LowGPUUtilization

    metrics_job(tmp_path)
    report = LowGPUUtilization(patience=100_000).run(str(tmp_path))
    assert report.status == "not enough data" and not report.judged and report.needed == 100_001
    assert 0 < report.available < report.needed and "GPU utilization samples" in report.summary()
