"""The Distributed section shows what JobQuery computes from the per-rank summaries, on
generated multi-rank jobs (stepscope.traces.synth) with a planted straggler whose kernels
take twice as long: no GPU, no cluster needed."""

from __future__ import annotations

import pytest

from stepscope.report import build_report, render_html
from stepscope.traces.cluster import JobQuery
from stepscope.traces.synth import SynthSpec, trace_bytes

pytest.importorskip("duckdb")

DETAILED = "profiler-output/framework/pytorch/detailed"


def _job(root, ranks: int, straggler: int | None = None, steps: int = 3):
    """`ranks` traces of the same generated work; the straggler's kernels take 2x as long."""
    truths = {}
    for rank in range(ranks):
        spec = SynthSpec(steps=steps, ops_per_step=24, seed=3, slow_factor=2.0 if rank == straggler else 1.0)
        data, truths[rank] = trace_bytes(spec)
        data = data.replace(b'"rank": 0, "world_size": 1', f'"rank": {rank}, "world_size": {ranks}'.encode(), 1)
        path = root / DETAILED / f"rank{rank}" / "window_000000.pt.trace.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    return str(root), truths


def test_rank_table_and_stragglers_equal_jobquery(tmp_path):
    job, truths = _job(tmp_path, ranks=5, straggler=3)
    report = build_report(job, rules="run")
    section = report.section("distributed")
    assert not section.missing, section.missing
    with JobQuery(job) as query:
        expected = query.rank_comparison()
        stragglers = query.straggler_ranks()
    table = section.table("distributed-ranks")
    assert [row[0] for row in table.rows] == expected["rank"].tolist() == [0, 1, 2, 3, 4]
    for i, column in enumerate(("steps", "mean_step_us", "compute_kernel_us", "comm_kernel_us", "gpu_idle_us", "vs_median_pct"), start=1):
        assert [row[i] for row in table.rows] == pytest.approx(expected[column].tolist()), column
    # Independently of JobQuery: the generator's truth of the mean step time per rank.
    for row in table.rows:
        truth = truths[row[0]]
        assert row[2] == pytest.approx(sum(truth.step_ns.values()) / len(truth.step_ns) / 1e3)
        assert row[3] == pytest.approx(sum(truth.kernel_ns_by_step.values()) / len(truth.kernel_ns_by_step) / 1e3)
        assert row[4] == 0  # the generator launches no communication kernels
    slow = section.table("distributed-stragglers")
    assert [row[0] for row in slow.rows] == stragglers["rank"].tolist() == [3]
    assert slow.rows[0][1] == len(truths[3].step_ns) and slow.rows[0][7] == "compute kernels"
    assert slow.rows[0][5] == pytest.approx(float(stragglers["median_excess_us"].iloc[0]))
    html = render_html(report)
    assert 'data-table="distributed-ranks"' in html and "RankStraggler: fired" in html


def test_even_job_has_no_straggler_and_single_rank_says_so(tmp_path):
    job, _ = _job(tmp_path / "even", ranks=4)
    section = build_report(job, rules="none").section("distributed")
    assert section.table("distributed-stragglers") is None
    assert len(section.table("distributed-ranks").rows) == 4
    assert any("RankStraggler" in line for line in section.missing)  # no rules run: says how to get the verdict
    single, _ = _job(tmp_path / "one", ranks=1)
    section = build_report(single, rules="none").section("distributed")
    assert [type(b).__name__ for b in section.blocks] == ["Paragraph"] and "Single-rank" in section.blocks[0].text


def test_ranks_view_data_equals_the_report_and_says_why_when_unavailable(tmp_path):
    from stepscope import create_trial
    from stepscope.ui.ranks import _ranks

    job, _ = _job(tmp_path / "four", ranks=4, straggler=1)
    data = _ranks(create_trial(job))
    table = build_report(job, rules="none").section("distributed").table("distributed-ranks")
    assert data["available"] and [row[0] for row in data["ranks"]["rows"]] == [row[0] for row in table.rows]
    mean_step = data["ranks"]["columns"].index("mean_step_us")
    assert [row[mean_step] for row in data["ranks"]["rows"]] == pytest.approx([row[2] for row in table.rows])
    assert [row[0] for row in data["stragglers"]["rows"]] == [1]
    single, _ = _job(tmp_path / "one", ranks=1)
    assert "single-rank" in _ranks(create_trial(single))["reason"]
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "training_job_end.ts").write_text("")
    assert "no detailed traces" in _ranks(create_trial(str(tmp_path / "empty")))["reason"]
