"""A stop request during a DDP job (2 ranks, gloo, CPU): the ranks agree on the step, so
every rank stops at the same TRAIN step and no rank is left waiting in an all-reduce, even
when only one rank ever sees the request."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

import stepscope
from stepscope.capture.control import request_stop
from stepscope.store import open_store

pytestmark = pytest.mark.heavy

RANKS = 2
AGREE_EVERY = 8  # STEPSCOPE_STOP_AGREE_STEPS unset: the documented default


def _wait_for_steps(job: Path, at_least: int, deadline: float) -> None:
    """Until every rank published `at_least` steps (read as a rule process would)."""
    while time.monotonic() < deadline:
        if (job / "index").exists():
            try:
                if len(stepscope.create_trial(str(job)).steps()) >= at_least:
                    return
            except Exception:  # a job still starting up
                pass
        time.sleep(0.05)
    raise AssertionError("the DDP job did not start")


@pytest.mark.timeout(300)
def test_a_stop_request_stops_every_ddp_rank_at_the_same_step(tmp_path):
    job = tmp_path / "job"
    env = {k: v for k, v in os.environ.items() if k not in ("STEPSCOPE_STOP_AGREE_STEPS", "STEPSCOPE_DISABLE")}
    script = str(Path(__file__).parent / "ddp_until_stopped.py")
    # Rank 0 looks for the request every 20 ms, rank 1 never (1000 s): without agreement
    # rank 0 would stop alone and rank 1 would wait forever in its next gradient all-reduce.
    polls = ["0.02", "1000"]
    ranks = [
        subprocess.Popen([sys.executable, script, str(job), str(r), str(RANKS), str(tmp_path / "init"), polls[r]], env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for r in range(RANKS)
    ]
    try:
        _wait_for_steps(job, 5, time.monotonic() + 120)
        request_stop(open_store(str(job)), rule="ExplodingTensor", reason="nan in signal")  # what StopTraining does
        outputs = [rank.communicate(timeout=60) for rank in ranks]  # no hang: both exit
    finally:
        for rank in ranks:
            if rank.poll() is None:
                rank.kill()
    stopped = []
    for rank, (out, err) in zip(range(RANKS), outputs, strict=True):
        assert ranks[rank].returncode == 0, (rank, err[-2000:])
        last = out.strip().splitlines()[-1]
        assert last.startswith("stopped at") and last.endswith("agreed True"), (rank, out[-500:], err[-2000:])
        stopped.append(int(last.split()[2]))
    assert stopped[0] == stopped[1] < 3000, stopped
    # The stop falls on an agreement step: the (step + 1)-th TRAIN step, a multiple of 8.
    assert (stopped[0] + 1) % AGREE_EVERY == 0, stopped
    # Both ranks saved the same steps, up to and including the one they stopped in.
    trial = stepscope.create_trial(str(job))
    values = trial.tensor("rank_input")
    last_saved = {w: max(s for s in values.steps(show_incomplete=True) if w in values.workers(s)) for w in ("worker_0", "worker_1")}
    assert last_saved["worker_0"] == last_saved["worker_1"] == stopped[0], last_saved
    assert trial.steps() == list(range(stopped[0] + 1))
    # Every rank wrote its black box at that step (the script catches the stop: no wrapper).
    for rank in range(RANKS):
        record = json.loads((job / "stepscope-blackbox" / f"worker_{rank}" / "record.json").read_text())
        assert record["reason"] == "stop" and record["rank"] == rank and record["step"] == stopped[rank], record


@pytest.mark.timeout(300)
def test_lightning_ddp_ranks_stop_at_the_same_step(tmp_path):
    pytest.importorskip("lightning")
    env = {k: v for k, v in os.environ.items() if k not in ("STEPSCOPE_STOP_AGREE_STEPS", "STEPSCOPE_DISABLE")}
    env["STEPSCOPE_STOP_POLL_S"] = "1000"  # only rank 0 sees the request (the script makes it look)
    script = str(Path(__file__).parent / "lightning_ddp_stop.py")
    done = subprocess.run([sys.executable, script, str(tmp_path / "job"), str(tmp_path / "stopped")], env=env,
                          capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr[-3000:]
    stopped = [int((tmp_path / f"stopped.{rank}").read_text()) for rank in range(2)]
    # 50 batches per rank without a stop; the agreement step after rank 0 saw it (batch 3): 8.
    assert stopped == [AGREE_EVERY, AGREE_EVERY], stopped
    records = [json.loads((tmp_path / "job" / "stepscope-blackbox" / f"worker_{rank}" / "record.json").read_text()) for rank in range(2)]
    assert [(r["reason"], r["rank"]) for r in records] == [("stop", 0), ("stop", 1)]
    assert records[0]["step"] == records[1]["step"]  # the step they agreed on
