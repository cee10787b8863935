"""The black box on real CPU training with the torch hook: a real allocation failure (the
CPU allocator refusing an impossible tensor) inside step 4 writes the record (reason oom,
the step, the exception, host memory) before the exception propagates unchanged, and the
hook's close publishes the steps' timeline up to the failing step; a StopTrainingRequested
is recorded as a stop; the writes are bounded in time and size."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time

import pytest
import torch

from stepscope.capture.blackbox import BLACKBOX_DIR, BlackBoxConfig, write_black_box
from stepscope.config import ProfilerConfig
from stepscope.exceptions import ConfigError
from stepscope.layout import STOP_KEY
from stepscope.profiler.reader import ProfilerTrial
from stepscope.store import open_store
from stepscope_torch import Hook, StopTrainingRequested
from stepscope_torch.blackbox import black_box, failure_reason

pytestmark = pytest.mark.heavy


def _train(out_dir: str, fail_at: int, error: BaseException | None = None) -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    hook = Hook(out_dir, profiler_config=ProfilerConfig(system_monitor=False, step_timeline=True))
    hook.register_module(model)
    hook.register_optimizer(optimizer)
    with black_box(hook):
        for step in range(8):
            loss = model(torch.randn(8, 16)).pow(2).mean()
            if step == fail_at:
                if error is not None:
                    raise error
                torch.empty(1 << 50, dtype=torch.uint8)  # the CPU allocator refuses: a real OOM
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()


def test_an_oom_writes_the_black_box_and_propagates(tmp_path):
    with pytest.raises(RuntimeError, match="can't allocate memory"):
        _train(str(tmp_path), fail_at=4)
    (record_file,) = tmp_path.glob(f"{BLACKBOX_DIR}/*/record.json")
    record = json.loads(record_file.read_text())
    assert record["reason"] == "oom" and record["exception"] == "RuntimeError"
    assert record["step"] == 4 and record["mode"] == "TRAIN" and record["rank"] == 0
    assert record["host_memory"]["rss_bytes"] > 10 << 20  # torch alone holds more
    assert any("torch.empty" in line for line in record["traceback"])
    assert record["devices"] == [] and record["attachments"] == []  # no CUDA on this machine
    # The hook was closed on the way out: the timeline holds the steps up to the failing one.
    steps = ProfilerTrial(str(tmp_path)).step_timeline()
    assert sorted(set(steps[steps["phase"] == "step"]["step"])) == [0, 1, 2, 3, 4]


def test_a_stop_is_recorded_as_a_stop(tmp_path):
    with pytest.raises(StopTrainingRequested):
        _train(str(tmp_path), fail_at=2, error=StopTrainingRequested("stop requested by rule LossNotDecreasing"))
    (record_file,) = tmp_path.glob(f"{BLACKBOX_DIR}/*/record.json")
    record = json.loads(record_file.read_text())
    assert record["reason"] == "stop" and record["step"] == 2 and "LossNotDecreasing" in record["message"]


def test_reasons():
    assert failure_reason(torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")) == "oom"
    assert failure_reason(ValueError("x")) == "exception"


class _SlowStore:
    """A store whose writes take longer than the black box may wait (a stalled S3, say)."""

    def __init__(self, inner, delay_s: float):
        self.inner, self.delay_s = inner, delay_s

    def write(self, key, data):
        time.sleep(self.delay_s)
        self.inner.write(key, data)


def test_the_black_box_is_bounded_in_time_and_size(tmp_path):
    store = open_store(str(tmp_path))
    started = time.monotonic()
    keys = write_black_box(_SlowStore(store, 3.0), "worker_0", {"reason": "oom"}, {}, BlackBoxConfig(budget_s=0.5))
    assert time.monotonic() - started < 2.0 and keys == []  # the failing thread did not wait for the store
    keys = write_black_box(store, "worker_1", {"reason": "oom"}, {"big.bin": b"x" * 2048, "small.txt": b"ok"}, BlackBoxConfig(max_bytes=1024))
    record = json.loads((tmp_path / BLACKBOX_DIR / "worker_1" / "record.json").read_text())
    assert record["attachments"] == ["small.txt"] and "max_bytes" in record["left_out"]["big.bin"]
    assert sorted(k.rsplit("/", 1)[1] for k in keys) == ["record.json", "small.txt"]
    with pytest.raises(ConfigError, match="budget_s"):
        BlackBoxConfig(budget_s=0)


_WORKER = textwrap.dedent(
    """
    import os, sys, time, torch
    from stepscope.config import ProfilerConfig
    from stepscope.layout import STOP_KEY
    from stepscope_torch import Hook, black_box
    fail_at = int(sys.argv[2])
    if os.environ["RANK"] == "0":  # a slow start: this rank's hook begins after its peer failed
        deadline = time.monotonic() + 120
        while not os.path.exists(os.path.join(sys.argv[1], STOP_KEY)) and time.monotonic() < deadline:
            time.sleep(0.05)
    model = torch.nn.Linear(16, 4)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    hook = Hook(sys.argv[1], profiler_config=ProfilerConfig(system_monitor=False))
    hook.register_module(model)
    hook.register_optimizer(optimizer)
    # No rendezvous before training: rank 0's hook starts after rank 1 failed and still takes
    # rank 1's stop (written after this process started: control._written_by_this_run).
    try:
        with black_box(hook):
            for step in range(400):
                optimizer.zero_grad()
                model(torch.randn(8, 16)).sum().backward()
                optimizer.step()
                if step == fail_at:
                    torch.empty(1 << 50, dtype=torch.uint8)  # the CPU allocator refuses
                time.sleep(0.05)
    except Exception as exc:
        print(type(exc).__name__, flush=True)
        sys.exit(3)
    """
)


def test_the_other_workers_learn_of_a_failure_and_stop_with_their_own_black_box(tmp_path):
    script = tmp_path / "worker.py"
    script.write_text(_WORKER)
    job = tmp_path / "job"
    env = {**os.environ, "WORLD_SIZE": "2", "STEPSCOPE_STOP_POLL_S": "0.2", "PYTHONWARNINGS": "ignore"}
    workers = [
        subprocess.Popen([sys.executable, str(script), str(job), str(fail_at)], env={**env, "RANK": str(rank)}, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        for rank, fail_at in ((0, 10_000), (1, 3))  # rank 0 would run 400 steps; rank 1 fails at step 3
    ]
    outputs = [w.communicate(timeout=240)[0].strip() for w in workers]
    assert [w.returncode for w in workers] == [3, 3]
    assert outputs == ["StopTrainingRequested", "RuntimeError"]
    records = {path.parent.name: json.loads(path.read_text()) for path in job.glob(f"{BLACKBOX_DIR}/*/record.json")}
    assert len(records) == 2
    failed = next(r for r in records.values() if r["rank"] == 1)
    stopped = next(r for r in records.values() if r["rank"] == 0)
    assert failed["reason"] == "oom" and failed["step"] == 3
    assert stopped["reason"] == "stop" and failed["worker"] in stopped["message"] and "oom" in stopped["message"]
    assert stopped["step"] < 300  # it stopped long before its 400 steps


def test_lightning_writes_the_black_box_when_fit_fails(tmp_path):
    pl = pytest.importorskip("lightning.pytorch")
    from stepscope_torch import StepscopeCallback

    class Failing(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = torch.nn.Linear(6, 3)

        def training_step(self, batch, batch_idx):
            if batch_idx == 3:
                torch.empty(1 << 50, dtype=torch.uint8)  # the CPU allocator refuses
            return torch.nn.functional.cross_entropy(self.net(batch[0]), batch[1])

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    data = torch.utils.data.TensorDataset(torch.randn(40, 6), torch.randint(0, 3, (40,)))
    trainer = pl.Trainer(accelerator="cpu", devices=1, max_epochs=1, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, callbacks=[StepscopeCallback(str(tmp_path), profiler_config=ProfilerConfig.disabled())])
    with pytest.raises(RuntimeError, match="can't allocate memory"):
        trainer.fit(Failing(), torch.utils.data.DataLoader(data, batch_size=4))
    (record_file,) = tmp_path.glob(f"{BLACKBOX_DIR}/*/record.json")
    record = json.loads(record_file.read_text())
    assert record["reason"] == "oom" and record["step"] == 3 and record["mode"] == "TRAIN"
    assert json.loads((tmp_path / STOP_KEY).read_text())["rule"] == "BlackBox"  # the other workers are told
