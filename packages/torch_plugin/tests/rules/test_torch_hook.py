"""Rules on runs saved by the PyTorch plugin's Hook (skipped where stepscope_torch is not
installed): a planted condition is found, and StopTraining ends a plain loop through
StopTrainingRequested."""

from __future__ import annotations

import threading
import time

import pytest

from stepscope import create_trial
from stepscope.capture.control import read_stop
from stepscope.rules import ExplodingTensor, StopTraining, VanishingGradient, invoke_rule, run_rules

st = pytest.importorskip("stepscope_torch")
torch = pytest.importorskip("torch")
pytestmark = pytest.mark.heavy


def _train(out_dir, model, steps, lr=0.01, on_step=None):
    hook = st.Hook(str(out_dir), save_config=st.SaveConfig(save_interval=1), include_collections=["weights", "gradients", "losses"], profiler_config=st.ProfilerConfig.disabled())
    hook.register_module(model)
    loss_fn = torch.nn.MSELoss()
    hook.register_loss(loss_fn)
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(64, 16, generator=g), torch.randn(64, 1, generator=g)
    done = []
    try:
        for step in range(steps):
            if on_step is not None:
                on_step(step, model)
            opt.zero_grad()
            loss = loss_fn(model(x), y)
            loss.backward()
            opt.step()
            done.append(step)
    finally:
        hook.close()
    return done


def test_vanishing_gradient_on_a_hook_run(tmp_path):
    torch.manual_seed(0)
    layers = []
    for _ in range(12):
        layers += [torch.nn.Linear(16, 16), torch.nn.Sigmoid()]
    _train(tmp_path / "deep", torch.nn.Sequential(*layers, torch.nn.Linear(16, 1)), steps=5)
    _train(tmp_path / "ok", torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1)), steps=5)
    assert invoke_rule(VanishingGradient(create_trial(str(tmp_path / "deep")))).fired
    healthy = run_rules([VanishingGradient(create_trial(str(tmp_path / "ok")))])[0]
    assert not healthy.fired and healthy.tensors_inspected > 0


def test_stop_training_raises_in_a_plain_loop(tmp_path, monkeypatch):
    monkeypatch.setenv("STEPSCOPE_STOP_POLL_S", "0.02")  # hooks look every 2 s by default
    bad_step = 25
    started: dict[int, float] = {}
    outcome: dict[str, object] = {}

    def on_step(step, model):
        started[step] = time.time()
        if step == bad_step:
            with torch.no_grad():
                model[0].weight[0, 0] = float("nan")
        time.sleep(0.1)

    def train():
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
        try:
            outcome["done"] = _train(tmp_path, model, steps=300, on_step=on_step)
        except st.StopTrainingRequested as exc:
            outcome["stopped"] = exc
            outcome["last"] = max(started)

    thread = threading.Thread(target=train)
    thread.start()
    while not (tmp_path / "collections").exists():
        time.sleep(0.01)
    trial = create_trial(str(tmp_path))
    report = invoke_rule(ExplodingTensor(trial, collection_names="gradients", actions=[StopTraining()]), watch=True, poll_interval=0.01, max_poll_interval=0.05, timeout=90)
    thread.join(90)
    assert report.fired_steps[0] == bad_step
    assert "stopped" in outcome, "training was not stopped"
    request = read_stop(trial.store)
    in_progress = max(s for s, t in started.items() if t <= request["time"])
    assert outcome["last"] <= in_progress + 1
