"""DDP with 2 processes on CPU (gloo): rank-aware workers read by one trial."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

import stepscope
from stepscope.modes import ModeKeys


@pytest.mark.heavy
def test_ddp_two_ranks(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(Path(__file__).parent))
    import ddp_worker

    out_dirs = {"all": str(tmp_path / "all"), "one": str(tmp_path / "one")}
    seen_file = str(tmp_path / "seen")
    torch.multiprocessing.spawn(ddp_worker.train_rank, args=(2, str(tmp_path / "init"), out_dirs, seen_file), nprocs=2, join=True)
    seen = [torch.load(f"{seen_file}.{rank}") for rank in range(2)]

    everyone = stepscope.create_trial(out_dirs["all"])
    assert everyone.workers() == ["worker_0", "worker_1"]
    assert everyone.steps(mode=ModeKeys.TRAIN) == [0, 1, 2]
    tensor = everyone.tensor("gradient/0.weight")  # no "module." prefix from the DDP wrapper
    for step in range(3):
        for rank in range(2):
            np.testing.assert_array_equal(tensor.value(step, worker=f"worker_{rank}"), seen[rank]["all"][step]["0.weight"].numpy())
    # DDP averaged the gradients: both ranks saved the same values.
    np.testing.assert_array_equal(tensor.value(2, worker="worker_0"), tensor.value(2, worker="worker_1"))
    assert everyone.is_complete()

    rank0 = stepscope.create_trial(out_dirs["one"])
    assert rank0.workers() == ["worker_0"]
    np.testing.assert_array_equal(rank0.tensor("gradient/2.bias").value(1), seen[0]["one"][1]["2.bias"].numpy())
