"""StepscopeCallback with Lightning's manual optimization: a GAN shaped like Lightning's
domain template (generator update, then discriminator update, both losses logged and
nothing returned). One TRAIN step per batch, each optimizer's gradients, the logged losses
in the losses collection, and the discriminator's forward not counted as optimizer time."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

import stepscope
from stepscope.config import ProfilerConfig, SaveConfig
from stepscope.modes import ModeKeys

pl = pytest.importorskip("lightning.pytorch")


class TinyGAN(pl.LightningModule):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.automatic_optimization = False
        self.generator = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 6))
        self.discriminator = nn.Sequential(nn.Linear(6, 16), nn.LeakyReLU(0.2), nn.Linear(16, 1))
        self.seen = []  # per batch: each model's gradients right before its update, and the losses

    def forward(self, z):
        return self.generator(z)

    def training_step(self, batch):
        (real,) = batch
        opt_g, opt_d = self.optimizers()
        z = torch.randn(real.shape[0], 4)
        record = {}
        self.toggle_optimizer(opt_g)
        g_loss = nn.functional.binary_cross_entropy_with_logits(self.discriminator(self(z)), torch.ones(real.shape[0], 1))
        opt_g.zero_grad()
        self.manual_backward(g_loss)
        record["g"] = {f"generator.{n}": p.grad.clone() for n, p in self.generator.named_parameters()}
        opt_g.step()
        self.untoggle_optimizer(opt_g)
        self.toggle_optimizer(opt_d)
        real_loss = nn.functional.binary_cross_entropy_with_logits(self.discriminator(real), torch.ones(real.shape[0], 1))
        fake_loss = nn.functional.binary_cross_entropy_with_logits(self.discriminator(self(z).detach()), torch.zeros(real.shape[0], 1))
        d_loss = (real_loss + fake_loss) / 2
        opt_d.zero_grad()
        self.manual_backward(d_loss)
        record["d"] = {f"discriminator.{n}": p.grad.clone() for n, p in self.discriminator.named_parameters()}
        opt_d.step()
        self.untoggle_optimizer(opt_d)
        self.log_dict({"d_loss": d_loss, "g_loss": g_loss})
        record["losses"] = {"d_loss": d_loss.item(), "g_loss": g_loss.item()}
        self.seen.append(record)

    def configure_optimizers(self):
        return torch.optim.Adam(self.generator.parameters(), lr=2e-3), torch.optim.Adam(self.discriminator.parameters(), lr=2e-3)


def loader(n: int):
    generator = torch.Generator().manual_seed(1)
    return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(n * 8, 6, generator=generator) + 1), batch_size=8)


def fit(out_dir, batches: int, **kwargs):
    from stepscope_torch import StepscopeCallback

    callback = StepscopeCallback(out_dir, **kwargs)
    model = TinyGAN()
    trainer = pl.Trainer(
        accelerator="cpu", devices=1, max_epochs=1, logger=False, enable_checkpointing=False, enable_progress_bar=False,
        enable_model_summary=False, callbacks=[callback],
    )
    trainer.fit(model, loader(batches))
    callback.close()
    return model, trainer


def test_gan_with_manual_optimization(out_dir):
    model, trainer = fit(
        out_dir, 6, save_config=SaveConfig(save_interval=1), include_collections=["weights", "gradients"],
        profiler_config=ProfilerConfig(system_monitor=False),
    )
    assert trainer.global_step == 12  # Lightning counts both optimizers' steps

    trial = stepscope.create_trial(out_dir)
    assert trial.steps(mode=ModeKeys.TRAIN) == list(range(6))  # one TRAIN step per batch
    global_steps = trial.tensor("trainer/global_step").values(mode=ModeKeys.TRAIN)
    assert {step: int(v) for step, v in global_steps.items()} == {i: 2 * (i + 1) for i in range(6)}
    for step, record in enumerate(model.seen):
        for name, grad in {**record["g"], **record["d"]}.items():
            np.testing.assert_array_equal(trial.tensor(f"gradient/{name}").value(step, mode=ModeKeys.TRAIN), grad.numpy(), err_msg=name)
        for name, value in record["losses"].items():
            assert float(trial.tensor(name).value(step, mode=ModeKeys.TRAIN)) == pytest.approx(value, rel=1e-6)
    assert {"d_loss", "g_loss"} <= set(trial.collection("losses").tensor_names)
    scopes = {s.name: s.kind for s in trial.scopes()}
    assert scopes == {"generator": "model", "discriminator": "model", "optimizer_0": "optimizer", "optimizer_1": "optimizer"}
    assert trial.scope_map().group_of("gradient/generator.0.weight") == "generator"
    assert trial.scope_map().group_of("gradient/discriminator.2.weight") == "discriminator"
    assert {p for s in trial.scopes() if s.name == "optimizer_1" for p in s.parameters} == {
        f"discriminator.{n}" for n, _ in model.discriminator.named_parameters()
    }

    # The phases: after the generator's update comes forward work (the discriminator's
    # forwards), then its backward and update; the time after an update is not "optimizer".
    from stepscope.profiler import STEP_PHASES, create_profiler_trial

    timeline = create_profiler_trial(out_dir).step_timeline()
    parts = timeline[(timeline["mode"] == "TRAIN") & ~timeline["phase"].isin(STEP_PHASES)]
    for step, spans in parts.groupby("step"):
        phases = [p for p in spans.sort_values("start_ns")["phase"] if p not in ("data", "other")]
        collapsed = [p for i, p in enumerate(phases) if i == 0 or p != phases[i - 1]]
        assert collapsed == ["forward", "backward", "optimizer", "forward", "backward", "optimizer", "forward"], (step, collapsed)


def test_default_rules_judge_the_gan_per_model(out_dir, capsys):
    """The default rules read both models' tensors and the logged losses. (Whether a GAN's
    adversarial losses should be judged by LossNotDecreasing is the rules' business; the
    gradient and weight rules must find a healthy GAN healthy.)"""
    import json

    from stepscope.cli import main as cli_main

    fit(out_dir, 40, save_config=SaveConfig(save_interval=1), include_collections=["weights", "biases", "gradients"], profiler_config=ProfilerConfig.disabled())
    cli_main(["check", out_dir, "--quiet", "--no-write", "--json"])
    output = capsys.readouterr().out
    reports = {r["rule"]: r for r in json.loads(output[output.index("["): output.rindex("]") + 1])}
    for rule in ("ExplodingTensor", "VanishingGradient", "WeightUpdateRatio", "AllZero"):
        assert reports[rule]["status"] == "ok", reports[rule]
