"""The CUDA path: device reductions, non-blocking copies into pinned memory resolved on the
writer thread, CUDA-event timing. Skipped without a GPU."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

import stepscope
from stepscope import reductions
from stepscope.config import ReductionConfig, SaveConfig

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


def test_saved_values_on_cuda_equal_the_models_own(make_hook, mlp, batches, out_dir):
    config = ReductionConfig(reductions=("min", "max", "mean", "std", "variance", "sum"), norms=("l1", "l2"), save_raw_tensor=True)
    hook = make_hook(save_config=SaveConfig(save_interval=2), reduction_config=config, include_collections=["weights", "gradients"])
    model = mlp().cuda()
    loss_fn = nn.CrossEntropyLoss()
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    hook.register_module(model)
    hook.register_loss(loss_fn)
    hook.register_optimizer(optimizer)
    seen = []
    for x, y in batches(5):
        optimizer.zero_grad()
        loss = loss_fn(model(x.cuda()), y.cuda())
        loss.backward()
        seen.append({"w": model.fc1.weight.detach().cpu().numpy(), "g": model.fc1.weight.grad.cpu().numpy(), "loss": loss.item()})
        optimizer.step()
    hook.close()
    trial = stepscope.create_trial(out_dir)
    for step in (0, 2, 4):
        np.testing.assert_array_equal(trial.tensor("fc1.weight").value(step), seen[step]["w"])
        np.testing.assert_array_equal(trial.tensor("gradient/fc1.weight").value(step), seen[step]["g"])
        assert float(trial.tensor("CrossEntropyLoss_output_0").value(step)) == pytest.approx(seen[step]["loss"], rel=1e-6)
        for reduction, is_abs in config.requested():
            expected = float(reductions.compute(seen[step]["g"], reduction, is_abs))
            assert trial.tensor("gradient/fc1.weight").reduction_value(step, reduction, abs=is_abs) == pytest.approx(expected, rel=1e-9)
