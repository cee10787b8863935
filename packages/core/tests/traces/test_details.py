"""Operator and kernel views (stepscope.traces.details) against torch.profiler's own
key_averages on a real CPU recording, and against the fields of a real A100 Kineto trace."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np
import pytest

from stepscope.cli import main
from stepscope.store import open_store
from stepscope.traces import details

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "traces"
A100 = "hta__ns_resolution_trace__rank-0.Apr_03_18_51_38.1102.pt.trace.json.gz"


def _record(path: Path, *, with_stack: bool):
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)

    def train_step():
        optimizer.zero_grad()
        model(torch.randn(8, 16)).sum().backward()
        optimizer.step()

    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], record_shapes=True, with_stack=with_stack) as prof:
        for _ in range(3):
            train_step()
    path.parent.mkdir(parents=True, exist_ok=True)
    prof.export_chrome_trace(str(path))
    return prof


def test_operators_equal_torch_key_averages(tmp_path):
    prof = _record(tmp_path / "cpu.pt.trace.json", with_stack=False)
    events = details.read_events(open_store(str(tmp_path)), "cpu.pt.trace.json")
    by_name = details.operator_table(events, "name").set_index("name")
    compared = 0
    for avg in prof.key_averages():
        if avg.key not in by_name.index:  # record_function annotations are not operators
            continue
        row = by_name.loc[avg.key]
        assert row["calls"] == avg.count, avg.key
        assert row["total_us"] == pytest.approx(avg.cpu_time_total, rel=1e-6, abs=0.01), avg.key
        assert row["self_us"] == pytest.approx(avg.self_cpu_time_total, rel=1e-6, abs=0.01), avg.key
        compared += 1
    assert compared >= 10
    by_shapes = details.operator_table(events, "shapes").set_index(["name", "input_shapes"])
    for avg in prof.key_averages(group_by_input_shape=True):
        shapes = ", ".join("[" + ", ".join(str(d) for d in dims) + "]" for dims in avg.input_shapes)
        if (avg.key, shapes) in by_shapes.index:
            row = by_shapes.loc[(avg.key, shapes)]
            assert row["calls"] == avg.count and row["total_us"] == pytest.approx(avg.cpu_time_total, rel=1e-6, abs=0.01)
    assert ("aten::mm", "[32, 8], [8, 16]") in by_shapes.index  # the backward of Linear(16, 32) for a batch of 8


def test_operators_carry_the_users_call_stack(tmp_path):
    _record(tmp_path / "stack.pt.trace.json", with_stack=True)
    events = details.read_events(open_store(str(tmp_path)), "stack.pt.trace.json")
    ops = details.operator_table(events, "name").set_index("name")
    assert "train_step" in ops.loc["aten::addmm", "stack"] and "test_details.py" in ops.loc["aten::addmm", "stack"]
    assert "torch/" not in ops.loc["aten::addmm", "stack"]  # the user's frames, not torch's
    by_stack = details.operator_table(events, "stack")
    assert (by_stack["stack"] != "").any()


def test_kernels_on_a_real_a100_trace():
    raw = json.loads(gzip.open(FIXTURES / A100).read())["traceEvents"]
    kernels = [e for e in raw if e.get("cat") == "kernel"]
    events = details.read_events(open_store(str(FIXTURES)), A100)
    table = details.kernel_table(events, "name")
    assert table["calls"].sum() == len(kernels)
    assert table["total_us"].sum() == pytest.approx(sum(e["dur"] for e in kernels))
    name = table["name"].iloc[0]
    mine = [e for e in kernels if e["name"] == name]
    row = table.iloc[0]
    assert row["calls"] == len(mine) and row["total_us"] == pytest.approx(sum(e["dur"] for e in mine))
    assert row["occupancy_pct"] == pytest.approx(np.mean([e["args"]["est. achieved occupancy %"] for e in mine]))
    assert row["registers_per_thread"] == max(e["args"]["registers per thread"] for e in mine)
    blocks = {"x".join(str(v) for v in e["args"]["block"]) for e in mine}
    assert row["block"] == (blocks.pop() if len(blocks) == 1 else "(several)")
    # the launching operator: the cpu_op with the kernel's External id
    ops = {e["args"]["External id"]: e["name"] for e in raw if e.get("cat") == "cpu_op"}
    by_op = details.kernel_table(events, "op")
    first = by_op.iloc[0]
    expected = [e for e in kernels if e["name"] == first["name"] and ops.get(e["args"].get("External id")) == first["launched_by"]]
    assert first["calls"] == len(expected) and first["launched_by"].startswith("aten::")
    assert by_op["calls"].sum() == len(kernels)


def test_tensor_cores_are_read_from_kernel_names():
    events = [{"ph": "X", "cat": "kernel", "name": n, "ts": 0, "dur": 1.0, "args": {}} for n in ("ampere_fp16_s16816gemm_fp16_128x128", "volta_sgemm_64x64_nt")]
    table = details.kernel_table(events).set_index("name")
    assert table.loc["ampere_fp16_s16816gemm_fp16_128x128", "tensor_cores"] and not table.loc["volta_sgemm_64x64_nt", "tensor_cores"]
    assert np.isnan(table.loc["volta_sgemm_64x64_nt", "occupancy_pct"])  # not in this trace: NaN, not 0


def test_bad_traces_are_named(tmp_path):
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(details.TraceDetailError, match="bad.json: not a JSON trace"):
        details.read_events(open_store(str(tmp_path)), "bad.json")
    (tmp_path / "bomb.json.gz").write_bytes(gzip.compress(b" " * (80 << 20)))
    with pytest.raises(details.TraceDetailError, match="bomb.json.gz: decompresses to more than"):
        details.read_events(open_store(str(tmp_path)), "bomb.json.gz")


def test_profile_view_cli(capsys):
    pytest.importorskip("pyarrow")
    assert main(["profile", str(FIXTURES / A100), "--view", "kernels", "--top", "3", "--json"]) == 0
    tables = json.loads(capsys.readouterr().out)
    assert set(tables) == {"kernels", "kernels_by_op"} and len(tables["kernels"]) == 3
    assert {"grid", "block", "registers_per_thread", "occupancy_pct", "tensor_cores", "launched_by"} <= set(tables["kernels"][0])
    assert main(["profile", str(FIXTURES / A100), "--view", "operators", "--top", "2"]) == 0
    out = capsys.readouterr().out
    assert "== operators by shapes" in out and "== operators by stack" in out
