"""StopTraining from a rule that follows a running (torch) training loop."""

from __future__ import annotations

import threading
import time

import pytest

from stepscope import create_trial
from stepscope.capture.control import read_stop
from stepscope.rules import ExplodingTensor, StopTraining, invoke_rule


@pytest.mark.heavy
def test_stop_training_ends_a_running_plain_loop(tmp_path, training):
    """A rule following a job that is still training fires at the saved step that has the
    bad tensor, and StopTraining ends the training loop within one step after that."""
    MLP, Recorder, regression_data, torch = training.MLP, training.Recorder, training.regression_data, training.torch

    bad_step = 8
    started_steps: dict[int, float] = {}
    finished: list[int] = []

    def train():
        torch.manual_seed(0)
        model = MLP([16, 16, 1])
        x, y = regression_data(0, 64)
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        rec = Recorder(tmp_path, control_poll_s=0.02)
        try:
            for step in range(200):
                started_steps[step] = time.time()
                rec.begin()
                out, _ = model(x)
                loss = torch.nn.functional.mse_loss(out, y)
                opt.zero_grad()
                loss.backward()
                if step == bad_step:
                    model.layers[0].weight.grad[0, 0] = float("nan")
                rec.gradients(model)
                rec.loss(loss)
                opt.step()
                time.sleep(0.1)  # the rest of a real step's work
                rec.end()
                finished.append(step)
                if rec.core.stop_requested:  # what a plain-loop hook checks at step end
                    break
        finally:
            rec.close()

    thread = threading.Thread(target=train)
    thread.start()
    while not (tmp_path / "collections").exists():
        time.sleep(0.01)
    trial = create_trial(str(tmp_path))
    rule = ExplodingTensor(trial, collection_names="gradients", actions=[StopTraining()])
    report = invoke_rule(rule, watch=True, poll_interval=0.01, max_poll_interval=0.05, timeout=60)
    thread.join(60)

    assert report.fired_steps[0] == bad_step
    request = read_stop(trial.store)
    assert request["rule"] == "ExplodingTensor" and request["step"] == bad_step
    in_progress = max(s for s, t in started_steps.items() if t <= request["time"])
    assert finished[-1] <= in_progress + 1, (finished[-1], in_progress)
    assert finished[-1] < 199
