"""Fixtures of the trace engine's tests: generated Kineto jobs with their ground truth."""

from __future__ import annotations

import pytest

from stepscope.traces.synth import SynthSpec, write_trace

DETAILED = "profiler-output/framework/pytorch/detailed"


@pytest.fixture
def synth_job(tmp_path):
    """A two-rank job of generated GPU traces; returns (job dir, {rank: truth})."""

    def _make(steps: int = 3, ops_per_step: int = 30, world_size: int = 2, gz: bool = True, **extra):
        truths = {}
        for rank in range(world_size):
            spec = SynthSpec(steps=steps, ops_per_step=ops_per_step, rank=rank, world_size=world_size, seed=7, slow_factor=1.0 + rank, **extra)
            name = f"{DETAILED}/rank{rank}/window_000000.pt.trace.json" + (".gz" if gz else "")
            truths[rank] = write_trace(spec, tmp_path / name)
        return tmp_path, truths

    return _make
