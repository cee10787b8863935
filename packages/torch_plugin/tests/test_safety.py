"""Never break training: the opt-out switch, a store that goes away mid-run, a failure
inside the hook. Training results must equal those of a run without stepscope."""

from __future__ import annotations

import json
import shutil

import torch
from torch import nn

from stepscope.config import ReductionConfig, SaveConfig


def run(model, data, hook=None, on_step=None):
    """SGD with momentum over `data`; returns the final parameters."""
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()
    if hook is not None:
        hook.register_module(model)
        hook.register_loss(loss_fn)
        hook.register_optimizer(optimizer)
    for step, (x, y) in enumerate(data):
        if on_step is not None:
            on_step(step)
        optimizer.zero_grad()
        loss_fn(model(x), y).backward()
        optimizer.step()
    return {n: p.detach().clone() for n, p in model.named_parameters()}


def assert_same(a, b):
    assert a.keys() == b.keys()
    for name in a:
        assert torch.equal(a[name], b[name]), name


def test_disable_env_makes_every_entry_point_a_no_op(monkeypatch, make_hook, mlp, batches, tmp_path):
    expected = run(mlp(), batches(6))
    monkeypatch.setenv("STEPSCOPE_DISABLE", "1")
    hook = make_hook(save_all=True, save_config=SaveConfig(save_interval=1))
    model = mlp()
    result = run(model, batches(6), hook)
    hook.save_scalar("x", 1.0)
    hook.set_mode("eval")
    hook.close()
    assert_same(result, expected)
    assert not model._forward_hooks and not model._forward_pre_hooks
    assert not (tmp_path / "job").exists()


def test_store_gone_mid_run_leaves_training_unchanged(make_hook, mlp, batches, tmp_path, caplog):
    expected = run(mlp(), batches(8))
    out = tmp_path / "job"
    hook = make_hook(save_all=True, save_config=SaveConfig(save_interval=1), reduction_config=ReductionConfig(reductions=("mean",), save_raw_tensor=True))

    def break_store(step):
        if step == 3:
            hook.writer.flush()
            # The folder is replaced by a file: every later write fails, for root too.
            shutil.rmtree(out)
            out.write_text("not a folder any more")

    result = run(mlp(), batches(8), hook, on_step=break_store)
    hook.close()
    assert_same(result, expected)
    assert not hook.enabled
    assert "disabled for the rest of this run" in caplog.text


def test_exception_inside_the_hook_is_caught_recorded_and_disables_it(make_hook, mlp, batches, tmp_path, monkeypatch, caplog):
    expected = run(mlp(), batches(5))
    hook = make_hook(include_collections=["weights", "gradients"], save_config=SaveConfig(save_interval=1))
    calls = []

    def broken(*args):
        calls.append(args)
        raise RuntimeError("injected failure")

    monkeypatch.setattr(hook._transfer, "capture", broken)
    monkeypatch.setattr(hook._transfer, "capture_many", broken)  # (a step's parameters are copied in one batch)
    result = run(mlp(), batches(5), hook)
    hook.close()
    assert_same(result, expected)
    assert len(calls) == 1, "after the first failure the hook does nothing"
    status = json.loads((tmp_path / "job" / "stepscope-status" / "worker_0.json").read_text())
    assert status["state"] == "failed" and "injected failure" in status["error"] and "Traceback" in status["traceback"]
    assert caplog.text.count("injected failure") >= 1
