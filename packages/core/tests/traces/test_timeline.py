"""The merged Perfetto timeline: every source is there, slices nest on every track, and
every flow has both ends inside a slice of its track."""

from __future__ import annotations

import gzip
import importlib
import json
import sys
import time
from collections import defaultdict

import numpy as np
import pytest

import stepscope.traces
from stepscope.cli import main
from stepscope.export import perfetto
from stepscope.modes import ModeKeys
from stepscope.profiler import TimelineWriter
from stepscope.traces import TraceAnalysis
from stepscope.traces.analyzers.steps import profiler_steps


def _decorate(job, analysis):
    """Add what a real job has beside its traces: step timeline, metrics, a rule report."""
    steps = profiler_steps(analysis.events(rank=0))
    with TimelineWriter(job, node_id="algo-1", rank=0) as writer:
        for step, ts, dur in zip(steps.step, steps.ts_ns, steps.dur_ns):
            writer.add("step", int(ts), int(ts + dur), step=int(step), mode=ModeKeys.TRAIN, phase="step")
            writer.add("forward", int(ts), int(ts + dur // 2), step=int(step), mode=ModeKeys.TRAIN, phase="forward")
            # a prefetch that crosses the step boundary: must land on an overflow track
            writer.add("data", int(ts + dur - 1000), int(ts + dur + 5000), step=int(step) + 1, mode=ModeKeys.TRAIN, phase="data")
    first = int(steps.ts_ns.min()) / 1e9
    minute = int(first // 60) * 60
    folder = job / "profiler-output/system/incremental" / time.strftime("%Y%m%d%H", time.gmtime(minute))
    folder.mkdir(parents=True)
    lines = [json.dumps({"Type": "gpu", "Name": "gpu0", "Dimension": "GPUUtilization", "Value": 50.0 + i, "NodeId": "algo-1", "Timestamp": first + i * 0.001}) for i in range(5)]
    (folder / f"{minute}.algo-1.json").write_text("\n".join(lines) + "\n")
    (job / "rule-output").mkdir()
    report = {"rule": "HighLaunchLatency", "fired": True, "fired_steps": [int(steps.step.iloc[1])], "details": []}
    (job / "rule-output/HighLaunchLatency.json").write_text(json.dumps(report))
    return steps


def _check_perfetto(document):
    events = document["traceEvents"]
    slices = defaultdict(list)
    for event in events:
        if event["ph"] == "X":
            start = round(float(event["ts"]) * 1000)
            slices[event["pid"], event["tid"]].append((start, start + round(float(event["dur"]) * 1000)))
    for track, items in slices.items():
        stack: list[int] = []
        for start, end in sorted(items, key=lambda s: (s[0], -s[1])):
            while stack and stack[-1] <= start:
                stack.pop()
            assert not stack or end <= stack[-1], f"slices overlap without nesting on track {track}"
            stack.append(end)
    flows = defaultdict(dict)
    for event in events:
        if event["ph"] in ("s", "f"):
            flows[event["id"]][event["ph"]] = event
    for flow_id, ends in flows.items():
        assert set(ends) == {"s", "f"}, f"flow {flow_id} lacks an end"
        for end in ends.values():
            ts = round(float(end["ts"]) * 1000)
            assert any(s <= ts <= e for s, e in slices[end["pid"], end["tid"]]), f"flow {flow_id} end is outside every slice of its track"
    return events, slices, flows


def test_timeline_is_perfetto_loadable(synth_job, tmp_path):
    job, truths = synth_job()
    analysis = TraceAnalysis(job)
    _decorate(job, analysis)
    output = tmp_path / "trace.json.gz"
    assert main(["timeline", str(job), "-o", str(output)]) == 0
    document = json.loads(gzip.decompress(output.read_bytes()))
    events, slices, flows = _check_perfetto(document)
    launches = sum(len(t.launch_delay) and sum(d["count"] for d in t.launch_delay.values()) for t in truths.values())
    copies = sum(sum(m["count"] for m in t.memcpy.values()) for t in truths.values())
    assert len(flows) == launches + copies  # every kernel, memcpy and memset launch
    counters = [e for e in events if e["ph"] == "C"]
    assert len(counters) == 5 and counters[0]["args"]["value"] == 50.0
    instants = [e for e in events if e["ph"] == "i"]
    assert [e["name"] for e in instants] == ["HighLaunchLatency"]
    names = {e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "thread_name"}
    assert any("(overlap 1)" in n for n in names)  # the crossing prefetch
    assert {"stream 7", "stream 20"} <= names


def test_timeline_step_range(synth_job, tmp_path):
    job, _ = synth_job(world_size=1)
    steps = _decorate(job, TraceAnalysis(job))
    output = tmp_path / "one.json"
    assert main(["timeline", str(job), "-o", str(output), "--steps", "1:1"]) == 0
    document = json.loads(output.read_text())
    events, _, _ = _check_perfetto(document)
    origin = document["metadata"]["stepscope_time_origin_ns"]
    gpu = [e for e in events if e["ph"] == "X" and e["cat"] == "gpu"]
    one = steps[steps.step == 1].iloc[0]
    assert gpu and all(origin + round(float(e["ts"]) * 1000) >= one.ts_ns for e in gpu)
    assert len(gpu) < len([e for e in TraceAnalysis(job).events(rank=0).kind if e in (0, 1, 2)])


def test_nest_lanes_properly():
    rng = np.random.default_rng(0)
    starts = rng.integers(0, 1000, 300)
    ends = starts + rng.integers(0, 200, 300)
    lanes = perfetto.nest_lanes(starts, ends)
    for lane in np.unique(lanes):
        stack: list[int] = []
        for start, end in sorted(zip(starts[lanes == lane], ends[lanes == lane]), key=lambda s: (s[0], -s[1])):
            while stack and stack[-1] <= start:
                stack.pop()
            assert not stack or end <= stack[-1]
            stack.append(end)


def test_profile_cli(synth_job, capsys):
    job, truths = synth_job()
    assert main(["profile", str(job), "--rank", "1", "--steps", "0:1", "--json"]) == 0
    tables = json.loads(capsys.readouterr().out)
    steps = {row["step"]: row for row in tables["steps"]}
    assert set(steps) == {0, 1}
    assert steps[1]["kernel_us"] * 1000 == truths[1].kernel_ns_by_step[1]
    assert main(["profile", str(job)]) == 0
    out = capsys.readouterr().out
    assert "== top kernels" in out and "ampere_sgemm_128x64_nn" in out
    assert main(["profile", str(job), "--steps", "3:1"]) == 2
    capsys.readouterr()
    for table in job.rglob("*.parquet"):
        table.unlink()
    assert main(["profile", str(job), "--progress", "--rank", "0"]) == 0
    assert "parsing window_000000.pt.trace.json.gz [" in capsys.readouterr().err
    assert main(["profile", str(job / "nothing")]) == 2
    assert "no traces in" in capsys.readouterr().err


def test_timeline_shows_real_rule_firings(synth_job, tmp_path):
    job, truths = synth_job(world_size=1)
    steps = _decorate(job, TraceAnalysis(job))
    (job / "rule-output/HighLaunchLatency.json").unlink()
    assert main(["check", str(job), "--rule", "ManySyncsPerStep:max_syncs=0", "--quiet"]) == 1
    output = tmp_path / "rules.json"
    assert main(["timeline", str(job), "-o", str(output)]) == 0
    document = json.loads(output.read_text())
    instants = [e for e in document["traceEvents"] if e["ph"] == "i"]
    assert sorted(e["args"]["step"] for e in instants) == sorted(steps.step.tolist())
    assert all(e["name"] == "ManySyncsPerStep" and "synchronize" in e["args"]["message"] for e in instants)


def test_the_old_paths_reach_the_merged_trace_that_moved_to_export():
    # stepscope.export.perfetto since it left the trace engine (it draws rule firings);
    # stepscope.traces.write_timeline and the module stepscope.traces.timeline still work.
    assert stepscope.traces.write_timeline is perfetto.write_timeline
    sys.modules.pop("stepscope.traces.timeline", None)
    with pytest.warns(DeprecationWarning, match="stepscope.export.perfetto"):
        old = importlib.import_module("stepscope.traces.timeline")
    assert old.write_timeline is perfetto.write_timeline and old.nest_lanes is perfetto.nest_lanes
