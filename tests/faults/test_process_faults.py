"""Faults of the training process and its disk: `kill -9` at random points (local and S3),
a full disk (a size-limited tmpfs; needs root), permission denied (root without
CAP_DAC_OVERRIDE, through setpriv). Training results stay identical, every listed step
reads back exactly, one loud error and a status file say what happened."""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

from stepscope import create_trial
from stepscope.capture.writer import Writer
from stepscope.modes import ModeKeys

_TRAIN = textwrap.dedent(
    """
    import sys, numpy as np
    from stepscope.modes import ModeKeys
    from stepscope.capture.writer import Writer

    def value(step, i):
        return np.random.default_rng(step * 10 + i).standard_normal((64, 64)).astype(np.float32)

    writer = Writer(sys.argv[1]) if sys.argv[1] != "-" else None
    steps = int(sys.argv[2])
    w = np.zeros(8)
    for step in range(steps):
        w = w - 0.1 * (w - np.arange(8))  # the "training"
        if writer is not None:
            writer.write_step(step, ModeKeys.TRAIN, step, {f"t{i}": value(step, i) for i in range(4)} | {"w": w.copy()})
        if step == 2:
            print("training", flush=True)
    if writer is not None:
        writer.close()
    print("result", " ".join(f"{x:.17g}" for x in w), flush=True)
    """
)


def _value(step: int, i: int) -> np.ndarray:
    return np.random.default_rng(step * 10 + i).standard_normal((64, 64)).astype(np.float32)


def _train(out: str, steps: int, env: dict | None = None, prefix: list[str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([*(prefix or []), sys.executable, "-c", _TRAIN, out, str(steps)], env=env, capture_output=True, text=True, timeout=120)


def _assert_listed_steps_exact(trial) -> list[int]:
    steps = trial.steps(show_incomplete=True)
    for step in steps:
        for i in range(4):
            np.testing.assert_array_equal(trial.tensor(f"t{i}").value(step), _value(step, i))
    return steps


def _kill_at_random_points(out: str, seed: int, tries: int) -> None:
    rng = random.Random(seed)
    for attempt in range(tries):
        child = subprocess.Popen([sys.executable, "-c", _TRAIN, out, "100000"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        assert child.stdout.readline().strip() == "training"
        time.sleep(rng.uniform(0.0, 0.6))
        child.send_signal(signal.SIGKILL)
        child.wait(10)
        child.stdout.close()
        child.stderr.close()
        trial = create_trial(out)
        steps = _assert_listed_steps_exact(trial)
        assert steps and steps == list(range(len(steps))) or attempt > 0  # a killed run publishes in order
        assert not trial.problems


@pytest.mark.heavy
@pytest.mark.timeout(120)
def test_kill_9_at_random_points_local(tmp_path):
    out = str(tmp_path / "job")
    _kill_at_random_points(out, seed=12, tries=3)
    # The next run of worker_0 in the same folder removes the killed runs' temporaries.
    with Writer(out) as writer:
        writer.write_step(10**6, ModeKeys.TRAIN, 0, {"x": np.ones(1)})
    deadline = time.monotonic() + 5
    while list(Path(out).rglob(".*.tmp")) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not list(Path(out).rglob(".*.tmp"))


@pytest.mark.heavy
@pytest.mark.timeout(120)
def test_kill_9_at_random_points_s3(s3_url):
    _kill_at_random_points(s3_url, seed=7, tries=2)


def _mount_tmpfs(path: Path, size: str) -> bool:
    if os.geteuid() != 0 or shutil.which("mount") is None:
        return False
    path.mkdir(parents=True, exist_ok=True)
    return subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], capture_output=True).returncode == 0


@pytest.mark.heavy
@pytest.mark.timeout(120)
def test_disk_full_leaves_training_identical_with_one_loud_error(tmp_path):
    disk = tmp_path / "small-disk"
    if not _mount_tmpfs(disk, "400k"):
        pytest.skip("needs root and tmpfs mounts to make a full disk")
    try:
        reference = _train("-", 40)
        full = _train(str(disk / "job"), 40)
        assert full.returncode == 0, full.stderr[-2000:]
        assert full.stdout.splitlines()[-1] == reference.stdout.splitlines()[-1]  # bit-identical results
        assert full.stderr.count("failed and is now disabled") == 1
        assert "No space left" in full.stderr
        status = json.loads((disk / "job/stepscope-status/worker_0.json").read_text())
        assert status["state"] == "failed" and "No space left" in status["error"]
        _assert_listed_steps_exact(create_trial(str(disk / "job")))
    finally:
        subprocess.run(["umount", "-l", str(disk)], capture_output=True)


@pytest.mark.heavy
@pytest.mark.timeout(120)
def test_permission_denied_leaves_training_identical_with_one_loud_error(tmp_path):
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        pytest.skip("needs root and setpriv to drop CAP_DAC_OVERRIDE")
    job = tmp_path / "job"
    (job / "events").mkdir(parents=True)
    os.chown(job / "events", 65534, 65534)  # the job exists, its events folder is not ours
    os.chmod(job / "events", 0o755)
    prefix = ["setpriv", "--bounding-set=-dac_override,-dac_read_search"]
    reference = _train("-", 20)
    denied = _train(str(job), 20, prefix=prefix)
    assert denied.returncode == 0, denied.stderr[-2000:]
    assert denied.stdout.splitlines()[-1] == reference.stdout.splitlines()[-1]
    assert denied.stderr.count("failed and is now disabled") == 1 and "Permission denied" in denied.stderr
    status = json.loads((job / "stepscope-status/worker_0.json").read_text())
    assert status["state"] == "failed" and "Permission denied" in status["error"]
