"""GPU active time (kernels / memcpy+memset / sync / idle) against a brute-force count over
every microsecond of a random trace."""

from __future__ import annotations

import json

import numpy as np
import pytest

from stepscope.traces import TraceAnalysis

DETAILED = "profiler-output/framework/pytorch/detailed"


def _random_trace(seed: int) -> tuple[dict, dict[str, int]]:
    rng = np.random.default_rng(seed)
    events, grid_kind = [], np.zeros(5_000, dtype=np.int8)  # 0 idle, 1 sync, 2 memory, 3 kernel
    for cat, name, level in (("kernel", "gemm_kernel", 3), ("gpu_memcpy", "Memcpy HtoD (Pageable -> Device)", 2), ("gpu_memset", "Memset (Device)", 2), ("cuda_sync", "Stream Wait Event", 1)):
        for _ in range(40):
            start = int(rng.integers(100, 4_800))
            dur = int(rng.integers(1, 150))
            stream = int(rng.integers(7, 10))
            events.append({"ph": "X", "cat": cat, "name": name, "pid": 0, "tid": stream, "ts": start, "dur": dur,
                           "args": {"device": 0, "stream": stream, "correlation": len(events) + 1000}})
            grid_kind[start : start + dur] = np.maximum(grid_kind[start : start + dur], level)
    starts = [e["ts"] for e in events]
    ends = [e["ts"] + e["dur"] for e in events]
    first, last = min(starts), max(ends)
    window = grid_kind[first:last]
    covered = {"kernel": int((window == 3).sum()), "memory": int((window == 2).sum()), "sync": int((window == 1).sum()), "idle": int((window == 0).sum()), "span": last - first}
    trace = {"schemaVersion": 1, "distributedInfo": {"backend": "nccl", "rank": 0, "world_size": 1}, "traceEvents": events}
    return trace, covered


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_active_time_partitions_the_span(tmp_path, seed):
    trace, truth = _random_trace(seed)
    folder = tmp_path / "job" / DETAILED / "rank0"
    folder.mkdir(parents=True)
    (folder / "window_0.pt.trace.json").write_text(json.dumps(trace))
    row = TraceAnalysis(str(tmp_path / "job"), persist=False).active_time(rank=0).iloc[0]
    assert row.span_us == pytest.approx(truth["span"])
    assert row.kernel_us == pytest.approx(truth["kernel"])
    assert row.memory_us == pytest.approx(truth["memory"])
    assert row.sync_us == pytest.approx(truth["sync"])
    assert row.idle_us == pytest.approx(truth["idle"])
    assert row.kernel_us + row.memory_us + row.sync_us + row.idle_us == pytest.approx(row.span_us)
