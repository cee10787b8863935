"""The streaming reader: every layout it meets gives the same columns as an exact parse."""

from __future__ import annotations

import gzip
import json

import numpy as np
import pytest

from stepscope.exceptions import CorruptRecord
from stepscope.traces.reader import read_trace
from stepscope.traces.schema import KIND_CODE
from stepscope.traces.synth import SynthSpec, trace_bytes


def _kernel_totals(table):
    frame = table.to_pandas()
    kernels = frame[frame.kind == KIND_CODE["kernel"]]
    return kernels.groupby("name", observed=True).dur_ns.agg(["count", "sum", "max"])


def test_generated_trace_gives_ground_truth_in_every_chunking():
    data, truth = trace_bytes(SynthSpec(steps=2, ops_per_step=20, seed=3))
    results = [read_trace(data, chunk_bytes=size) for size in (512, 4096, 1 << 20)]
    for raw in results:
        assert raw.slow_chunks == 0  # the fast path read every chunk
        totals = _kernel_totals(raw.table)
        for name, expected in truth.kernels.items():
            assert tuple(totals.loc[name]) == (expected["count"], expected["total_ns"], expected["max_ns"])
        assert raw.metadata["distributedInfo"]["rank"] == 0
        assert raw.base_ns == SynthSpec().base_time_ns
    assert results[0].table.equals(results[2].table)


def test_gzip_and_plain_agree(tmp_path):
    data, _ = trace_bytes(SynthSpec(steps=1, ops_per_step=10))
    (tmp_path / "t.json.gz").write_bytes(gzip.compress(data))
    (tmp_path / "t.json").write_bytes(data)
    assert read_trace(tmp_path / "t.json.gz", chunk_bytes=1024).table.equals(read_trace(tmp_path / "t.json", chunk_bytes=1024).table)


def test_odd_layouts_fall_back_to_the_exact_parser():
    # A separator inside a string, a nested array of objects, a string where a number is
    # expected, the bare-array form: the fast path must not get any of them wrong.
    events = [
        {"ph": "X", "cat": "kernel", "name": "k<{lambda()#1},{lambda()#2}>", "pid": 0, "tid": 7, "ts": 10.5, "dur": 2.25, "args": {"stream": 7, "correlation": 5}},
        {"ph": "X", "cat": "cpu_op", "name": "aten::x", "pid": 1, "tid": 1, "ts": 9, "dur": 3, "args": {"list": [{"a": 1}, {"b": 2}], "External id": 4}},
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1, "ts": 9.5, "dur": 0.5, "args": {"correlation": "5"}},
    ]
    for text in (json.dumps({"traceEvents": events}), json.dumps(events), json.dumps(events)[:-1]):
        raw = read_trace(text.encode(), chunk_bytes=64)
        frame = raw.table.to_pandas().sort_values("ts_ns")  # rows come sorted by kind
        assert list(frame.name.astype(str)) == [events[i]["name"] for i in (1, 2, 0)]
        assert list(frame.ts_ns) == [9000, 9500, 10500]
        assert list(frame.dur_ns) == [3000, 500, 2250]
        assert frame.correlation.tolist() == [-1, 5, 5]


@pytest.mark.parametrize("indent", [None, 2])
def test_chunk_cuts_never_split_an_event(tmp_path, indent):
    """Files read in chunks of every size: the cut between chunks must fall between two
    top-level events even where a `},{` sits in a string or in a nested array of objects
    right at a chunk boundary; Kineto's own layout (one key per line, indented) too."""
    events = []
    for i in range(60):
        args = {"correlation": i, "stream": 7}
        if i % 7 == 3:
            args["list"] = [{"a": i}, {"b": {"c": [1, {"d": 2}]}}, {"ph": "X"}]
        name = f'k{i}<{{lambda()#1}},{{"lambda"()#2}}, {{\n}}>' if i % 5 == 2 else f"kernel_{i}"
        events.append({"ph": "X", "cat": "kernel", "name": name, "pid": 0, "tid": 7, "ts": 100 + i * 3.5, "dur": 1.25 + i, "args": args})
    text = json.dumps({"schemaVersion": 1, "traceEvents": events, "deviceProperties": []}, indent=indent).encode()
    (tmp_path / "t.json").write_bytes(text)
    (tmp_path / "t.json.gz").write_bytes(gzip.compress(text))
    expected_names = [e["name"] for e in events]
    for size in (48, 97, 256, 1000, 4093, 1 << 20):
        for path in (tmp_path / "t.json", tmp_path / "t.json.gz"):
            raw = read_trace(path, chunk_bytes=size)
            frame = raw.table.to_pandas()
            assert list(frame.name.astype(str)) == expected_names, (size, path.name)
            assert frame.ts_ns.tolist() == [int(round(e["ts"] * 1000)) for e in events]
            assert frame.dur_ns.tolist() == [int(round(e["dur"] * 1000)) for e in events]
            assert frame.correlation.tolist() == list(range(60))


@pytest.mark.parametrize("cores", [2, 16])
def test_kinetos_indented_layout_takes_the_fast_path(tmp_path, monkeypatch, cores):
    """Kineto writes one key per line: on two cores each chunk is one pyarrow block (the
    newlines inside events stay), on more pyarrow splits chunks at newlines (they become
    spaces first). Both must read every chunk fast and give what the compact layout gives."""
    from stepscope.traces import reader

    monkeypatch.setattr(reader, "_CORES", cores)
    data, truth = trace_bytes(SynthSpec(steps=3, ops_per_step=40, seed=5))
    document = json.loads(data)
    events = ",\n".join("  " + json.dumps(e, indent=2).replace("\n", "\n  ") for e in document.pop("traceEvents"))
    head = json.dumps(document)[:-1]
    (tmp_path / "t.json").write_bytes(f'{head}, "traceEvents": [\n{events}\n]}}'.encode())
    compact = read_trace(data, chunk_bytes=1 << 20).table
    for size in (4096, 65536, 1 << 20):
        raw = read_trace(tmp_path / "t.json", chunk_bytes=size)
        assert raw.slow_chunks == 0, size
        assert raw.table.equals(compact), size


def test_string_pids_do_not_break_the_fast_path():
    text = '{"traceEvents": [\n{"ph": "X", "cat": "cpu_op", "name": "a", "pid": "Spans", "tid": "x", "ts": 1, "dur": 1},\n{"ph": "X", "cat": "cpu_op", "name": "b", "pid": 3, "tid": 4, "ts": 2, "dur": 1}\n]}'
    raw = read_trace(text.encode())
    assert raw.slow_chunks == 0
    assert raw.table.column("pid").to_pylist() == [-1, 3]


def test_truncated_and_non_traces_name_the_problem():
    data, _ = trace_bytes(SynthSpec(steps=1, ops_per_step=5))
    with pytest.raises(CorruptRecord, match="inside an event"):
        read_trace(data[: len(data) // 2 + 7], chunk_bytes=1 << 20)
    with pytest.raises(CorruptRecord, match="traceEvents"):
        read_trace(b'{"something": 1}')
    packed = bytearray(gzip.compress(data))
    packed[len(packed) // 2 : len(packed) // 2 + 64] = b"\x00" * 64
    with pytest.raises(CorruptRecord, match="gzip"):
        read_trace(bytes(packed))


def test_steps_are_assigned_host_by_time_gpu_by_launch():
    data, truth = trace_bytes(SynthSpec(steps=3, ops_per_step=12, first_step=40))
    frame = read_trace(data).table.to_pandas()
    kernels = frame[frame.kind == KIND_CODE["kernel"]]
    per_step = kernels.groupby("step").dur_ns.sum().to_dict()
    assert per_step == truth.kernel_ns_by_step
    assert set(np.unique(frame.step)) <= {-1, 40, 41, 42}
