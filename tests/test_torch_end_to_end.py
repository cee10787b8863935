"""Across packages, with a real S3-protocol server: a PyTorch job written by the hook to
s3://, read back by the trial, checked by `stepscope check`, its profiler side read too."""

import numpy as np
import pytest
import torch
from torch import nn

import stepscope
from stepscope.cli import main as stepscope_cli
from stepscope.config import ProfilerConfig, SaveConfig
from stepscope_torch import Hook

pytestmark = pytest.mark.heavy


def test_torch_job_on_s3(s3_url, capsys):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    loss_fn = nn.MSELoss()
    x, y = torch.randn(64, 6), torch.randn(64, 1)
    expected = {}
    with Hook(s3_url, save_config=SaveConfig(save_interval=3), include_collections=["weights", "gradients"],
              profiler_config=ProfilerConfig(monitor_interval_ms=100)) as hook:
        hook.register_module(model)
        hook.register_loss(loss_fn)
        hook.register_optimizer(optimizer)
        for step in range(12):
            optimizer.zero_grad()
            loss = loss_fn(model(x[step * 4 : step * 4 + 16]), y[step * 4 : step * 4 + 16])
            loss.backward()
            if step % 3 == 0:
                expected[step] = (model[0].weight.detach().clone().numpy(), model[0].weight.grad.clone().numpy(), loss.item())
            optimizer.step()

    trial = stepscope.create_trial(s3_url)
    assert trial.is_complete() and trial.steps(mode="train") == [0, 3, 6, 9]
    for step, (weight, grad, loss) in expected.items():
        np.testing.assert_array_equal(trial.tensor("0.weight").value(step, mode="train"), weight)
        np.testing.assert_allclose(trial.tensor("gradient/0.weight").value(step, mode="train"), grad, rtol=1e-6)
        assert trial.tensor("MSELoss_output_0").value(step, mode="train") == pytest.approx(loss, rel=1e-6)
    timeline = trial.profiler.step_timeline()
    assert sorted(timeline[timeline["phase"] == "step"]["step"]) == list(range(12))

    assert stepscope_cli(["check", s3_url, "--rule", "ExplodingTensor", "--rule", "VanishingGradient", "--quiet"]) == 0
    assert "ExplodingTensor" in capsys.readouterr().out
    assert stepscope.create_trial(s3_url).store.exists("rule-output/summary.json")
