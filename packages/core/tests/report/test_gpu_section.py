"""The GPU section shows what the trace engine computes from a job's detailed traces
(generated Kineto traces with known content: no GPU needed)."""

from __future__ import annotations

import pytest

from stepscope import create_trial
from stepscope.report import build_report, render_html
from stepscope.report.sections.gpu import MAX_NAME
from stepscope.traces.synth import SynthSpec, write_trace

DETAILED = "profiler-output/framework/pytorch/detailed"


@pytest.fixture
def traced_job(tmp_path):
    for rank in range(2):
        write_trace(SynthSpec(steps=3, ops_per_step=20, rank=rank, world_size=2, seed=3), tmp_path / f"{DETAILED}/rank{rank}/w.pt.trace.json.gz")
    return str(tmp_path)


def test_tables_equal_the_trace_engine(traced_job):
    section = build_report(traced_job, rules="none").section("gpu")
    assert not section.missing
    traces = create_trial(traced_job).profiler.traces
    top = traces.top_kernels(k=15, by="time")
    table = section.table("gpu-top-kernels-time")
    assert table.columns == tuple(top.columns)
    assert len(table.rows) == len(top)
    total_us = list(top.columns).index("total_us")
    assert [row[total_us] for row in table.rows] == pytest.approx(top["total_us"].tolist())
    assert all(len(str(cell)) <= MAX_NAME for row in table.rows for cell in row)
    memory = section.table("gpu-memory-ops")
    assert [row[list(memory.columns).index("bytes")] for row in memory.rows] == traces.memory_ops()["bytes"].tolist()
    for key in ("gpu-top-kernels-launches", "gpu-launch-latency", "gpu-syncs", "gpu-temporal", "gpu-idle"):
        assert section.table(key) is not None, key
    assert "data-figure=\"gpu-launch-histogram\"" in render_html(build_report(traced_job, rules="none"))


def test_without_traces_it_says_what_to_save(tmp_path, write_job):
    write_job(str(tmp_path / "job"), steps=2, eval_steps=0)
    section = build_report(str(tmp_path / "job"), rules="none").section("gpu")
    assert not section.blocks and "detailed traces" in section.missing[0]


def test_cpu_only_window_shows_its_operators(tmp_path):
    """A real torch.profiler window on the CPU (as a CPU-only job records it): the section
    says there is no GPU activity and shows the operators, with torch's own self times."""
    torch = pytest.importorskip("torch")
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))
    x = torch.randn(16, 32)
    trace = tmp_path / DETAILED / "rank0" / "w.pt.trace.json"
    trace.parent.mkdir(parents=True)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        for step in range(2):
            with torch.profiler.record_function(f"ProfilerStep#{step}"):
                model(x).sum().backward()
    prof.export_chrome_trace(str(trace))
    section = build_report(str(tmp_path), rules="none").section("gpu")
    assert "no GPU activity" in section.missing[0] and "CPU operators are below" in section.missing[0]
    table = section.table("cpu-operators")
    names = [row[table.columns.index("name")] for row in table.rows]
    assert "aten::addmm" in names
    selfs = [row[table.columns.index("self_us")] for row in table.rows]
    assert selfs == sorted(selfs, reverse=True)
    # torch's own count of addmm calls in the window
    ours = table.rows[names.index("aten::addmm")][table.columns.index("count")]
    theirs = next(e.count for e in prof.key_averages() if e.key == "aten::addmm")
    assert ours == theirs
