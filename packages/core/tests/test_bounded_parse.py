"""Every job file is a bounded, typed parse: hostile content costs that file (an error
naming it), never a hang, a traceback or the rest of the job."""

from __future__ import annotations

import gzip
import json
import time
import zlib

import pytest

from stepscope.exceptions import CorruptRecord
from stepscope.job_files import load_json


def _gzip(parts, level=6):
    packer = zlib.compressobj(level, zlib.DEFLATED, 31)
    return b"".join([packer.compress(p) for p in parts] + [packer.flush()])


def test_a_gzip_bomb_of_whitespace_fails_fast_naming_the_file(tmp_path):
    from stepscope.traces.reader import read_trace

    path = tmp_path / "bomb.pt.trace.json.gz"
    path.write_bytes(_gzip([b'{"traceEvents": ['] + [b" " * (1 << 24)] * 16 + [b"]}"]))  # 256 MiB
    assert path.stat().st_size < 1 << 20
    started = time.process_time()
    with pytest.raises(CorruptRecord, match="bomb.pt.trace.json.gz.*decompression bomb"):
        read_trace(str(path))
    assert time.process_time() - started < 20  # was minutes: spaces skipped one at a time


def test_plain_whitespace_between_events_is_skipped_not_parsed_by_hand(tmp_path):
    # 64 MiB of spaces uncompressed (no bomb): skipped a chunk at a time, events intact.
    from stepscope.traces.reader import read_trace

    event = b'{"ph":"X","cat":"cpu_op","name":"op","pid":1,"tid":1,"ts":1.0,"dur":2.0}'
    path = tmp_path / "spaced.json"
    path.write_bytes(b'{"traceEvents": [' + b" " * (64 << 20) + event + b"," + event + b"]}")
    started = time.process_time()
    trace = read_trace(str(path))
    assert trace.table.num_rows == 2
    assert time.process_time() - started < 20


@pytest.mark.parametrize(
    "data, reason",
    [
        (b"[" * 100_000 + b"]" * 100_000, "not valid JSON"),
        (b'{"a": "\xff\xfe"}', "not valid JSON"),
        (b'{"a": NaN, "b": ' + b"[" * 5000 + b"]" * 5000 + b"}", "nested deeper than 1024"),
    ],
)
def test_load_json_bounds_depth_and_encoding(data, reason):
    with pytest.raises(CorruptRecord, match=f"where.json.*{reason}"):
        load_json(data, "where.json", allow_nan=True)


def test_load_json_reads_python_nan_only_when_allowed():
    assert str(load_json(b'{"a": NaN}', "x", allow_nan=True)["a"]) == "nan"
    with pytest.raises(CorruptRecord):
        load_json(b'{"a": NaN}', "x")


@pytest.mark.parametrize("change", [{"violations": 1.5}, {"violations": "many"}, {"violations": float("inf")}, {"fired_steps": ["x"]}, {"fired_steps": [1e20]}, {"fired_steps": 5}])
def test_a_rule_report_of_the_wrong_types_is_skipped_and_named(change, tmp_path, caplog):
    from stepscope.report.findings import saved_findings
    from stepscope.store import LocalStore

    store = LocalStore(tmp_path)
    good = {"rule": "Good", "status": "ok", "violations": 0, "fired_steps": []}
    store.write("rule-output/Good.json", json.dumps(good).encode())
    store.write("rule-output/Bad.json", json.dumps({**good, "rule": "Bad", **change}).encode())
    findings = saved_findings(store)
    assert [f.rule for f in findings] == ["Good"]
    assert "Bad.json" in caplog.text


@pytest.mark.parametrize("body", [b"[" * 100_000, b'{"worker": 5}', b'{"worker": "w", "steps": 1.5}', b'{"worker": "w", "step_s": NaN}', b'{"worker": "w", "samples": [[1e20, 0.1, 0.1]]}'])
def test_a_hostile_cost_file_is_skipped(body, tmp_path):
    from stepscope.job_files import read_costs
    from stepscope.store import LocalStore

    store = LocalStore(tmp_path)
    store.write("stepscope-cost/bad.json", body)
    store.write("stepscope-cost/good.json", b'{"worker": "good", "steps": 2, "step_s": 0.5, "samples": [[0, 0.25, 0.01]]}')
    assert list(read_costs(store)) == ["good"]


def test_system_metrics_skip_deep_nan_and_huge_lines_and_keep_the_rest():
    from stepscope.profiler.reader import parse_system_metrics

    good = {"Type": "cpu", "Name": "cpu0", "Dimension": "CPUUtilization", "Value": 50, "NodeId": "n", "Timestamp": 1.7e9}
    lines = [json.dumps(good), "[" * 100_000 + "]" * 100_000, json.dumps({**good, "Value": float("nan")}), json.dumps({**good, "Timestamp": 1e300}), json.dumps({**good, "Value": 60})]
    frame = parse_system_metrics("\n".join(lines).encode(), "n", "metrics.json")
    assert frame["value"].tolist() == [50.0, 60.0]


def test_one_corrupt_trace_leaves_the_others_readable(tmp_path):
    from stepscope.traces import TraceAnalysis
    from stepscope.traces.synth import SynthSpec, write_trace

    folder = tmp_path / "profiler-output" / "framework" / "pytorch" / "detailed"
    (folder / "rank0").mkdir(parents=True)
    (folder / "rank1").mkdir(parents=True)
    write_trace(SynthSpec(steps=2, ops_per_step=4, rank=1, world_size=2), str(folder / "rank1" / "b.pt.trace.json.gz"))
    (folder / "rank0" / "a.pt.trace.json.gz").write_bytes(gzip.compress(b'{"traceEvents": [{"ph": "X", "na'))
    analysis = TraceAnalysis(tmp_path, persist=False)
    assert analysis.ranks == [1]
    assert len(analysis.traces()) == 1 and not analysis.kernel_stats().empty
    (problem,) = analysis.problems.values()
    assert "a.pt.trace.json.gz" in problem


def test_a_quote_in_an_annotation_name_costs_that_event_not_the_trace(tmp_path, caplog):
    # What torch 2.13's Kineto writes for record_function('a"b'): the name as it is.
    from stepscope.traces.reader import read_trace

    def event(cat, name, ts):
        return f'  {{\n    "ph": "X", "cat": "{cat}", "name": "{name}", "pid": 1, "tid": 1,\n    "ts": {ts}, "dur": 2\n  }}'

    body = ",\n".join([event("cpu_op", "aten::add", 1), event("user_annotation", 'a"b', 3), event("cpu_op", "aten::mul", 5), event("cpu_op", "aten::sub", 7)])
    path = tmp_path / "quoted.pt.trace.json"
    path.write_text('{\n  "schemaVersion": 1,\n  "traceEvents": [\n' + body + "\n]}\n")
    trace = read_trace(str(path))
    assert sorted(trace.table.column("name").to_pylist()) == ["aten::add", "aten::mul", "aten::sub"]
    assert "quoted.pt.trace.json" in caplog.text and "skipped" in caplog.text
