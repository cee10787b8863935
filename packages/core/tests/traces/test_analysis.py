"""The analyses against the generator's ground truth, persistence, and the HTA cross-check."""

from __future__ import annotations

import pytest

from stepscope.exceptions import ConfigError
from stepscope.traces import TraceAnalysis
from stepscope.traces.tables import TABLE_DIR


def test_kernel_stats_match_truth(synth_job):
    job, truths = synth_job()
    analysis = TraceAnalysis(job)
    assert analysis.ranks == [0, 1]
    for rank, truth in truths.items():
        stats = analysis.kernel_stats(rank=rank).set_index("name")
        assert set(stats.index) == set(truth.kernels)
        for name, expected in truth.kernels.items():
            assert stats.loc[name, "count"] == expected["count"]
            assert stats.loc[name, "total_us"] == pytest.approx(expected["total_ns"] / 1000)
            assert stats.loc[name, "max_us"] == pytest.approx(expected["max_ns"] / 1000)
        by_stream = analysis.kernel_stats(by="stream", rank=rank).groupby("stream").total_us.sum()
        assert by_stream.to_dict() == pytest.approx({s: v / 1000 for s, v in truth.kernel_ns_by_stream.items()})
        by_annotation = analysis.kernel_stats(by="annotation", rank=rank).groupby("annotation").total_us.sum()
        assert by_annotation.to_dict() == pytest.approx({a: v / 1000 for a, v in truth.kernel_ns_by_annotation.items()})
    precision = analysis.kernel_stats(by="precision", rank=0).set_index("precision")
    assert {"fp32", "fp16", "bf16"} <= set(precision.index)


def test_top_kernels_order(synth_job):
    job, truths = synth_job(world_size=1)
    top = TraceAnalysis(job).top_kernels(k=3, rank=0)
    expected = sorted(truths[0].kernels.items(), key=lambda item: -item[1]["total_ns"])[:3]
    assert list(top.name) == [name for name, _ in expected]
    by_launches = TraceAnalysis(job).top_kernels(k=1, by="launches", rank=0)
    assert by_launches["count"].iloc[0] == max(v["count"] for v in truths[0].kernels.values())


def test_launch_latency_matches_truth(synth_job):
    job, truths = synth_job()
    latency = TraceAnalysis(job).launch_latency(rank=1).set_index("name")
    for name, expected in truths[1].launch_delay.items():
        assert latency.loc[name, "launches"] == expected["count"]
        assert latency.loc[name, "total_delay_us"] == pytest.approx(expected["total_ns"] / 1000)
        assert latency.loc[name, "max_delay_us"] == pytest.approx(expected["max_ns"] / 1000)


def test_memory_ops_match_truth(synth_job):
    job, truths = synth_job()
    ops = TraceAnalysis(job).memory_ops(rank=0).groupby("direction")[["count", "bytes", "total_us"]].sum()
    for direction, expected in truths[0].memcpy.items():
        assert ops.loc[direction, "count"] == expected["count"]
        assert ops.loc[direction, "bytes"] == expected["bytes"]
        assert ops.loc[direction, "total_us"] == pytest.approx(expected["total_ns"] / 1000)


def test_syncs_match_truth(synth_job):
    job, truths = synth_job()
    syncs = TraceAnalysis(job).syncs(rank=0).set_index("name")
    for name, expected in truths[0].syncs.items():
        assert syncs.loc[name, "count"] == expected["count"]
        assert syncs.loc[name, "total_us"] == pytest.approx(expected["total_ns"] / 1000)
        assert 0 < syncs.loc[name, "gpu_wait_us"] <= syncs.loc[name, "total_us"]
        assert syncs.loc[name, "waited_for"]


def test_idle_time_matches_truth(synth_job):
    job, truths = synth_job()
    analysis = TraceAnalysis(job)
    for rank, truth in truths.items():
        breakdown = analysis.temporal_breakdown(rank=rank).iloc[0]
        assert breakdown.span_us == pytest.approx(truth.gpu_span_ns / 1000)
        assert breakdown.idle_us == pytest.approx(truth.gpu_idle_ns / 1000)
        idle = analysis.idle_breakdown(rank=rank)
        assert idle.set_index("stream").idle_us.to_dict() == pytest.approx({s: v / 1000 for s, v in truth.idle_ns_by_stream.items()})
        for category, value in truth.idle_by_category.items():
            assert idle[f"{category}_us"].sum() == pytest.approx(value / 1000)


def test_steps_and_ranks(synth_job):
    job, truths = synth_job()
    analysis = TraceAnalysis(job)
    steps = analysis.step_breakdown(rank=1)
    assert steps.set_index("step").step_us.to_dict() == pytest.approx({s: v / 1000 for s, v in truths[1].step_ns.items()})
    assert steps.set_index("step").kernel_us.to_dict() == pytest.approx({s: v / 1000 for s, v in truths[1].kernel_ns_by_step.items()})
    ranks = analysis.rank_comparison()
    for step in truths[0].step_ns:
        rows = ranks[ranks.step == step].set_index("rank")
        slowest = max(truths, key=lambda r: truths[r].step_ns[step])
        assert rows.loc[slowest, "slowest"] and not rows.loc[1 - slowest, "slowest"]
    only = analysis.kernel_stats(rank=0, steps=(1, 1))
    assert only["total_us"].sum() == pytest.approx(truths[0].kernel_ns_by_step[1] / 1000)


def test_cpu_ops_match_truth(synth_job):
    job, truths = synth_job(world_size=1)
    ops = TraceAnalysis(job).cpu_ops(k=None, rank=0).set_index("name")
    for name, expected in truths[0].cpu_ops.items():
        assert ops.loc[name, "count"] == expected["count"]
        assert ops.loc[name, "total_us"] == pytest.approx(expected["total_ns"] / 1000)


def test_tables_are_persisted_and_reused(synth_job):
    job, truths = synth_job()
    first = TraceAnalysis(job).kernel_stats()
    tables = sorted(p.relative_to(job).as_posix() for p in (job / TABLE_DIR).rglob("*.parquet"))
    assert tables == [f"{TABLE_DIR}/pytorch/detailed/rank{r}/window_000000.pt.trace.json.gz.parquet" for r in (0, 1)]
    for trace in job.rglob("*.pt.trace.json.gz"):
        trace.write_bytes(b"not a trace any more")  # a second analysis must not parse JSON
    second = TraceAnalysis(job).kernel_stats()
    assert second.equals(first)


def test_unknown_rank_is_a_clear_error(synth_job):
    job, _ = synth_job(world_size=1)
    with pytest.raises(ConfigError, match="rank 5"):
        TraceAnalysis(job).kernel_stats(rank=5)
