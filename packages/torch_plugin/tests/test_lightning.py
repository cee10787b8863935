"""StepscopeCallback in real Lightning runs: fit (with validation and gradient
accumulation), validate and test in one job; metrics; stop requests."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

import stepscope
from stepscope.capture.control import request_stop
from stepscope.config import Collection, ProfilerConfig, SaveConfig
from stepscope.exceptions import ConfigError
from stepscope.modes import ModeKeys

pl = pytest.importorskip("lightning.pytorch")


class Classifier(pl.LightningModule):
    """Records what it saw: parameters at the start of each optimizer step, gradients
    right before each optimizer step."""

    def __init__(self, accumulate: int):
        super().__init__()
        torch.manual_seed(0)
        self.net = nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 3))
        self.accumulate = accumulate
        self.seen_weights, self.seen_grads = [], []

    def forward(self, x):
        return self.net(x)

    def training_step(self, batch, batch_idx):
        loss = nn.functional.cross_entropy(self(batch[0]), batch[1])
        self.log("train_loss", loss, on_step=True)
        return loss

    def on_train_batch_start(self, batch, batch_idx):
        if batch_idx % self.accumulate == 0:
            self.seen_weights.append({n: p.detach().clone() for n, p in self.named_parameters()})

    def on_before_optimizer_step(self, optimizer):
        self.seen_grads.append({n: p.grad.detach().clone() for n, p in self.named_parameters()})

    def validation_step(self, batch, batch_idx):
        self.log("val_loss", nn.functional.cross_entropy(self(batch[0]), batch[1]))

    def test_step(self, batch, batch_idx):
        self.log("test_loss", nn.functional.cross_entropy(self(batch[0]), batch[1]))

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def loader(n, seed):
    generator = torch.Generator().manual_seed(seed)
    data = torch.utils.data.TensorDataset(torch.randn(n * 4, 6, generator=generator), torch.randint(0, 3, (n * 4,), generator=generator))
    return torch.utils.data.DataLoader(data, batch_size=4)


def trainer(callbacks, **kwargs):
    options = dict(
        accelerator="cpu", devices=1, max_epochs=2, logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=1,
    )
    return pl.Trainer(callbacks=callbacks, **{**options, **kwargs})


def callback(out_dir, **kwargs):
    from stepscope_torch import StepscopeCallback

    kwargs.setdefault("profiler_config", ProfilerConfig.disabled())
    return StepscopeCallback(out_dir, **kwargs)


@pytest.mark.heavy
def test_fit_validate_test_in_one_job(out_dir):
    metrics = Collection("metrics", save_config=SaveConfig(save_interval=1))
    cb = callback(out_dir, save_config=SaveConfig(save_interval=1), include_collections=["weights", "gradients"], collections=[metrics])
    model = Classifier(accumulate=2)
    run = trainer([cb], accumulate_grad_batches=2)
    run.fit(model, loader(4, 1), loader(2, 2))
    fit_steps = run.global_step
    run.validate(model, loader(2, 3), verbose=False)
    val_loss = float(run.callback_metrics["val_loss"])
    run.test(model, loader(3, 4), verbose=False)
    test_loss = float(run.callback_metrics["test_loss"])
    cb.close()

    trial = stepscope.create_trial(out_dir)
    assert fit_steps == 4
    assert trial.steps(mode=ModeKeys.TRAIN) == [0, 1, 2, 3]
    # 2 validations during fit (2 batches each; the sanity check is not recorded), validate, test.
    assert trial.steps(mode=ModeKeys.EVAL) == list(range(2 + 2 + 2 + 3))
    for step in range(fit_steps):
        for name, grad in model.seen_grads[step].items():
            np.testing.assert_array_equal(trial.tensor(f"gradient/{name}").value(step, mode=ModeKeys.TRAIN), grad.numpy())
        for name in ("net.0.weight", "net.2.weight"):
            weight = model.seen_weights[step][name]
            np.testing.assert_array_equal(trial.tensor(name).value(step, mode=ModeKeys.TRAIN), weight.numpy())
    assert "train_loss" in trial.tensor_names(collection="metrics")
    assert float(trial.tensor("val_loss").value(5, mode=ModeKeys.EVAL)) == pytest.approx(val_loss, rel=1e-6)
    assert float(trial.tensor("test_loss").value(8, mode=ModeKeys.EVAL)) == pytest.approx(test_loss, rel=1e-6)
    assert trial.tensor("loss_output_0").steps(mode=ModeKeys.TRAIN) == [0, 1, 2, 3]
    assert trial.is_complete()


@pytest.mark.heavy
def test_stop_request_sets_should_stop(out_dir):
    cb = callback(out_dir)

    class RequestStop(pl.Callback):
        def on_train_start(self, trainer, pl_module):
            request_stop(cb.hook.store, rule="Test", reason="stop now")
            cb.hook.stop_poller.check_now()  # the poller's thread would see it within 2 s

    run = trainer([cb, RequestStop()], max_epochs=5, num_sanity_val_steps=0)
    run.fit(Classifier(accumulate=1), loader(4, 1))
    cb.close()
    assert run.global_step == 1


def test_bad_arguments_fail_when_the_callback_is_made(tmp_path):
    from stepscope_torch import StepscopeCallback

    with pytest.raises(ConfigError, match="unknown collection"):
        StepscopeCallback(str(tmp_path / "job"), include_collections=["nope"])
    (tmp_path / "file").write_text("")
    with pytest.raises(ConfigError, match="not a directory"):
        StepscopeCallback(str(tmp_path / "file"))
    assert not (tmp_path / "job").exists()


@pytest.mark.heavy
def test_a_rule_following_the_job_stops_lightning(out_dir, monkeypatch):
    """A rule (in a thread here) follows the running job and fires on the step where a NaN
    was planted; its StopTraining action ends fit at the end of the step then in progress.
    The step after the planted one waits for the rule's verdict, so that a loaded machine
    cannot make the outcome depend on thread scheduling."""
    import threading
    import time
    from pathlib import Path

    from stepscope.capture.control import STOP_KEY
    from stepscope.rules import ExplodingTensor, StopTraining, invoke_rule

    bad_step = 12
    stop_file = Path(out_dir) / STOP_KEY

    class Planter(pl.Callback):
        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            if trainer.global_step == bad_step:
                with torch.no_grad():
                    pl_module.net[0].weight[0, 0] = float("nan")
            if trainer.global_step == bad_step + 1:
                deadline = time.monotonic() + 60
                while not stop_file.exists() and time.monotonic() < deadline:
                    time.sleep(0.01)
                time.sleep(0.2)  # ten poll intervals: the hook has seen the request

    monkeypatch.setenv("STEPSCOPE_STOP_POLL_S", "0.02")  # 2 s by default
    cb = callback(out_dir, save_config=SaveConfig(save_interval=1), include_collections=["gradients"])
    run = trainer([cb, Planter()], max_epochs=50, num_sanity_val_steps=0)
    result = {}

    def follow():
        while not Path(out_dir, "collections").exists():
            time.sleep(0.01)
        rule = ExplodingTensor(stepscope.create_trial(out_dir), collection_names="gradients", actions=[StopTraining()])
        result["report"] = invoke_rule(rule, watch=True, poll_interval=0.01, max_poll_interval=0.05, timeout=120)

    follower = threading.Thread(target=follow)
    follower.start()
    run.fit(Classifier(accumulate=1), loader(40, 1))
    cb.close()
    follower.join(60)
    assert result["report"].fired_steps[0] == bad_step
    assert run.global_step == bad_step + 2  # steps 0..13 ran; fit stopped at the end of step 13


@pytest.mark.heavy
def test_eval_metrics_timeline_and_publishing_after_each_stage(out_dir):
    """The default save interval (500) lands on no last eval batch: the loops' metrics are
    saved anyway, in their own mode; the timeline and tensors are readable as soon as fit
    returns, and each TRAIN step's phases account for (all of) its time."""
    from stepscope.profiler import STEP_PHASES, create_profiler_trial

    cb = callback(out_dir, profiler_config=ProfilerConfig(system_monitor=False))
    model = Classifier(accumulate=1)
    run = trainer([cb], max_epochs=1, num_sanity_val_steps=0)
    run.fit(model, loader(6, 1), loader(3, 2))
    val_loss = float(run.callback_metrics["val_loss"])

    timeline = create_profiler_trial(out_dir).step_timeline()  # before close: published by fit's end
    steps = timeline[timeline["phase"] == "step"]
    assert sorted(steps["step"]) == [0, 1, 2, 3, 4, 5]
    parts = timeline[(timeline["mode"] == "TRAIN") & ~timeline["phase"].isin(STEP_PHASES)]
    assert {"data", "forward", "backward", "optimizer"} <= set(parts["phase"])
    for step, whole in steps.groupby("step"):
        mine = parts[parts["step"] == step]
        assert int((mine["end_ns"] - mine["start_ns"]).sum()) >= 0.95 * int(whole["end_ns"].iloc[0] - whole["start_ns"].iloc[0])
    trial = stepscope.create_trial(out_dir)
    assert float(trial.tensor("val_loss").value(2, mode=ModeKeys.EVAL)) == pytest.approx(val_loss, rel=1e-6)

    run.test(model, loader(2, 4), verbose=False)
    test_loss = float(run.callback_metrics["test_loss"])
    trial = stepscope.create_trial(out_dir)
    assert float(trial.tensor("test_loss").value(4, mode=ModeKeys.EVAL)) == pytest.approx(test_loss, rel=1e-6)
    assert trial.tensor("val_loss").steps(mode=ModeKeys.TRAIN) == []  # never copied into TRAIN steps
    assert trial.tensor("train_loss").steps(mode=ModeKeys.TRAIN) == [0, 1, 2, 3, 4, 5]  # metrics: every step by default
    cb.close()
    assert stepscope.create_trial(out_dir).is_complete()


@pytest.mark.heavy
def test_resuming_from_a_checkpoint_continues_the_step_numbering(out_dir, tmp_path):
    weights = Collection("weights", save_config=SaveConfig(save_interval=1))
    first = callback(out_dir, collections=[weights])
    run = trainer([first], max_epochs=1, num_sanity_val_steps=0, enable_checkpointing=True, default_root_dir=str(tmp_path / "ckpt"))
    run.fit(Classifier(accumulate=1), loader(3, 1))
    first.close()
    [checkpoint] = list((tmp_path / "ckpt").rglob("*.ckpt"))
    assert torch.load(checkpoint, weights_only=False)["callbacks"]  # the callback's state is in it

    second = callback(out_dir, collections=[weights])
    model = Classifier(accumulate=1)
    seen = {}

    class Watch(pl.Callback):
        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            seen[trainer.global_step] = pl_module.net[0].weight.detach().clone()

    run = trainer([second, Watch()], max_epochs=2, num_sanity_val_steps=0, default_root_dir=str(tmp_path / "ckpt"))
    run.fit(model, loader(3, 1), ckpt_path=str(checkpoint))
    second.close()
    trial = stepscope.create_trial(out_dir)
    assert trial.steps(mode=ModeKeys.TRAIN) == [0, 1, 2, 3, 4, 5]
    for step in (3, 4, 5):
        np.testing.assert_array_equal(trial.tensor("net.0.weight").value(step, mode=ModeKeys.TRAIN), seen[step].numpy())


@pytest.mark.heavy
def test_profiling_window_in_a_lightning_fit(out_dir):
    cb = callback(out_dir, profiler_config=ProfilerConfig(system_monitor=False, detailed_windows=[(3, 2)]))
    trainer([cb], max_epochs=1, num_sanity_val_steps=0, limit_val_batches=0).fit(Classifier(accumulate=1), loader(8, 0))
    traces = stepscope.create_trial(out_dir).profiler.traces
    assert len(traces.trace_keys()) == 1
    steps = traces.step_breakdown(rank=0)
    assert list(steps.step) == [3, 4]
    ops = traces.cpu_ops(k=None, rank=0).set_index("name")
    assert ops.loc["aten::linear", "count"] == 2 * 2  # two Linear layers, two profiled steps
