"""A rule process (`stepscope check --watch` with a stop-training action) following a running
multi-rank job: every rank ends training within about one step of the stop request."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from stepscope.cli import main as stepscope_main

pytestmark = pytest.mark.heavy

RANKS = 3
NAN_STEP = 8


@pytest.mark.timeout(300)
def test_a_rule_stops_every_rank_within_one_step(tmp_path, capsys):
    job = tmp_path / "job"
    job.mkdir()
    env = dict(os.environ, STEPSCOPE_STOP_POLL_S="0.02")
    script = str(Path(__file__).parent / "rank_until_stopped.py")
    ranks = [subprocess.Popen([sys.executable, script, str(job), str(r), str(RANKS), str(NAN_STEP)], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for r in range(RANKS)]
    config = tmp_path / "rules.json"
    config.write_text(json.dumps({"DebugRuleConfigurations": [{
        "RuleConfigurationName": "nan-stops-training",
        "RuleParameters": {"rule_to_invoke": "ExplodingTensor", "tensor_regex": "signal", "only_nan": "True"},
        "Actions": [{"name": "stoptraining"}],
    }]}))
    try:
        status = stepscope_main(["check", str(job), "--watch", "--rules-config", str(config), "--poll-interval", "0.05", "--timeout", "120", "--quiet", "--no-write"])
        outputs = [rank.communicate(timeout=60) for rank in ranks]
    finally:
        for rank in ranks:
            if rank.poll() is None:
                rank.kill()
    capsys.readouterr()
    assert status == 1  # the rule fired
    stop = json.loads((job / "stepscope-control/stop_training.json").read_text())
    assert stop["rule"] == "nan-stops-training" and stop["step"] >= NAN_STEP
    for rank, (out, err) in enumerate(outputs):
        assert "stopped" in out, (rank, out[-500:], err[-2000:])
        stopped_at = float(out.strip().splitlines()[-1].split()[-1])
        steps_times = [float(line.split()[-1]) for line in out.strip().splitlines()[:-1]]
        after_request = [t for t in steps_times if t > stop["time"]]
        # Steps completed after the request was written: at most the one in flight (plus the
        # poll interval's worth of slack, far below a step here).
        assert len(after_request) <= 1, (rank, len(after_request))
        assert stopped_at - stop["time"] < 1.0
