"""The data behind the pages equals what the trial's APIs give (the app computes nothing of
its own beyond binning for display), and the jobs list filters and sorts."""

from __future__ import annotations

import csv
import io
import json

import numpy as np
import pytest

from stepscope.profiler import STEP_PHASES
from stepscope.rules.profiler import OverallSystemUsage, StepOutlier
from stepscope.trial import create_trial

from .conftest import T0_NS, login, write_profiler_job


def test_jobs_list_fields_filter_and_sort(app, store_root):
    client = app.test_client()
    login(client, "root")
    jobs = {j["id"]: j for j in client.get("/api/jobs").get_json()["jobs"]}
    run1 = jobs["team-a/run-1"]
    trial = create_trial(str(store_root / "team-a" / "run-1"))
    timeline = trial.profiler.step_timeline()
    assert run1["status"] == "finished" and run1["framework"] == "pytorch" and run1["workers"] == 1 and run1["steps"] == 40
    assert run1["start"] == trial.profiler.job_start()
    # steps run (the timeline's step intervals) apart from the steps that saved tensors
    assert run1["steps"] == int((timeline["phase"] == "step").sum()) and run1["saved_steps"] == len(trial.steps())
    assert run1["end"] == max(timeline["end_ns"].max() / 1e9, trial.profiler.time_range()[1])
    by_steps = [j["id"] for j in client.get("/api/jobs?sort=-steps").get_json()["jobs"]]
    assert by_steps == ["team-a/run-1", "team-b/secret-run", "team-a/run-2"]
    assert [j["id"] for j in client.get("/api/jobs?sort=steps").get_json()["jobs"]] == by_steps[::-1]
    assert [j["id"] for j in client.get("/api/jobs?q=run-2").get_json()["jobs"]] == ["team-a/run-2"]
    assert client.get("/api/jobs?status=running").get_json()["jobs"] == []


def test_running_and_failed_status(app, store_root):
    import time

    write_profiler_job(store_root / "team-a" / "live", steps=3, close=False, start_ns=time.time_ns() - 10**9)
    (store_root / "team-a" / "broken").mkdir()
    write_profiler_job(store_root / "team-a" / "broken", steps=3, close=False)
    (store_root / "team-a" / "broken" / "stepscope-status").mkdir()
    (store_root / "team-a" / "broken" / "stepscope-status" / "worker_0.json").write_text('{"state": "failed", "component": "writer", "error": "disk full"}')
    write_profiler_job(store_root / "team-a" / "degraded", steps=3, close=False)
    (store_root / "team-a" / "degraded" / "stepscope-status").mkdir()
    (store_root / "team-a" / "degraded" / "stepscope-status" / "worker_0.json").write_text('{"state": "degraded", "component": "hook"}')
    client = app.test_client()
    login(client, "alice")
    status = {j["id"]: j["status"] for j in client.get("/api/jobs").get_json()["jobs"]}
    assert status["team-a/live"] == "running" and status["team-a/broken"] == "failed" and status["team-a/run-2"] == "finished"
    assert status["team-a/degraded"] == "stopped"  # some tensors skipped; the hook ran on


def test_dashboard_numbers_are_the_trials(app, store_root):
    client = app.test_client()
    login(client, "alice")
    data = client.get("/api/jobs/team-a/run-1/dashboard?bins=12").get_json()
    profiler = create_trial(str(store_root / "team-a" / "run-1")).profiler
    timeline = profiler.step_timeline()
    steps = timeline[timeline["phase"] == "step"].sort_values("start_ns")
    (series,) = data["steps"]
    assert series["steps"] == steps["step"].tolist()
    np.testing.assert_allclose(series["duration_ms"], steps["duration_ms"])
    limit = StepOutlier(**StepOutlier.preset).run(profiler).statistics["groups"]["algo-1/rank0/TRAIN"]["limit_ms"]
    assert series["limit_ms"] == limit and series["outliers"] == [10, 20]
    # the two 5x steps are drawn apart (named), the bins span the others; the summary counts all
    slow = steps["step"].isin([10, 20]).to_numpy()
    assert sorted(a["name"] for a in data["step_histogram"]["apart"]) == ["TRAIN step 10", "TRAIN step 20"]
    assert data["step_histogram"]["max"] == pytest.approx(steps["duration_ms"].max()) and data["step_histogram"]["n"] == 40
    counts, edges = np.histogram(steps["duration_ms"].to_numpy()[~slow], bins=12)
    assert data["step_histogram"]["counts"] == counts.tolist()
    np.testing.assert_allclose(data["step_histogram"]["edges"], edges)
    backward = timeline[timeline["phase"] == "backward"]
    slow_backward = backward["step"].isin([10, 20]).to_numpy()  # the slow steps' phases are drawn apart too
    assert len(data["annotation"]["histogram"]["apart"]) == 2
    assert data["annotation"]["chosen"] == "backward" and data["annotation"]["histogram"]["counts"] == np.histogram(backward["duration_ms"].to_numpy()[~slow_backward], bins=12)[0].tolist()
    forward = client.get("/api/jobs/team-a/run-1/dashboard?phase=forward&bins=12").get_json()["annotation"]["histogram"]
    assert forward["n"] == 40
    # Each phase's total, and the step time no phase covers as "other" (nothing counted twice).
    parts = timeline[~timeline["phase"].isin(STEP_PHASES)].groupby("phase")["duration_ms"].sum()
    expected = {str(k): float(v) for k, v in parts.items() if v > 0}
    uncovered = float(timeline[timeline["phase"].isin(STEP_PHASES)]["duration_ms"].sum()) - sum(expected.values())
    if uncovered > 0:
        expected["other"] = expected.get("other", 0.0) + uncovered
    assert data["cpu_time"] == pytest.approx(expected)
    assert "data" in expected  # (it lies inside the steps: once counted as "other" too)
    metrics = profiler.system_metrics()
    cpu = metrics[(metrics["name"] == "total")].sort_values("timestamp")
    system = data["system"]["algo-1"]
    np.testing.assert_allclose(system["t"], cpu["timestamp"])
    np.testing.assert_allclose(system["series"]["CPU"], cpu["value"])
    gpu = metrics[(metrics["name"] == "gpu0") & (metrics["dimension"] == "GPUUtilization")].sort_values("timestamp")
    np.testing.assert_allclose(system["series"]["gpu0"], gpu["value"])


def test_outliers_are_the_rules_in_app_rule_and_report(app, store_root):
    """The dashboard's outliers are StepOutlier's as `stepscope check` runs it (the default
    set: limit max(mean + 3 std, 3 x median, median + 50 ms)); the report lists the same: six
    steps over mean + 3 std alone are not outliers there, and not here either."""
    from stepscope.report import build_report

    rng = np.random.default_rng(4)
    durations = [float(d) for d in 70 + 5 * rng.random(300)]
    durations[0] = 900.0  # the first step: left out of the statistics
    for step in (40, 80, 120, 160, 200, 240):
        durations[step] = 170.0
    durations[280] = 320.0
    job = write_profiler_job(store_root / "team-a" / "jittery", durations_ms=durations)
    rest = np.array(durations[1:])
    naive = rest.mean() + 3 * rest.std()
    limit = max(naive, 3 * np.median(rest), np.median(rest) + 50)
    assert naive < 170 < limit < 320  # the case where the two definitions disagree
    client = app.test_client()
    login(client, "alice")
    (series,) = client.get("/api/jobs/team-a/jittery/dashboard").get_json()["steps"]
    assert series["limit_ms"] == pytest.approx(limit) and series["outliers"] == [280]
    rule = StepOutlier(**StepOutlier.preset).run(create_trial(str(job)).profiler)
    assert [e.step for e in rule.evidence] == [] and rule.statistics["groups"]["algo-1/rank0/TRAIN"]["limit_ms"] == series["limit_ms"]
    assert [o["step"] for o in rule.statistics["outliers"]] == series["outliers"]
    report = build_report(str(job), rules="run")
    rows = report.section("steps").table("step-outliers").rows
    assert [r[2] for r in rows] == series["outliers"] and rows[0][4] == pytest.approx(limit)


def test_system_series_are_averaged_down_to_600_points(tmp_path):
    import pandas as pd

    from stepscope.ui.views import MAX_POINTS, _system_series

    n = 1500
    frame = pd.DataFrame({"timestamp": np.arange(n) * 0.1, "node_id": "n", "type": "cpu", "name": "total", "dimension": "CPUUtilization", "value": np.arange(n, dtype=float)})
    out = _system_series(frame)["n"]
    assert len(out["t"]) == MAX_POINTS
    assert out["series"]["CPU"][0] == np.mean(np.arange(n)[np.arange(n) * MAX_POINTS // n == 0])
    # each bucket's time is its samples' mean time (not the bucket's number)
    bucket = np.arange(n) * MAX_POINTS // n
    np.testing.assert_allclose(out["t"], [np.mean(np.arange(n)[bucket == b] * 0.1) for b in range(MAX_POINTS)])
    assert "timestamp" not in out["series"]


def test_statistics_tables_and_csv(app, store_root):
    client = app.test_client()
    login(client, "alice")
    tables = client.get("/api/jobs/team-a/run-1/stats").get_json()["tables"]
    profiler = create_trial(str(store_root / "team-a" / "run-1")).profiler
    timeline = profiler.step_timeline()
    backward = [r for r in tables["annotations"]["rows"] if r[0] == "backward"][0]
    values = timeline[timeline["phase"] == "backward"]["duration_ms"].to_numpy()
    np.testing.assert_allclose(backward[2:], [len(values), values.sum(), values.mean(), np.percentile(values, 50), np.percentile(values, 95), values.max()])
    usage = OverallSystemUsage().run(profiler).statistics["nodes"]["algo-1"]["GPUUtilization"]
    gpu_row = [r for r in tables["system"]["rows"] if r[1] == "GPUUtilization"][0]
    assert gpu_row[2:] == [usage["min"], usage["p50"], usage["p95"], usage["p99"], usage["max"]]
    resp = client.get("/api/jobs/team-a/run-1/stats/steps.csv")
    assert resp.headers["Content-Disposition"] == 'attachment; filename="steps.csv"'
    rows = list(csv.reader(io.StringIO(resp.get_data(as_text=True))))
    assert rows[0] == tables["steps"]["columns"] and len(rows) == 41
    assert float(rows[11][5]) == tables["steps"]["rows"][10][5]
    assert client.get("/api/jobs/team-a/run-1/stats/nope.csv").status_code == 404


def test_rules_status_reads_check_reports_and_runs_profiler_rules(app, store_root):
    from stepscope.cli import main

    job = store_root / "team-a" / "run-1"
    assert main(["check", str(job), "--rule", "StepOutlier:n_outliers=1", "--quiet"]) == 1
    client = app.test_client()
    login(client, "alice")
    rules = {r["rule"]: r for r in client.get("/api/jobs/team-a/run-1/rules").get_json()["rules"]}
    outlier = rules["StepOutlier"]
    assert outlier["fired"] and outlier["source"] == "stepscope check" and outlier["steps"] == [10, 20]
    report = create_trial(str(job)).store.read("rule-output/StepOutlier.json").decode()
    assert outlier["advice"] == json.loads(report)["explanation"]["advice"] and outlier["advice"]
    assert [e["value"] for e in outlier["evidence"]] == [e["value"] for e in json.loads(report)["details"]]
    assert rules["LowGPUUtilization"]["source"] == "live"
    jobs = {j["id"]: j for j in client.get("/api/jobs").get_json()["jobs"]}
    assert jobs["team-a/run-1"]["rules_fired"] == ["StepOutlier"]


def test_live_rules_judge_as_stepscope_check_does(app, store_root):
    # A healthy job whose one data-loading process is 25 % of its 4 cores, and whose data
    # phase is 10 % of the step: SageMaker's Dataloader parameters flag it, the default set
    # of `stepscope check` (its preset) does not. Before check has run, the app runs the
    # whole-job rules itself; it must give check's verdicts, not SageMaker's.
    from stepscope.cli import main

    job = store_root / "team-a" / "run-1"
    folder = next((job / "profiler-output/system/incremental").iterdir())
    lines = [json.dumps({"Type": "cpu", "Name": f"cpu{core}", "Dimension": "CPUUtilization", "Value": 30.0, "NodeId": "algo-1", "Timestamp": T0_NS / 1e9 + i})
             for i in range(4) for core in range(4)]
    lines += [json.dumps({"Type": "process", "Name": "main", "Dimension": "ChildProcessCount", "Value": 1.0, "NodeId": "algo-1", "Timestamp": T0_NS / 1e9 + i}) for i in range(4)]
    (folder / f"{int(T0_NS / 1e9 // 60 * 60) + 1}.algo-2.json").write_text("\n".join(lines).replace('"algo-1"', '"algo-2"') + "\n")
    from stepscope.rules.profiler import Dataloader, ProfilerTrial

    assert Dataloader().run(ProfilerTrial(job)).fired  # (SageMaker's parameters)
    client = app.test_client()
    login(client, "alice")
    live = {r["rule"]: r for r in client.get("/api/jobs/team-a/run-1/rules").get_json()["rules"]}
    assert {r["source"] for r in live.values()} == {"live"}
    main(["check", str(job), "--quiet"])
    checked = {row["rule"]: row for row in json.loads((job / "rule-output/summary.json").read_text())["rules"]}
    for name, row in live.items():
        assert (row["status"], row["fired"]) == (checked[name]["status"], checked[name]["fired"]), name
    assert live["Dataloader"]["status"] == "ok"


def test_version_changes_when_the_job_grows(app, store_root):
    from stepscope.modes import ModeKeys
    from stepscope.profiler import TimelineWriter

    client = app.test_client()
    login(client, "alice")
    first = client.get("/api/jobs/team-a/run-2/version").get_json()
    assert client.get("/api/jobs/team-a/run-2/version").get_json()["tag"] == first["tag"]
    writer = TimelineWriter(store_root / "team-a" / "run-2", node_id="algo-1", rank=0, flush_interval_s=3600)
    writer.add("Step 99", 2 * 10**18, 2 * 10**18 + 10**6, step=99, mode=ModeKeys.TRAIN)
    writer.close()
    second = client.get("/api/jobs/team-a/run-2/version").get_json()
    assert second["tag"] != first["tag"] and second["timeline_events"] == first["timeline_events"] + 1
    steps = client.get("/api/jobs/team-a/run-2/dashboard").get_json()["steps"][0]["steps"]
    assert steps[-1] == 99
    # a finding landing (stepscope check writes rule-output/) changes it too, and shows up
    from stepscope.cli import main

    assert main(["check", str(store_root / "team-a" / "run-2"), "--rule", "LowGPUUtilization:patience=0,threshold_p95=99", "--quiet"]) == 1
    third = client.get("/api/jobs/team-a/run-2/version").get_json()
    assert third["tag"] != second["tag"]
    assert "LowGPUUtilization" in client.get("/api/jobs/team-a/run-2/rules").get_json()["fired"]


def test_health_on_a_tensor_job(app, store_root, write_job):
    written, _ = write_job(store_root / "team-a" / "tensors", steps=6, eval_steps=2)
    client = app.test_client()
    login(client, "alice")
    health = client.get("/api/jobs/team-a/tensors/health").get_json()
    curves = {(c["tensor"], c["mode"]): c for c in health["curves"]}
    train = curves[("loss", "TRAIN")]
    assert train["steps"] == list(range(6))
    np.testing.assert_allclose(train["values"], [float(written[s]["loss"]) for s in range(6)], rtol=1e-6)
    assert curves[("loss", "EVAL")]["steps"] == [6, 7]  # global steps, each curve of one mode
    assert health["default_tensor"] == "fc.weight"
    ratios = health["update_ratios"]["series"][0]
    assert ratios["mode"] == "TRAIN" and ratios["steps"] == [1, 2, 3, 4, 5]  # EVAL-step weights left out
    w = [written[s]["fc.weight"].astype(np.float64) for s in range(8)]
    expected = [np.sqrt(((w[i] - w[i - 1]) ** 2).sum()) / max(np.sqrt((w[i - 1] ** 2).sum()), 1e-3 * np.sqrt(12)) for i in range(1, 6)]
    np.testing.assert_allclose(ratios["values"], expected, rtol=1e-6)
    hist = client.get("/api/jobs/team-a/tensors/tensor-histograms?tensor=fc.weight&bins=8").get_json()
    assert hist["mode"] == "TRAIN" and hist["steps"] == list(range(6)) and hist["modes"] == ["TRAIN", "EVAL"]
    edges = np.linspace(min(x.min() for x in w[:6]), max(x.max() for x in w[:6]), 9)
    assert hist["counts"][3] == np.histogram(w[3], bins=edges)[0].tolist()
    evals = client.get("/api/jobs/team-a/tensors/tensor-histograms?tensor=fc.weight&bins=8&mode=eval").get_json()
    assert evals["mode"] == "EVAL" and evals["steps"] == [6, 7]
    assert client.get("/api/jobs/team-a/tensors/tensor-histograms?tensor=nope").get_json()["error"] == "no such tensor"


def test_health_counts_the_losses_that_turned_nan_or_infinite(app, store_root):
    # A loss that blew up: the chart ends at its last finite value, and the curve says how
    # many values it cannot draw and from which step (the page's note under the chart).
    from stepscope.capture.collection_manager import CollectionManager
    from stepscope.capture.writer import Writer
    from stepscope.modes import ModeKeys

    losses = [1.5, 7.0e6, float("inf"), float("nan"), float("nan"), float("-inf")]
    with Writer(str(store_root / "team-a" / "blown")) as writer:
        writer.write_collections(CollectionManager(builtin_regexes={"losses": ["loss"], "metrics": ["trainer/"]}).dumps(1))
        for step, loss in enumerate(losses):
            # (the Lightning callback's step counter: a metric, and no curve of training health)
            writer.write_step(step, ModeKeys.TRAIN, step, {"loss": np.float32(loss), "trainer/global_step": np.float32(step)})
    client = app.test_client()
    login(client, "alice")
    curves = client.get("/api/jobs/team-a/blown/health").get_json()["curves"]
    assert [c["tensor"] for c in curves] == ["loss"]
    curve = curves[0]
    assert curve["steps"] == list(range(6)) and curve["values"][:2] == [1.5, 7.0e6] and curve["values"][2:] == [None] * 4
    assert curve["non_finite"] == {"nan": 2, "inf": 2, "first_step": 2}


def test_s3_store_lists_and_opens_jobs(s3_url, user_db, tmp_path):
    """The same app over an s3:// prefix on the loopback S3 server."""
    import boto3

    from stepscope.ui.app import create_app
    from stepscope.ui.jobs import JobStore

    local = write_profiler_job(tmp_path / "job", steps=8)
    bucket, prefix = s3_url[len("s3://"):].split("/", 1)
    client_s3 = boto3.client("s3")
    for path in local.rglob("*"):
        if path.is_file():
            client_s3.upload_file(str(path), bucket, f"{prefix}/team-a/s3run/{path.relative_to(local)}")
    client_s3.put_object(Bucket=bucket, Key=f"{prefix}/team-b/other/training_job_end.ts", Body=b"")
    app = create_app(JobStore(s3_url), user_db)
    client = app.test_client()
    login(client, "alice")
    jobs = client.get("/api/jobs").get_json()["jobs"]
    assert [j["id"] for j in jobs] == ["team-a/s3run"] and jobs[0]["steps"] == 8
    assert client.get("/api/jobs/team-a/s3run/dashboard").get_json()["steps"][0]["steps"] == list(range(8))
    assert client.get("/api/jobs/team-b/other/summary").status_code == 404
    assert client.get("/api/jobs/team-a/%2e%2e/team-b/other/summary").status_code == 404


def _gpu_job(root):
    from stepscope.traces.synth import SynthSpec, write_trace

    for rank in range(2):
        write_trace(SynthSpec(steps=3, ops_per_step=30, rank=rank, world_size=2, seed=7),
                    root / f"profiler-output/framework/pytorch/detailed/rank{rank}/window_000000.pt.trace.json.gz")
    (root / "training_job_end.ts").write_text("")
    return root


def test_gpu_views_are_the_trace_engines(app, store_root):
    pytest.importorskip("pyarrow")
    job = _gpu_job(store_root / "team-a" / "gpu")
    client = app.test_client()
    login(client, "alice")
    gpu = client.get("/api/jobs/team-a/gpu/dashboard?k=3").get_json()["gpu"]
    traces = create_trial(str(job)).profiler.traces
    assert gpu["available"]
    top = traces.top_kernels(k=3, by="time")
    assert gpu["tables"]["Top kernels by time"]["columns"] == list(top.columns)
    assert [r[1] for r in gpu["tables"]["Top kernels by time"]["rows"]] == top["name"].tolist()
    np.testing.assert_allclose([r[4] for r in gpu["tables"]["Top kernels by time"]["rows"]], top["total_us"])
    by_launches = traces.top_kernels(k=3, by="launches")
    assert [r[3] for r in gpu["tables"]["Top kernels by launches"]["rows"]] == by_launches["count"].tolist()
    active = traces.active_time().set_index("rank")
    assert gpu["pies"]["rank 1"]["time"]["idle"] == pytest.approx(active.loc[1, "idle_us"])
    assert gpu["pies"]["rank 0"]["time"]["kernels"] == pytest.approx(active.loc[0, "kernel_us"])
    assert gpu["pies"]["rank 0"]["time"]["sync"] == pytest.approx(active.loc[0, "sync_us"])
    # The idle slice is the temporal breakdown's idle time (sync records are idle there too).
    assert active.loc[1, "idle_us"] + active.loc[1, "sync_us"] == pytest.approx(traces.temporal_breakdown().set_index("rank").loc[1, "idle_us"])
    annotations = traces.events(rank=None, kinds=["annotation"])
    name = sorted(set(annotations["name"].astype(str)) - {n for n in annotations["name"].astype(str) if n.startswith("ProfilerStep#")})[0]
    picked = client.get("/api/jobs/team-a/gpu/dashboard", query_string={"phase": f"trace: {name}", "bins": 7}).get_json()["annotation"]
    assert picked["chosen"] == f"trace: {name}" and f"trace: {name}" in picked["names"]
    durations = annotations[annotations["name"].astype(str) == name]["dur_ns"].to_numpy() / 1e6
    assert picked["histogram"]["counts"] == np.histogram(durations, bins=7)[0].tolist()
    precision = traces.kernel_stats(by="precision")
    mine = precision[precision["rank"] == 1]
    assert gpu["pies"]["rank 1"]["precision"] == pytest.approx(dict(zip(mine["precision"], mine["total_us"])))
    memory = traces.memory_ops()
    assert sum(r[4] for r in gpu["tables"]["Memory operations"]["rows"]) == int(memory["bytes"].sum())
    tables = client.get("/api/jobs/team-a/gpu/stats").get_json()["tables"]
    assert len(tables["kernels"]["rows"]) == len(traces.kernel_stats())
    assert {"cpu_ops", "memory_ops", "syncs", "launch_latency"} <= set(tables)


def test_timeline_has_stream_lanes_and_a_kernel_shows_its_launch(app, store_root):
    pytest.importorskip("pyarrow")
    job = _gpu_job(store_root / "team-a" / "gpu")
    client = app.test_client()
    login(client, "alice")
    answer = client.get("/api/jobs/team-a/gpu/timeline?width=1000").get_json()
    lanes = {lane["id"]: lane for lane in answer["lanes"]}
    assert {"g0-s7", "g0-s20", "h0-runtime", "h0-t4242", "g1-s7"} <= set(lanes)
    traces = create_trial(str(job)).profiler.traces
    events = traces.events(rank=0, kinds=["kernel", "memcpy", "memset"])
    on_7 = events[events["stream"] == 7]
    lane = lanes["g0-s7"]
    assert len(lane["slices"]["s"]) + sum(lane["agg"]["c"]) == len(on_7)
    launches = traces.launches(rank=0)
    kernel = on_7.sort_values("ts_ns").iloc[0]
    detail = client.get("/api/jobs/team-a/gpu/timeline/event?lane=g0-s7&i=0").get_json()
    assert detail["name"] == kernel["name"] and int(detail["start_ns"]) == kernel["ts_ns"]
    launch = launches[launches["correlation"] == kernel["correlation"]].iloc[0]
    assert detail["launch"]["call"] == launch["launch_call"] and detail["launch"]["delay_us"] == launch["delay_ns"] / 1e3
    assert int(detail["launch"]["start_ns"]) == launch["launch_ts_ns"]
    trace = json.loads(client.get("/api/jobs/team-a/gpu/perfetto").data)
    kernels = [e for e in trace["traceEvents"] if e.get("cat") == "gpu" and e["args"].get("kind") == "kernel"]
    assert len(kernels) == len(traces.events(kinds=["kernel"]))
    assert any(e["ph"] == "s" for e in trace["traceEvents"]) and any(e["ph"] == "f" for e in trace["traceEvents"])


def test_dead_and_saturated_units_by_the_rules_definitions(app, store_root):
    from stepscope.capture.collection_manager import CollectionManager
    from stepscope.capture.writer import Writer
    from stepscope.modes import ModeKeys

    rng = np.random.default_rng(3)
    writer = Writer(str(store_root / "team-a" / "acts"), "worker_0")
    writer.write_collections(CollectionManager().dumps(1))
    relus, tanhs = {}, {}
    for step in range(4):
        relu = np.maximum(rng.standard_normal((64, 10)), 0).astype(np.float32)
        relu[:, : 2 + step] = 0  # more dead units every step
        tanh_in = rng.standard_normal((64, 8)).astype(np.float32)
        tanh_in[:, :3] = 20.0  # three units saturated
        relus[step], tanhs[step] = relu, tanh_in
        writer.write_step(step, ModeKeys.TRAIN, step, {"fc1.relu_output": relu, "fc2.tanh_input": tanh_in})
    writer.close()
    client = app.test_client()
    login(client, "alice")
    units = client.get("/api/jobs/team-a/acts/health").get_json()["inactive_units"]
    # the default set's definitions: DeadRelu counts a unit dead when it is off (> 0 in < 1 % of
    # the batch) at each of the last 3 saved steps (charted from the 3rd saved step on);
    # SaturatedActivation when its input is inside (-4, 4) in < 10 % of the batch
    assert units["tensors"] == ["fc1.relu_output (dead, TRAIN)", "fc2.tanh_input (saturated, TRAIN)"] and units["steps"] == [0, 1, 2, 3]
    assert units["persistence"] == {"dead": 3, "saturated": 1}
    off = {s: (relus[s] > 0).mean(axis=0) * 100 < 1.0 for s in range(4)}
    expected_dead = [100 * np.mean(off[s - 2] & off[s - 1] & off[s]) for s in (2, 3)]
    assert expected_dead == [20.0, 30.0]  # units 0-1, then 0-2, were off at all three
    assert units["values"][0][:2] == [None, None]
    np.testing.assert_allclose(units["values"][0][2:], expected_dead)
    inside = {s: ((tanhs[s] > -4) & (tanhs[s] < 4)).mean(axis=0) * 100 < 10.0 for s in range(4)}
    np.testing.assert_allclose(units["values"][1], [100 * np.mean(inside[s]) for s in range(4)])
    assert units["values"][1][0] == 100 * 3 / 8
    # the same figure the rule reports at the step where it judges
    from stepscope.rules import DeadRelu, run_rules
    from stepscope.trial import create_trial

    report = run_rules([DeadRelu(create_trial(str(store_root / "team-a" / "acts")), **{**DeadRelu.preset, "threshold_layer": 25.0})])[0]
    assert [(e.step, e.value) for e in report.evidence] == [(3, units["values"][0][3])]
    # and the report's table shows the same last shares
    from stepscope.report import build_report

    table = build_report(str(store_root / "team-a" / "acts"), rules="none").section("health").table("inactive-units")
    assert [(r[0], r[2], r[3]) for r in table.rows] == [(name, 3, values[-1]) for name, values in zip(units["tensors"], units["values"])]


def test_statistics_tables_filter_sort_and_page_on_the_server(app, store_root):
    client = app.test_client()
    login(client, "alice")
    timeline = create_trial(str(store_root / "team-a" / "run-1")).profiler.step_timeline()
    steps = timeline[timeline["phase"] == "step"]
    page = client.get("/api/jobs/team-a/run-1/stats/steps?sort=duration_ms&desc=1&limit=5").get_json()
    assert page["total"] == page["matched"] == 40 and len(page["rows"]) == 5
    np.testing.assert_allclose([r[5] for r in page["rows"]], np.sort(steps["duration_ms"].to_numpy())[::-1][:5])
    assert {r[3] for r in page["rows"][:2]} == {10, 20}  # the planted slow steps
    second = client.get("/api/jobs/team-a/run-1/stats/steps?sort=duration_ms&desc=1&limit=5&offset=5").get_json()
    assert second["rows"][0][5] <= page["rows"][-1][5]
    found = client.get("/api/jobs/team-a/run-1/stats/annotations?q=backw").get_json()
    assert found["matched"] == 1 and found["rows"][0][0] == "backward"
    assert client.get("/api/jobs/team-a/run-1/stats/steps?sort=nope").status_code == 400
    assert client.get("/api/jobs/team-a/run-1/stats/nope").status_code == 404
    overview = client.get("/api/jobs/team-a/run-1/stats?limit=3").get_json()["tables"]["steps"]
    assert overview["total"] == 40 and len(overview["rows"]) == 3
    assert client.get("/api/jobs/team-a/run-1/stats/steps.csv").headers["Content-Type"].startswith("text/csv")


def test_concurrent_requests_while_the_job_grows(app, store_root, user_db):
    """The server answers in threads: many pages of one job at once, while it publishes."""
    from concurrent.futures import ThreadPoolExecutor

    from stepscope.modes import ModeKeys
    from stepscope.profiler import TimelineWriter

    token = user_db.new_token("alice")
    urls = [f"/api/jobs/team-a/run-1/{what}" for what in ("dashboard", "rules", "stats", "timeline?width=500", "version", "health", "summary")] * 2

    def get(url):
        return app.test_client().get(url, headers={"Authorization": f"Bearer {token}"}).status_code

    def grow():
        for i in range(3):
            writer = TimelineWriter(store_root / "team-a" / "run-1", node_id="algo-1", rank=0, flush_interval_s=3600)
            writer.add(f"Step {100 + i}", 3 * 10**18 + i * 10**9, 3 * 10**18 + i * 10**9 + 10**6, step=100 + i, mode=ModeKeys.TRAIN)
            writer.close()
        return 200

    with ThreadPoolExecutor(8) as pool:
        futures = [pool.submit(grow)] + [pool.submit(get, url) for url in urls]
        assert [f.result() for f in futures] == [200] * (len(urls) + 1)
    steps = app.test_client().get("/api/jobs/team-a/run-1/dashboard", headers={"Authorization": f"Bearer {token}"}).get_json()["steps"][0]["steps"]
    assert steps[-3:] == [100, 101, 102]


def test_two_ranks_two_nodes(app, store_root):
    """A job of two nodes (one rank each): workers, per-node system charts, per-rank lanes."""
    job = store_root / "team-a" / "multi"
    write_profiler_job(job, steps=6, node="algo-1", close=False)
    from stepscope.modes import ModeKeys
    from stepscope.profiler import TimelineWriter

    writer = TimelineWriter(job, node_id="algo-2", rank=1, framework="pytorch", flush_interval_s=3600)
    for step in range(6):
        writer.add(f"Step {step}", T0_NS + step * 10**8, T0_NS + step * 10**8 + 5 * 10**7, step=step, mode=ModeKeys.TRAIN)
    writer.close()
    (job / "training_job_end.ts").write_text("")
    client = app.test_client()
    login(client, "alice")
    summary = client.get("/api/jobs/team-a/multi/summary").get_json()
    assert summary["workers"] == 2
    dashboard = client.get("/api/jobs/team-a/multi/dashboard").get_json()
    assert [s["key"] for s in dashboard["steps"]] == ["algo-1/rank0/TRAIN", "algo-2/rank1/TRAIN"]
    lanes = [lane["id"] for lane in client.get("/api/jobs/team-a/multi/timeline").get_json()["lanes"]]
    assert "r0-TRAIN" in lanes and "r1-TRAIN" in lanes
