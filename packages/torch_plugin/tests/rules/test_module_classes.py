"""The PyTorch hook records the module class of each saved layer input/output and of each
parameter and its gradient, so rules recognise a ReLU's output named `1_output_0`."""

from __future__ import annotations

import torch
from torch import nn

from stepscope import create_trial
from stepscope.config import SaveConfig
from stepscope.rules import DeadRelu, default_rules, run_rules
from stepscope_torch import Hook


def test_module_classes_reach_the_trial_and_the_default_set(tmp_path):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.BatchNorm1d(16), nn.Linear(16, 1))
    with torch.no_grad():
        model[0].bias.fill_(-30.0)  # every ReLU unit dead
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    loss_fn = nn.MSELoss()
    with Hook(str(tmp_path), save_config=SaveConfig(save_interval=1), include_collections=["weights", "gradients", "outputs", "losses"]) as hook:
        hook.register_module(model)
        hook.register_loss(loss_fn)
        hook.register_optimizer(optimizer)
        for _ in range(3):
            optimizer.zero_grad()
            loss_fn(model(torch.randn(32, 8)), torch.randn(32, 1)).backward()
            optimizer.step()
    trial = create_trial(str(tmp_path))
    assert trial.module_class("1_output_0") == "ReLU" and trial.module_class("0_output_0") == "Linear"
    assert trial.module_class("gradient/2.weight") == "BatchNorm1d" and trial.module_class("3.weight") == "Linear"
    rules = {r.name: r for r in default_rules(trial)}
    assert "DeadRelu" in rules and "1_output_0" in rules["DeadRelu"]._layers()
    report = run_rules([DeadRelu(trial, **DeadRelu.preset)])[0]
    assert report.fired and {e.tensor for e in report.evidence} == {"1_output_0"}
    assert not run_rules([DeadRelu(trial)])[0].fired  # SageMaker's `.*relu_output` regex finds nothing here
