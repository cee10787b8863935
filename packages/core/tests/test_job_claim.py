"""One writer per worker of a job folder (job_claim.py): a second live hook is refused, a
second training after one that closed or died is recorded and reported as a mixed job."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys

import numpy as np
import pytest

from stepscope import ModeKeys, create_trial
from stepscope.capture.hook import HookBase
from stepscope.capture.job_claim import lock_key
from stepscope.cli import main as cli_main
from stepscope.config import ProfilerConfig, SaveConfig
from stepscope.exceptions import ConfigError


class BareHook(HookBase):
    framework = "test"
    builtin_regexes = {"losses": ["loss"]}


def make(out_dir, **kwargs):
    kwargs.setdefault("profiler_config", ProfilerConfig.disabled())
    kwargs.setdefault("save_config", SaveConfig(save_interval=1))
    return BareHook(str(out_dir), **kwargs)


def train(hook, steps: int, scale: float) -> None:
    for i in range(steps):
        hook.begin_step(ModeKeys.TRAIN)
        hook.save_loss(np.float32(scale * (steps - i)))
        hook.end_step()


def test_a_second_live_hook_on_the_same_folder_is_refused_naming_the_holder(tmp_path):
    first = make(tmp_path)
    with pytest.raises(ConfigError) as refused:
        make(tmp_path)
    message = str(refused.value)
    assert str(tmp_path) in message and f"pid {os.getpid()}" in message and "worker_0" in message
    assert "register_module(model, name=...)" in message
    train(first, 3, 1.0)  # the first hook is unaffected
    first.close()
    assert create_trial(str(tmp_path)).tensor("loss").values(mode=ModeKeys.TRAIN) == {0: 3.0, 1: 2.0, 2: 1.0}
    assert create_trial(str(tmp_path)).failed_workers() == {}  # one training: nothing wrong
    # Other workers of the same job are other writers.
    make(tmp_path / "ranks", rank=0, world_size=2, include_workers="all").close()
    make(tmp_path / "ranks", rank=1, world_size=2, include_workers="all").close()


def test_a_second_training_after_the_first_closed_is_reported_as_mixed(tmp_path, caplog, capsys):
    first = make(tmp_path)
    train(first, 4, 1.0)
    first.close()
    with caplog.at_level(logging.WARNING, logger="stepscope"):
        second = make(tmp_path)
    assert any("earlier training" in r.getMessage() and str(tmp_path) in r.getMessage() for r in caplog.records)
    train(second, 2, 10.0)
    second.close()

    status = create_trial(str(tmp_path)).status()
    assert status["worker_0"]["state"] == "mixed"
    assert len(status["worker_0"]["runs"]) == 2
    assert len({run["run_id"] for run in status["worker_0"]["runs"]}) == 2
    assert cli_main(["check", str(tmp_path), "--quiet", "--no-write"]) == 2
    assert "2 trainings wrote into this job folder as worker_0" in capsys.readouterr().err


def test_a_claim_of_a_dead_process_is_stale_and_the_new_run_is_mixed(tmp_path):
    # A training killed before close: its process is gone, its claim still says open.
    script = (
        "import os, numpy as np\n"
        "from stepscope.capture.hook import HookBase\n"
        "from stepscope.config import ProfilerConfig, SaveConfig\n"
        "class H(HookBase):\n    framework = 'test'\n"
        f"h = H({str(tmp_path)!r}, profiler_config=ProfilerConfig.disabled(), save_config=SaveConfig(save_interval=1))\n"
        "h.begin_step('train'); h.save_tensor('x', np.ones(2)); h.flush()\n"
        "os._exit(0)\n"
    )
    subprocess.run([sys.executable, "-c", script], check=True, timeout=120, env={**os.environ})
    runs = json.loads((tmp_path / lock_key("worker_0")).read_text())["runs"]
    assert runs[0]["closed"] is None and runs[0]["pid"] != os.getpid()
    hook = make(tmp_path)  # not refused: the holder is dead
    hook.close()
    runs = create_trial(str(tmp_path)).status()["worker_0"]["runs"]
    assert "never" in runs[0]["closed"] and isinstance(runs[1]["closed"], float)


def test_a_live_hook_in_another_process_is_refused(tmp_path):
    script = (
        "import sys, time\n"
        "from stepscope.capture.hook import HookBase\n"
        "from stepscope.config import ProfilerConfig\n"
        "class H(HookBase):\n    framework = 'test'\n"
        f"h = H({str(tmp_path)!r}, profiler_config=ProfilerConfig.disabled())\n"
        "print('ready', flush=True); sys.stdin.readline(); h.close()\n"
    )
    holder = subprocess.Popen([sys.executable, "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "ready"
        with pytest.raises(ConfigError, match=f"pid {holder.pid}"):
            make(tmp_path)
    finally:
        holder.communicate("\n", timeout=120)
    make(tmp_path).close()  # free once it closed (then a second training: mixed)
    assert create_trial(str(tmp_path)).status()["worker_0"]["state"] == "mixed"


def test_a_resumed_run_continues_the_job_and_is_not_mixed(tmp_path):
    first = make(tmp_path)
    train(first, 3, 1.0)
    state = first.state_dict()
    first.close()
    second = make(tmp_path)
    second.load_state_dict(state)
    train(second, 2, 10.0)
    second.close()
    trial = create_trial(str(tmp_path))
    assert trial.failed_workers() == {}
    assert trial.steps(mode=ModeKeys.TRAIN) == [0, 1, 2, 3, 4]
