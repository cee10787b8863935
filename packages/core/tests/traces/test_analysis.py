"""The analyses against the generator's ground truth, persistence, and the HTA cross-check."""

from __future__ import annotations

import pathlib

import pytest

from stepscope.exceptions import ConfigError
from stepscope.traces import TraceAnalysis
from stepscope.traces.tables import TABLE_DIR

DATA = pathlib.Path(__file__).parent / "data"
DETAILED = "profiler-output/framework/pytorch/detailed"


def assert_counts_and_totals(table, truth: dict, count: str = "count", total: str = "total_us") -> None:
    """Per row (a kernel, operator, direction...): the generator's count, and its total time
    (ns) as the table's microseconds."""
    for name, expected in truth.items():
        assert table.loc[name, count] == expected["count"], name
        assert table.loc[name, total] == pytest.approx(expected["total_ns"] / 1000), name


def test_kernel_stats_match_truth(synth_job):
    job, truths = synth_job()
    analysis = TraceAnalysis(job)
    assert analysis.ranks == [0, 1]
    for rank, truth in truths.items():
        stats = analysis.kernel_stats(rank=rank).set_index("name")
        assert set(stats.index) == set(truth.kernels)
        assert_counts_and_totals(stats, truth.kernels)
        for name, expected in truth.kernels.items():
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
    assert_counts_and_totals(latency, truths[1].launch_delay, count="launches", total="total_delay_us")
    for name, expected in truths[1].launch_delay.items():
        assert latency.loc[name, "max_delay_us"] == pytest.approx(expected["max_ns"] / 1000)


def test_memory_ops_match_truth(synth_job):
    job, truths = synth_job()
    ops = TraceAnalysis(job).memory_ops(rank=0).groupby("direction")[["count", "bytes", "total_us"]].sum()
    assert_counts_and_totals(ops, truths[0].memcpy)
    for direction, expected in truths[0].memcpy.items():
        assert ops.loc[direction, "bytes"] == expected["bytes"]


def test_syncs_match_truth(synth_job):
    job, truths = synth_job()
    syncs = TraceAnalysis(job).syncs(rank=0).set_index("name")
    assert_counts_and_totals(syncs, truths[0].syncs)
    for name in truths[0].syncs:
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
    assert_counts_and_totals(ops, truths[0].cpu_ops)


def test_tables_are_persisted_and_reused(synth_job):
    job, truths = synth_job()
    analysis = TraceAnalysis(job)
    first = analysis.kernel_stats()
    analysis.wait_persisted()  # written in the background
    tables = sorted(p.relative_to(job).as_posix() for p in (job / TABLE_DIR).rglob("*.parquet"))
    assert tables == [f"{TABLE_DIR}/pytorch/detailed/rank{r}/window_000000.pt.trace.json.gz.parquet" for r in (0, 1)]
    for trace in job.rglob("*.pt.trace.json.gz"):
        trace.write_bytes(b"not a trace any more")  # a second analysis must not parse JSON
    second = TraceAnalysis(job).kernel_stats()
    assert second.equals(first)


def test_a_table_folder_that_cannot_be_made_sends_the_tables_to_the_user_cache(synth_job, tmp_path, monkeypatch):
    """Where the tables' folder cannot be made beside the traces (here a file is in its
    way; a read-only folder likewise), the tables go to the user's cache folder."""
    job, truths = synth_job(world_size=1)
    (job / TABLE_DIR).write_text("not a folder")
    monkeypatch.setenv("STEPSCOPE_CACHE_DIR", str(tmp_path / "cache"))
    analysis = TraceAnalysis(job)
    stats = analysis.kernel_stats(rank=0).set_index("name")
    analysis.wait_persisted()
    assert {n: int(round(v * 1000)) for n, v in stats.total_us.items()} == {n: k["total_ns"] for n, k in truths[0].kernels.items()}
    assert len(list((tmp_path / "cache").rglob("*.parquet"))) == 1
    assert (job / TABLE_DIR).read_text() == "not a folder"


def test_a_table_that_cannot_be_written_costs_a_warning_not_the_analysis(synth_job, caplog, monkeypatch):
    """Tables are written in the background: a failure there is logged, and neither the
    analysis nor the wait raises."""
    import logging

    from stepscope.traces import tables

    def refuse(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(tables, "_write_table", refuse)
    job, truths = synth_job(world_size=1)
    analysis = TraceAnalysis(job)
    with caplog.at_level(logging.WARNING, logger="stepscope.traces"):
        stats = analysis.kernel_stats(rank=0).set_index("name")
        analysis.wait_persisted()
    assert "could not persist the trace table" in caplog.text
    assert {n: int(round(v * 1000)) for n, v in stats.total_us.items()} == {n: k["total_ns"] for n, k in truths[0].kernels.items()}


def test_unknown_rank_is_a_clear_error(synth_job):
    job, _ = synth_job(world_size=1)
    with pytest.raises(ConfigError, match="rank 5"):
        TraceAnalysis(job).kernel_stats(rank=5)


def test_committed_fixtures_give_their_recorded_truth(tmp_path):
    """Small generated traces committed with the truth recorded when they were made: the
    format the engine reads cannot drift from what the generator once wrote."""
    import json
    import shutil

    truths = {}
    for rank in (0, 1):
        target = tmp_path / DETAILED / f"rank{rank}"
        target.mkdir(parents=True)
        shutil.copy(DATA / f"synth_rank{rank}.pt.trace.json.gz", target)
        truths[rank] = json.loads((DATA / f"synth_rank{rank}.truth.json").read_text())
    analysis = TraceAnalysis(tmp_path, persist=False)
    for rank, truth in truths.items():
        stats = analysis.kernel_stats(rank=rank).set_index("name")
        assert {n: int(round(v * 1000)) for n, v in stats.total_us.items()} == {n: k["total_ns"] for n, k in truth["kernels"].items()}
        assert analysis.temporal_breakdown(rank=rank).idle_us.iloc[0] == pytest.approx(truth["gpu_idle_ns"] / 1000)
    assert not (tmp_path / TABLE_DIR).exists()  # persist=False writes nothing


def test_rule_checks_against_truth(synth_job):
    from stepscope.traces import checks

    job, truths = synth_job()
    analysis = TraceAnalysis(job)
    syncs = checks.many_syncs_per_step(analysis, max_syncs=0)
    assert len(syncs) == 6 and syncs.fired.all() and (syncs.value == 1).all()  # one sync per generated step
    assert not checks.many_syncs_per_step(analysis, max_syncs=1).fired.any()
    memcpy = checks.memcpy_bound_steps(analysis, max_share=0.0)
    events = analysis.events(rank=0, kinds=("memcpy", "memset"))
    steps = analysis.step_breakdown(rank=0).set_index("step")
    for row in memcpy[memcpy["rank"] == 0].itertuples():
        # an independent union: mark every covered microsecond of the step
        copies = events[events.step == row.step]
        covered = set()
        for ts, dur in zip(copies.ts_ns // 1000, (copies.ts_ns + copies.dur_ns) // 1000):
            covered.update(range(int(ts), int(dur)))
        assert row.value == pytest.approx(min(1.0, len(covered) / steps.loc[row.step, "step_us"]), rel=0.01)
    latency = checks.high_launch_latency(analysis, threshold_us=0.0)
    assert latency.fired.all() and (latency.value > 0).all()
    assert not checks.high_launch_latency(analysis, threshold_us=1e9).fired.any()
    small = checks.small_kernels_dominating(analysis, max_kernel_us=1e9, min_share=0.99)
    assert (small.value == 1.0).all() and small.fired.all()


def test_traces_on_s3(s3_url, tmp_path):
    """A job on S3: the trace is read by ranged GETs in small chunks, its table is PUT next
    to it, and a second analysis reads only the table."""
    import gzip

    from stepscope.store import open_store
    from stepscope.traces.synth import SynthSpec, trace_bytes
    from stepscope.traces.tables import load_trace

    data, truth = trace_bytes(SynthSpec(steps=2, ops_per_step=20, seed=9))
    store = open_store(s3_url)
    key = f"{DETAILED}/rank0/window.pt.trace.json.gz"
    store.write(key, gzip.compress(data))
    info, frame = load_trace(store, key, persist=True)
    assert info.rank == 0 and len(frame) > 0
    analysis = TraceAnalysis(s3_url)
    stats = analysis.kernel_stats(rank=0).set_index("name")
    assert {n: int(round(v * 1000)) for n, v in stats.total_us.items()} == {n: k["total_ns"] for n, k in truth.kernels.items()}
    assert store.exists(f"{TABLE_DIR}/pytorch/detailed/rank0/window.pt.trace.json.gz.parquet")
    store.write(key, b"gone")  # the table is what a second analysis reads
    assert TraceAnalysis(s3_url).kernel_stats(rank=0).equals(analysis.kernel_stats(rank=0))


def test_tables_of_all_ranks_read_as_one_dataset(synth_job):
    """What a user with thousands of ranks does: query every rank's table at once with an
    engine of their choice (here pyarrow.dataset; DuckDB or Spark read the same files)."""
    import pyarrow.compute as pc
    import pyarrow.dataset as ds

    job, truths = synth_job()
    analysis = TraceAnalysis(job)
    analysis.traces()  # parses and persists both ranks
    analysis.wait_persisted()
    dataset = ds.dataset(str(job / TABLE_DIR), format="parquet")
    kernels = dataset.to_table(filter=pc.field("kind") == 0, columns=["rank", "dur_ns"]).group_by("rank").aggregate([("dur_ns", "sum")])
    totals = dict(zip(kernels.column("rank").to_pylist(), kernels.column("dur_ns_sum").to_pylist()))
    assert totals == {rank: sum(k["total_ns"] for k in truth.kernels.values()) for rank, truth in truths.items()}


def test_cpu_op_self_time_subtracts_direct_children():
    import pandas as pd

    from stepscope.traces.analyzers.cpu_ops import cpu_op_stats

    rows = [  # thread 1: outer(0-100) > mid(10-60) > inner(20-30); sibling(70-80); thread 2 overlaps in time
        ("outer", 1, 0, 100), ("mid", 1, 10, 50), ("inner", 1, 20, 10), ("sibling", 1, 70, 10), ("other", 2, 5, 90),
    ]
    frame = pd.DataFrame({"kind": 5, "name": [r[0] for r in rows], "tid": [r[1] for r in rows], "ts_ns": [r[2] * 1000 for r in rows], "dur_ns": [r[3] * 1000 for r in rows]})
    stats = cpu_op_stats(frame, k=None).set_index("name")
    assert stats.self_us.to_dict() == {"outer": 40.0, "mid": 40.0, "inner": 10.0, "sibling": 10.0, "other": 90.0}
    assert stats.total_us.to_dict()["outer"] == 100.0
