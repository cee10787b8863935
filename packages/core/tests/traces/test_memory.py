"""Allocator events of generated CUDA traces against the generator's ground truth: peaks per
step (allocated, reserved, the op at the peak), counts, growth (a planted leak), the
allocating operators, the bounded timeline and the per-rank peaks."""

from __future__ import annotations

import statistics

import pytest

from stepscope.traces import TraceAnalysis
from stepscope.traces.analyzers import allocations
from stepscope.traces.synth import SynthSpec, write_trace

DETAILED = "profiler-output/framework/pytorch/detailed"
LEAK = 3 << 20


@pytest.fixture
def memory_job(tmp_path):
    truths = {}
    for rank in range(2):
        # rank 1's activations are four times larger: its peak stands out from rank 0's.
        spec = SynthSpec(steps=4, ops_per_step=14, rank=rank, world_size=2, seed=3, memory=True, leak_bytes=LEAK if rank == 0 else 0, activation_bytes=(4 << 20) * (1 + 3 * rank))
        truths[rank] = write_trace(spec, tmp_path / f"{DETAILED}/rank{rank}/window_000000.pt.trace.json.gz")
    return TraceAnalysis(tmp_path), truths


def test_peaks_and_counts_per_step_match_truth(memory_job):
    analysis, truths = memory_job
    for rank, truth in truths.items():
        steps = analysis.memory_steps(rank=rank).set_index("step")
        assert list(steps.index) == sorted(truth.memory_by_step)
        assert set(steps["device"]) == {"cuda:0"}
        for step, expected in truth.memory_by_step.items():
            row = steps.loc[step]
            for column in ("peak_allocated", "peak_reserved", "reserved_at_peak", "allocations", "frees", "start_allocated", "end_allocated"):
                assert row[column] == expected[column], (rank, step, column)
            assert row["peak_op"] == truth.memory_peak_op[step]
            assert row["peak_annotation"] in ("## forward ##", "## backward ##")


def test_growth_finds_the_leaked_bytes_and_their_op(memory_job):
    analysis, truths = memory_job
    leaky = analysis.memory_growth(rank=0).set_index("step")
    assert leaky["outliving_bytes"].tolist() == [LEAK] * 4
    assert leaky["unfreed_bytes"].tolist() == [LEAK] * 4
    assert leaky["net_bytes"].tolist() == [LEAK] * 4
    healthy = analysis.memory_growth(rank=1)
    assert healthy["outliving_bytes"].sum() == 0 and healthy["net_bytes"].sum() == 0
    life = allocations.lifetimes(analysis.events(rank=0))
    kept = life[life["free_ts_ns"] == -1]
    assert sorted(zip(kept["step"], kept["op"])) == sorted(truths[0].leak_op.items())


def test_allocating_ops_match_truth(memory_job):
    analysis, truths = memory_job
    ops = analysis.allocating_ops(k=None, rank=0).set_index("op")
    assert ops["allocated_bytes"].to_dict() == truths[0].allocated_bytes_by_op
    assert ops["allocated_bytes"].is_monotonic_decreasing
    # Every byte allocated is freed except the leak; frees outside ops are "(no op)".
    assert ops["self_bytes"].sum() == 4 * LEAK


def test_peak_breakdown_adds_up_to_the_peak(memory_job):
    analysis, truths = memory_job
    breakdown = analysis.memory_peak(rank=0)
    peak = max(entry["peak_allocated"] for entry in truths[0].memory_by_step.values())
    assert "(before the trace)" not in set(breakdown["op"])
    assert breakdown["bytes"].sum() == peak
    assert breakdown["bytes"].is_monotonic_decreasing


def test_timeline_is_bounded_and_keeps_the_peak(memory_job):
    analysis, truths = memory_job
    full = analysis.memory_timeline(rank=1)
    assert len(full) == sum(e["allocations"] + e["frees"] for e in truths[1].memory_by_step.values())
    small = analysis.memory_timeline(rank=1, max_points=20)
    assert len(small) <= 22
    assert small["allocated"].max() == full["allocated"].max()
    assert small["ts_ns"].is_monotonic_increasing


def test_rank_peaks_name_the_high_rank(memory_job):
    analysis, truths = memory_job
    ranks = analysis.memory_ranks().set_index("rank")
    peaks = {rank: max(e["peak_allocated"] for e in truth.memory_by_step.values()) for rank, truth in truths.items()}
    median = statistics.median(peaks.values())
    for rank, peak in peaks.items():
        assert ranks.loc[rank, "peak_allocated"] == peak
        assert ranks.loc[rank, "vs_median"] == pytest.approx(peak / median)
    assert ranks.loc[1, "vs_median"] > 1.2 > 0.8 > ranks.loc[0, "vs_median"]


def test_traces_without_memory_events_give_empty_tables(synth_job):
    job, _ = synth_job(world_size=1)
    analysis = TraceAnalysis(job)
    assert analysis.memory_steps(rank=0).empty
    assert analysis.memory_growth(rank=0).empty
    assert analysis.allocating_ops(rank=0).empty
    assert analysis.memory_timeline(rank=0).empty
    assert analysis.memory_ranks().empty


@pytest.mark.parametrize(("device_type", "device_id", "label"), [(0, -1, "cpu"), (1, 0, "cuda:0"), (1, 3, "cuda:3"), (-1, -1, "cpu"), (-1, 2, "cuda:2"), (19, 0, "mtia:0"), (99, 1, "device99:1")])
def test_device_labels(device_type, device_id, label):
    assert allocations.device_label(device_type, device_id) == label
