"""What a new user writes, as the PyTorch MNIST example does it (a small CNN, log_softmax,
the functional `F.nll_loss`), and the mistakes such a user makes: clear errors at the call,
never a hook that switches itself off at the first step."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import stepscope
from stepscope.config import ProfilerConfig, SaveConfig
from stepscope.exceptions import ConfigError
from stepscope_torch import Hook


class MnistNet(nn.Module):
    """The MNIST example's network, shrunk (8x8 images)."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 4, 3, 1)
        self.fc1 = nn.Linear(4 * 3 * 3, 10)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        return F.log_softmax(self.fc1(torch.flatten(x, 1)), dim=1)


def mnist_batches(n, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(8, 1, 8, 8, generator=g), torch.randint(0, 10, (8,), generator=g)) for _ in range(n)]


def test_mnist_style_loop_with_functional_loss(tmp_path):
    out = str(tmp_path / "job")
    torch.manual_seed(0)
    model = MnistNet()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    hook = Hook(out, save_config=SaveConfig(save_interval=2), include_collections="weights", profiler_config=ProfilerConfig.disabled())
    hook.register_module(model)
    hook.register_optimizer(optimizer)
    with pytest.raises(ConfigError, match=r"register_loss: expected a loss module.*nll_loss.*save_loss"):
        hook.register_loss(F.nll_loss)
    wrapped = hook.wrap_loss(F.nll_loss)
    losses, weights = [], []
    model.train()
    for data, target in mnist_batches(5):
        weights.append(model.fc1.weight.detach().clone())
        optimizer.zero_grad()
        output = model(data)
        loss = F.nll_loss(output, target)
        hook.save_loss(loss)  # the functional loss, saved by hand
        wrapped(output, target)  # or through the wrapper
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    hook.close()
    assert hook.failsafe.error is None
    trial = stepscope.create_trial(out)
    assert trial.steps() == [0, 2, 4]
    assert set(trial.collection("losses").tensor_names) == {"loss", "nll_loss_output_0"}
    for step in (0, 2, 4):
        assert float(trial.tensor("loss").value(step)) == pytest.approx(losses[step], rel=1e-6)
        assert float(trial.tensor("nll_loss_output_0").value(step)) == pytest.approx(losses[step], rel=1e-6)
        np.testing.assert_array_equal(trial.tensor("fc1.weight").value(step), weights[step].numpy())
    # include_collections="weights" is one name, not its letters.
    assert "weights" in trial.collections() and "w" not in trial.collections()


def test_register_arguments_are_checked_when_called(tmp_path):
    hook = Hook(str(tmp_path / "job"), profiler_config=ProfilerConfig.disabled())
    with pytest.raises(ConfigError, match="register_module: expected a torch.nn.Module, got function"):
        hook.register_module(F.relu)
    with pytest.raises(ConfigError, match="register_optimizer: expected a torch.optim.Optimizer, got list"):
        hook.register_optimizer([])
    with pytest.raises(ConfigError, match="wrap_loss: expected a callable"):
        hook.wrap_loss(3)
    model = MnistNet()
    hook.register_module(model)
    with pytest.raises(ConfigError, match="already registered"):
        hook.register_module(MnistNet())
    with pytest.raises(ConfigError, match="model has a tensor of that name"):
        hook.save_tensor("fc1.weight", torch.zeros(1))
    with pytest.raises(ConfigError, match="unknown mode"):
        hook.set_mode("training")
    with pytest.raises(ConfigError, match="unknown collection.*'nope'"):
        Hook(str(tmp_path / "other"), include_collections="nope")
    hook.close()
    assert hook.enabled is False and hook.failsafe.error is None
