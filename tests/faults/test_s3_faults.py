"""Writing and reading a job on S3 through a proxy that injects faults: dropped connections,
500/503/SlowDown, truncated bodies, stalls, `100 Continue` then close. Writes and reads
retry; nothing listed is lost or duplicated; close() ends within its bound and the status
file names what was lost."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

from stepscope import create_trial
from stepscope.capture.writer import Writer
from stepscope.modes import ModeKeys
from stepscope.store.s3 import S3Store

STEPS = 12


def _value(step: int, name: str) -> np.ndarray:
    return (np.arange(300, dtype=np.float32) * (step + 1) + len(name)).reshape(10, 30)


def _write_job(url: str, close_timeout_s: float = 60.0) -> Writer:
    writer = Writer(S3Store(url), close_timeout_s=close_timeout_s)
    for step in range(STEPS):
        writer.write_step(step, ModeKeys.TRAIN, step, {f"t{i}": _value(step, f"t{i}") for i in range(3)})
    return writer


def _check_job(url: str, steps=range(STEPS)) -> None:
    trial = create_trial(S3Store(url))
    assert trial.steps() == list(steps)
    assert not trial.problems
    for step in steps:
        for i in range(3):
            np.testing.assert_array_equal(trial.tensor(f"t{i}").value(step), _value(step, f"t{i}"))


@pytest.mark.heavy
@pytest.mark.timeout(240)
def test_writes_and_reads_retry_through_a_faulty_endpoint(s3_url, via_proxy):
    via_proxy.rates = {"drop": 0.03, "drop_after": 0.03, "500": 0.03, "503": 0.03, "slowdown": 0.02, "truncate": 0.06}
    writer = _write_job(s3_url)
    assert writer.close() is True and not writer.failed
    _check_job(s3_url)
    injected = dict(via_proxy.injected)
    assert sum(injected.values()) >= 3, injected  # the faults happened, and were absorbed
    keys = [k for k in S3Store(s3_url).list("index/")]
    assert len(keys) == len(set(keys)) == STEPS  # nothing duplicated


@pytest.mark.timeout(120)
def test_truncated_and_dropped_reads_are_retried_not_reported_corrupt(s3_url, via_proxy):
    writer = _write_job(s3_url)
    assert writer.close()
    via_proxy.rates = {"truncate": 0.3, "drop": 0.05}
    _check_job(s3_url)
    assert via_proxy.injected["truncate"] >= 3, dict(via_proxy.injected)


@pytest.mark.timeout(120)
def test_close_is_bounded_when_uploads_stall_and_the_status_names_the_lost_steps(s3_url, via_proxy, caplog):
    # Event files stall (an endpoint that accepts and never answers); small objects pass.
    via_proxy.choose = lambda method, path: "stall" if method == "PUT" and "/events/" in path and "000000000004" <= path.rsplit("/", 1)[-1][:12] else None
    writer = _write_job(s3_url, close_timeout_s=4.0)
    started = time.monotonic()
    assert writer.close() is False
    assert time.monotonic() - started < 4.5
    via_proxy.choose = None
    status = json.loads(S3Store(s3_url).read("stepscope-status/worker_0.json"))
    assert status["state"] == "incomplete" and status["lost_steps"][0] == 4 and status["lost_steps"][-1] == STEPS - 1
    trial = create_trial(S3Store(s3_url))
    assert trial.steps(show_incomplete=True) == [0, 1, 2, 3]  # what is listed is whole
    for step in range(4):
        np.testing.assert_array_equal(trial.tensor("t0").value(step), _value(step, "t0"))


_CHILD = textwrap.dedent(
    """
    import sys, time, numpy as np
    from stepscope.modes import ModeKeys
    from stepscope.capture.writer import Writer
    writer = Writer(sys.argv[1], close_timeout_s=float(sys.argv[2]))
    for step in range(5):
        writer.write_step(step, ModeKeys.TRAIN, step, {"w": np.ones((512, 1024), np.float32) * step})
    print("handed over", flush=True)
    # no close(): the process exits, and the writer's exit hook must end within its bound
    """
)


@pytest.mark.heavy
@pytest.mark.timeout(120)
@pytest.mark.parametrize("fault", ["continue_close", "stall"])
def test_a_process_ends_when_its_endpoint_misbehaves(s3_url, via_proxy, fault):
    """`100 Continue` then close (botocore looped forever on it) and a stall (held close()
    for ~10 minutes): the training process still exits within the close bound."""
    via_proxy.choose = lambda method, path: fault if method == "PUT" else None
    env = dict(os.environ, STEPSCOPE_S3_MAX_ATTEMPTS="3")
    started = time.monotonic()
    child = subprocess.run([sys.executable, "-c", _CHILD, s3_url, "5"], env=env, capture_output=True, text=True, timeout=90)
    elapsed = time.monotonic() - started
    assert "handed over" in child.stdout, child.stderr
    assert elapsed < 30, (elapsed, child.stderr[-2000:])
    assert child.returncode == 0, child.stderr[-2000:]
    assert "stepscope" in child.stderr  # the loss was said out loud (failure or lost steps)
