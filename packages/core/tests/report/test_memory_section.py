"""The memory section shows what the trace engine computes from the allocator events of a
job's detailed traces (generated CUDA traces with known truth: no GPU needed)."""

from __future__ import annotations

import pytest

from stepscope import create_trial
from stepscope.report import build_report, render_html
from stepscope.traces.synth import SynthSpec, write_trace

DETAILED = "profiler-output/framework/pytorch/detailed"


@pytest.fixture
def memory_job(tmp_path):
    truths = {}
    for rank in range(2):
        spec = SynthSpec(steps=3, ops_per_step=12, rank=rank, world_size=2, seed=4, memory=True, leak_bytes=(1 << 20) if rank == 1 else 0)
        truths[rank] = write_trace(spec, tmp_path / f"{DETAILED}/rank{rank}/w.pt.trace.json.gz")
    return str(tmp_path), truths


def test_tables_and_timelines_equal_the_engine(memory_job):
    job, truths = memory_job
    report = build_report(job, rules="none")
    section = report.section("memory")
    assert not section.missing
    ranks = section.table("memory-ranks")
    peaks = {row[0]: row[list(ranks.columns).index("peak_allocated_mib")] for row in ranks.rows}
    for rank, truth in truths.items():
        assert peaks[rank] == pytest.approx(max(e["peak_allocated"] for e in truth.memory_by_step.values()) / (1 << 20))
    traces = create_trial(job).profiler.traces
    steps = section.table("memory-steps")
    assert [row[list(steps.columns).index("peak_op")] for row in steps.rows] == traces.memory_steps()["peak_op"].tolist()
    growth = section.table("memory-growth")  # only the leaking rank keeps memory
    assert {row[0] for row in growth.rows} == {1}
    assert section.table("memory-peak") is not None and section.table("memory-ops") is not None
    html = render_html(report)
    for rank in (0, 1):
        assert f'data-figure="memory-timeline-rank{rank}"' in html


def test_without_allocator_events_it_says_what_to_record(tmp_path):
    write_trace(SynthSpec(steps=2), tmp_path / f"{DETAILED}/rank0/w.pt.trace.json.gz")
    section = build_report(str(tmp_path), rules="none").section("memory")
    assert not section.blocks and "profile_memory=True" in section.missing[0]
