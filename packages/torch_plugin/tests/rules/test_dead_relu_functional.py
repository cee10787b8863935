"""DeadRelu sees ReLUs applied as functions (`F.relu`: no module for the hook to capture)
through the layer before them: units whose pre-activation is <= 0 on the whole batch and
whose bias gradient is exactly 0. Real torch training with the README's quick-start
collections; the expected shares are computed here from the model with torch itself."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from stepscope import create_trial  # noqa: E402
from stepscope.rules import DeadRelu, run_rules  # noqa: E402
from stepscope_torch import Collection, Hook, SaveConfig  # noqa: E402

F = torch.nn.functional


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(12, 32)
        self.fc2 = torch.nn.Linear(32, 4)

    def forward(self, x):
        return self.fc2(F.relu(self.fc1(x)))  # functional ReLU: the hook sees fc1's output only


QUICK_START = ["weights", "biases", "gradients", "losses", "outputs"]


def train(out_dir, *, hidden_bias: float | None = None, logit_bias: float | None = None, steps: int = 8, include=QUICK_START):
    torch.manual_seed(0)
    model = Net()
    with torch.no_grad():
        if hidden_bias is not None:
            model.fc1.bias[:24] = hidden_bias  # 24 of 32 units (75 %) never fire
        if logit_bias is not None:
            model.fc2.bias.fill_(logit_bias)  # every logit <= 0, yet each passes a gradient
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    x, y = torch.randn(64, 12), torch.randint(0, 4, (64,))
    hook = Hook(str(out_dir), save_config=SaveConfig(save_interval=1), include_collections=include,
                collections=[Collection("losses", save_config=SaveConfig(save_interval=1))])
    with hook:
        hook.register_module(model)
        hook.register_optimizer(optimizer)
        for _ in range(steps):
            optimizer.zero_grad()
            loss = F.cross_entropy(model(x), y)
            hook.save_loss(loss)
            loss.backward()
            optimizer.step()
    with torch.no_grad():
        dead = ((model.fc1(x) > 0).float().mean(0) < 0.01).float().mean().item() * 100
    return str(out_dir), dead


def _check(path):
    return run_rules([DeadRelu(create_trial(path), **DeadRelu.preset)])[0]


def test_dead_units_behind_a_functional_relu_are_found(tmp_path):
    path, dead = train(tmp_path / "dead", hidden_bias=-20.0)
    report = _check(path)
    assert report.fired, report.summary()
    evidence = report.evidence[0]
    assert evidence.tensor == "fc1_output_0" and "functional ReLU" in evidence.message
    assert evidence.value == pytest.approx(dead) and dead >= 75.0


def test_a_healthy_layer_and_negative_logits_with_gradients_are_not_dead(tmp_path):
    path, dead = train(tmp_path / "healthy", logit_bias=-30.0)
    trial = create_trial(path)
    logits = trial.tensor("fc2_output_0").value(trial.steps()[0])
    assert (logits <= 0).all()  # every logit unit is "off" by the sign test alone...
    report = _check(path)
    assert report.status == "ok" and not report.fired, report.summary()  # ...but passes a gradient
    assert dead < 50.0
    assert report.tensors_inspected >= 4  # fc1's and fc2's outputs and bias gradients were read


def test_without_gradients_a_linear_output_is_not_judged(tmp_path):
    # Outputs alone cannot tell a dead unit from a logit that is merely negative.
    path, dead = train(tmp_path / "dead", hidden_bias=-20.0, include=["losses", "outputs"])
    assert dead >= 75.0
    report = _check(path)
    assert not report.fired and report.status == "no data", report.summary()


class LeakyNet(torch.nn.Module):
    """A LeakyReLU module named `leakyrelu` (as pytorch/examples' gat/main.py names its
    own): the default regex `.*relu_output` matches its output name, and a ReLU module for
    comparison, both behind biases that keep most of their inputs below zero."""

    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(12, 32)
        self.leakyrelu = torch.nn.LeakyReLU(0.2)
        self.fc2 = torch.nn.Linear(32, 32)
        self.relu = torch.nn.ReLU()
        self.head = torch.nn.Linear(32, 4)

    def forward(self, x):
        return self.head(self.relu(self.fc2(self.leakyrelu(self.fc1(x)))))


def test_a_leaky_relu_named_relu_is_never_dead_a_relu_is(tmp_path):
    torch.manual_seed(0)
    model = LeakyNet()
    with torch.no_grad():
        model.fc1.bias[:24] = -20.0  # 75 % of the LeakyReLU's inputs below zero: still passing gradients
        model.fc2.bias[:24] = -20.0  # 75 % of the ReLU's units never fire
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    x, y = torch.randn(64, 12), torch.randint(0, 4, (64,))
    with Hook(str(tmp_path), save_config=SaveConfig(save_interval=1), include_collections=QUICK_START) as hook:
        hook.register_module(model)
        hook.register_optimizer(optimizer)
        for _ in range(6):
            optimizer.zero_grad()
            loss = F.cross_entropy(model(x), y)
            hook.save_loss(loss)
            loss.backward()
            optimizer.step()
    trial = create_trial(str(tmp_path))
    leaky = trial.tensor("leakyrelu_output_0").value(trial.steps()[-1])
    assert ((leaky <= 0).mean(0) > 0.99).mean() >= 0.75  # "off" by the sign alone
    assert torch.nn.LeakyReLU(0.2)(torch.tensor([-1.0], requires_grad=True)).grad_fn is not None
    report = _check(str(tmp_path))
    assert report.fired, report.summary()
    assert {e.tensor for e in report.evidence} == {"relu_output_0"}, report.summary()
