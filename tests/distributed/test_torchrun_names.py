"""A job launched by `torchrun` names its workers by rank without configuration (RANK /
WORLD_SIZE / LOCAL_RANK), even for a hook made before the process group."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.heavy


@pytest.mark.timeout(300)
def test_torchrun_workers_are_named_by_rank(tmp_path):
    pytest.importorskip("torch")
    import stepscope
    from stepscope.modes import ModeKeys

    out = str(tmp_path / "job")
    script = str(Path(__file__).parent / "torchrun_worker.py")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", "--master_port=0", "--rdzv_backend=c10d",
         "--rdzv_endpoint=127.0.0.1:0", script, out],
        check=True, timeout=240, env=env, cwd=str(tmp_path),
    )
    trial = stepscope.create_trial(out)
    assert trial.workers() == ["worker_0", "worker_1"] and trial.num_workers == 2
    for worker, rank in (("worker_0", 0), ("worker_1", 1)):
        assert trial.tensor("rank").values(mode=ModeKeys.TRAIN, worker=worker) == {0: rank, 1: rank, 2: rank}
    assert trial.failed_workers() == {}  # two ranks are two writers, not a mix
