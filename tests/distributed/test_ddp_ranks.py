"""DDP with 4 ranks on CPU (gloo), every rank saving: per-rank files, every step
complete across workers, per-worker values equal to each rank's, per-rank step timelines
that name a straggler planted by a sleep."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

pytestmark = pytest.mark.heavy


@pytest.mark.timeout(300)
# 4 ranks only: 2 and 3 ranks are trained by test_ddp_stop_all_ranks.py and
# test_rule_stops_all_ranks.py, and a 2-rank run of this test (a minute of CI on 2 cores)
# checked nothing that 4 ranks do not.
@pytest.mark.parametrize("world_size", [4])
def test_ddp_ranks_all_workers(tmp_path, monkeypatch, world_size):
    torch = pytest.importorskip("torch")
    monkeypatch.syspath_prepend(str(Path(__file__).parent))
    import ddp_ranks

    import stepscope
    from stepscope.rules.profiler import StepOutlier, run_profiler_rules

    out = str(tmp_path / "job")
    torch.multiprocessing.spawn(ddp_ranks.train_rank, args=(world_size, str(tmp_path / "init"), out, str(tmp_path / "seen")), nprocs=world_size, join=True)
    seen = [torch.load(f"{tmp_path / 'seen'}.{rank}") for rank in range(world_size)]

    trial = stepscope.create_trial(out)
    workers = [f"worker_{r}" for r in range(world_size)]
    assert trial.workers() == workers and trial.num_workers == world_size
    assert trial.steps() == list(range(ddp_ranks.STEPS)) and trial.is_complete()
    assert not trial.problems
    for rank, worker in enumerate(workers):
        assert (Path(out) / f"events/000000000003/000000000003_{worker}.tfevents").is_file()  # per-rank files
        for step in range(ddp_ranks.STEPS):
            np.testing.assert_array_equal(trial.tensor("rank_input").value(step, worker=worker), seen[rank]["inputs"][step].numpy())
            np.testing.assert_array_equal(trial.tensor("gradient/0.weight").value(step, worker=worker), seen[rank]["grads"][step].numpy())
    # Each rank's own data, and DDP's averaged gradients: the same on every rank.
    assert not np.array_equal(trial.tensor("rank_input").value(0, worker="worker_0"), trial.tensor("rank_input").value(0, worker=workers[-1]))
    np.testing.assert_array_equal(trial.tensor("gradient/0.weight").value(5, worker="worker_0"), trial.tensor("gradient/0.weight").value(5, worker=workers[-1]))

    # The step timeline holds every rank; the straggler's own phase (data: before the
    # forward pass) is the long one, while the others wait inside backward's all-reduce.
    timeline = trial.profiler.step_timeline()
    assert sorted(timeline["rank"].unique()) == list(range(world_size))
    straggler = world_size - 1
    for step in ddp_ranks.STRAGGLER_STEPS:
        at = timeline[(timeline["step"] == step) & (timeline["phase"] == "data")]
        slowest = at.sort_values("duration_ms").iloc[-1]
        assert int(slowest["rank"]) == straggler and slowest["duration_ms"] >= ddp_ranks.STRAGGLER_SLEEP_S * 1000 * 0.9, at
    (report,) = run_profiler_rules(trial.profiler, [StepOutlier(stddev=2, n_outliers=0)])
    groups = report.statistics["groups"]  # one group per rank: the rule sees per-rank data
    assert {g.split("/")[1] for g in groups} == {f"rank{r}" for r in range(world_size)}, report
