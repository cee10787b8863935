"""The black box a hook installs by itself, with real torch training: an exception leaving a
plain loop (a `torch.cuda.OutOfMemoryError`, a generic error) writes the record through
the excepthook and still propagates (traceback printed, exit status 1, the user's own
excepthook still called); a rule's stop writes one even when the loop catches the stop; the
first NaN among the saved tensors writes one and asks the peers for theirs; on-demand
memory snapshots through the job's control channel, with the CUDA allocator faked at
`torch.cuda.memory._snapshot` only, and the clear answer of a CPU-only torch."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import threading
import time

import pytest
import torch

from stepscope.capture.control import BLACK_BOX, MEMORY_SNAPSHOT, read_responses, request_stop, send_request
from stepscope.cli import main as cli_main
from stepscope.config import ProfilerConfig
from stepscope.layout import BLACKBOX_DIR, REQUEST_KEY, STOP_KEY
from stepscope.store import open_store
from stepscope.testing.snapshots import SnapshotSpec, make_snapshot
from stepscope.traces.snapshot import AllocatorSnapshot
from stepscope_torch import Hook, StopTrainingRequested
from stepscope_torch.memory import NO_CUDA

pytestmark = pytest.mark.heavy

_LOOP = textwrap.dedent(
    """
    import sys, torch
    from stepscope.config import ProfilerConfig
    from stepscope_torch import Hook

    def users_own(kind, value, tb):
        print("the user's excepthook ran", flush=True)
        sys.__excepthook__(kind, value, tb)

    sys.excepthook = users_own
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    hook = Hook(sys.argv[1], profiler_config=ProfilerConfig(system_monitor=False, step_timeline=True))
    hook.register_module(model)
    hook.register_optimizer(optimizer)
    for step in range(8):
        loss = model(torch.randn(8, 16)).pow(2).mean()
        if step == 3:
            if sys.argv[2] == "oom":
                raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB (simulated)")
            raise ValueError("a bad batch")
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    """
)


def _model_and_hook(out_dir, **options):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    hook = Hook(str(out_dir), profiler_config=ProfilerConfig(system_monitor=False), control_poll_s=0.05, **options)
    hook.register_module(model)
    hook.register_optimizer(optimizer)
    return model, optimizer, hook


def _step(model, optimizer, hook=None, poison: bool = False):
    loss = model(torch.randn(4, 8)).pow(2).mean()
    if poison:
        loss = loss * float("nan")
    if hook is not None:
        hook.save_loss(loss)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()


def _until(condition, timeout_s: float = 20.0, each=None):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if each is not None:
            each()
        if condition():
            return True
        time.sleep(0.05)
    return False


@pytest.mark.parametrize(("kind", "reason", "exception"), [("oom", "oom", "OutOfMemoryError"), ("error", "exception", "ValueError")])
def test_an_exception_leaving_a_plain_loop_writes_the_black_box_and_propagates(tmp_path, kind, reason, exception):
    script = tmp_path / "train.py"
    script.write_text(_LOOP)
    job = tmp_path / "job"
    run = subprocess.run([sys.executable, str(script), str(job), kind], capture_output=True, text=True, timeout=180,
                         env={**os.environ, "PYTHONWARNINGS": "ignore"})  # fmt: skip
    assert run.returncode == 1  # the interpreter's own exit status for an uncaught exception
    assert f"{exception}: " in run.stderr and "Traceback" in run.stderr  # printed, not swallowed
    assert "the user's excepthook ran" in run.stdout  # chained, not replaced
    record = json.loads((job / BLACKBOX_DIR / "worker_0" / "record.json").read_text())
    assert record["reason"] == reason and record["exception"] == exception
    assert record["step"] == 3 and record["mode"] == "TRAIN"
    assert any("train.py" in line for line in record["traceback"])
    stop = json.loads((job / STOP_KEY).read_text())  # the other workers are told
    assert stop["rule"] == "BlackBox" and stop["failure"] == reason and stop["step"] == 3


def test_an_exception_ending_a_training_thread_writes_the_black_box(tmp_path):
    seen = []
    previous = threading.excepthook
    mine = threading.excepthook = lambda args: seen.append(args.exc_type)  # a handler already there: chained
    try:
        model, optimizer, hook = _model_and_hook(tmp_path)

        def train():
            for step in range(6):
                _step(model, optimizer)
                if step == 2:
                    model(torch.randn(4, 8))  # step 3 opens
                    raise torch.cuda.OutOfMemoryError("CUDA out of memory (simulated, in a thread)")

        for when in ("before", "after"):  # a helper thread's own error: not training's (no box, no stop)
            if when == "after":
                worker = threading.Thread(target=train)
                worker.start()
                worker.join(60)
            helper = threading.Thread(target=lambda: int("a helper thread's own error"))  # (may reuse the dead one's ident)
            helper.start()
            helper.join(10)
            assert when == "after" or not (tmp_path / BLACKBOX_DIR).exists()
        box = hook._black_box
        hook.close()
        from stepscope_torch.blackbox import _Excepthooks

        assert box not in _Excepthooks.boxes  # closed: out of the excepthooks
        assert threading.excepthook is mine or _Excepthooks.boxes  # the handler it found is back once no hook is live
    finally:
        threading.excepthook = previous
    assert seen == [ValueError, torch.cuda.OutOfMemoryError, ValueError]
    record = json.loads((tmp_path / BLACKBOX_DIR / "worker_0" / "record.json").read_text())
    assert record["reason"] == "oom" and record["step"] == 3  # the training thread's, not the helper's
    assert json.loads((tmp_path / STOP_KEY).read_text())["failure"] == "oom"


def test_a_rules_stop_writes_the_black_box_even_when_the_loop_catches_it(tmp_path):
    model, optimizer, hook = _model_and_hook(tmp_path)
    stopped_at = None
    try:
        for step in range(400):
            if step == 2:
                request_stop(hook.store, "LossNotDecreasing", "the loss stalled")
            _step(model, optimizer)
            time.sleep(0.02)
    except StopTrainingRequested:
        stopped_at = step
    finally:
        hook.close()
    assert stopped_at is not None and stopped_at < 300
    record = json.loads((tmp_path / BLACKBOX_DIR / "worker_0" / "record.json").read_text())
    assert record["reason"] == "stop" and record["step"] == stopped_at and "LossNotDecreasing" in record["message"]
    assert json.loads((tmp_path / STOP_KEY).read_text())["rule"] == "LossNotDecreasing"  # a stop asks no one else


def test_the_first_nan_saved_writes_a_black_box_and_asks_the_peers_for_theirs(tmp_path):
    model, optimizer, hook = _model_and_hook(tmp_path, rank=0, world_size=2)
    peer_model, peer_optimizer, peer = _model_and_hook(tmp_path, rank=1, world_size=2)
    nan_record = tmp_path / BLACKBOX_DIR / "worker_0" / "nan" / "record.json"
    try:
        for step in range(6):
            _step(model, optimizer, hook, poison=step >= 3)
        hook.flush()
        assert _until(nan_record.exists)
        record = json.loads(nan_record.read_text())
        assert record["reason"] == "nan" and record["non_finite"]["step"] == 3  # the first one only
        assert record["non_finite"]["tensors"]["loss"] == {"nan": 1, "inf": 0, "size": 1}
        assert record["last_saved"]["step"] >= 3 and "loss" in record["last_saved"]["tensors"]
        # The same thread asks the peers after writing the record: wait for that too (CI
        # once read the request a moment before it was written).
        assert _until((tmp_path / REQUEST_KEY).exists)
        request = json.loads((tmp_path / REQUEST_KEY).read_text())
        assert request["action"] == BLACK_BOX and "worker_0" in request["reason"]
        # The peer honours it at one of its next TRAIN step ends, training on.
        peer_dir = tmp_path / BLACKBOX_DIR / "worker_1" / f"request-{request['id']}"
        assert _until(lambda: (peer_dir / "record.json").exists(), each=lambda: _step(peer_model, peer_optimizer))
        peer_record = json.loads((peer_dir / "record.json").read_text())
        assert peer_record["reason"] == "request" and peer_record["rank"] == 1
        (answer,) = read_responses(hook.store, request["id"])
        assert answer["worker"] == "worker_1" and answer["written"][-1].endswith("record.json")
    finally:
        hook.close()
        peer.close()
    assert not (tmp_path / BLACKBOX_DIR / "worker_0" / "record.json").exists()  # training went on: no failure box


def test_an_on_demand_snapshot_from_outside_is_written_and_answered(tmp_path, monkeypatch):
    raw, truth = make_snapshot(SnapshotSpec(devices=1, steps=3, allocations_per_step=6, seed=4))
    monkeypatch.setattr(torch.cuda.memory, "_snapshot", lambda: raw)  # the fake CUDA allocator
    model, optimizer, hook = _model_and_hook(tmp_path)
    codes: list[int] = []
    asking = threading.Thread(target=lambda: codes.append(cli_main(["memory", "snapshot", str(tmp_path), "--wait", "60"])))
    try:
        asking.start()
        assert _until(lambda: not asking.is_alive(), 60, each=lambda: _step(model, optimizer))
    finally:
        hook.close()
    assert codes == [0]
    request = json.loads((tmp_path / REQUEST_KEY).read_text())
    (answer,) = read_responses(open_store(str(tmp_path)), request["id"])
    assert answer["error"] is None and answer["worker"] == "worker_0" and answer["step"] >= 1
    (key,) = answer["written"]
    assert key.startswith("profiler-output/framework/pytorch/memory/rank0/") and key.endswith("_ondemand1.pickle.gz")
    summary = AllocatorSnapshot.load(tmp_path / key).summary().iloc[0]
    assert summary["reserved"] == truth.reserved[0] and summary["allocated"] == truth.allocated[0]


def test_the_hook_api_writes_a_snapshot_and_a_cpu_only_torch_answers_clearly(tmp_path, monkeypatch, caplog):
    model, optimizer, hook = _model_and_hook(tmp_path)
    try:
        _step(model, optimizer)
        with caplog.at_level("WARNING", logger="stepscope"):
            assert hook.snapshot_memory() is None  # this machine's torch has no CUDA half
        assert "no CUDA allocator to snapshot" in caplog.text
        request_id = send_request(hook.store, MEMORY_SNAPSHOT)
        assert _until(lambda: read_responses(hook.store, request_id), each=lambda: _step(model, optimizer))
        (answer,) = read_responses(hook.store, request_id)
        assert answer["written"] == [] and answer["error"].startswith(NO_CUDA)
        raw, truth = make_snapshot(SnapshotSpec(devices=2, steps=2, seed=1))
        monkeypatch.setattr(torch.cuda.memory, "_snapshot", lambda: raw)
        key = hook.snapshot_memory()
        assert key is not None and key.endswith("_ondemand1.pickle.gz")
        assert AllocatorSnapshot.load(tmp_path / key).summary()["reserved"].tolist() == [truth.reserved[0], truth.reserved[1]]
        _step(model, optimizer)  # training goes on
    finally:
        hook.close()


def test_handlers_that_call_each_other_do_not_loop(tmp_path, capsys):
    import sys as system

    from stepscope_torch.blackbox import _Excepthooks

    previous = system.excepthook
    calls = []
    try:
        _, _, first = _model_and_hook(tmp_path / "a")
        ours = system.excepthook

        def theirs(kind, value, tb):  # installed after ours, calling ours in turn
            calls.append("theirs")
            ours(kind, value, tb)

        system.excepthook = theirs
        _, _, second = _model_and_hook(tmp_path / "b")  # puts ours on top of theirs
        assert system.excepthook is _Excepthooks.sys_hook
        try:
            raise ValueError("boom")
        except ValueError as exc:
            system.excepthook(ValueError, exc, exc.__traceback__)
        first.close()
        second.close()
    finally:
        system.excepthook = previous
    assert calls == ["theirs"]  # once: no endless round
    assert capsys.readouterr().err.count("ValueError: boom") == 1


def test_the_blackbox_command_prints_each_workers_record(tmp_path, capsys):
    model, optimizer, hook = _model_and_hook(tmp_path)
    try:
        for step in range(3):
            _step(model, optimizer, hook, poison=step == 2)
        hook.flush()
        assert _until((tmp_path / BLACKBOX_DIR / "worker_0" / "nan" / "record.json").exists)
        model(torch.randn(4, 8))
        hook._black_box.record(torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB (simulated)"))
    finally:
        hook.close()
    assert cli_main(["memory", "blackbox", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "stepscope-blackbox/worker_0/nan/record.json\n  nan on worker_0 (rank 0)" in out and "non-finite loss: {'nan': 1" in out
    assert "stepscope-blackbox/worker_0/record.json\n  oom on worker_0 (rank 0) at TRAIN step 3" in out
    assert "OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB (simulated)" in out and "host RSS" in out
