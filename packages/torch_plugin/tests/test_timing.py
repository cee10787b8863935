"""Step and phase timing: the spans a loop produces, and the clock conversion."""

from __future__ import annotations

import time

import pytest
import torch
from torch import nn

from stepscope.capture.phases import StepTimer
from stepscope.config import ProfilerConfig, SaveConfig
from stepscope.modes import ModeKeys
from stepscope_torch.timing import device_clock


class RecordingTimeline:
    """Stands in for the profiler's TimelineWriter: keeps what HookBase hands it."""

    def __init__(self):
        self.spans = []

    def add(self, name, start_ns, end_ns, *, step, mode, phase, args=None):
        self.spans.append((step, mode, phase, start_ns, end_ns))

    def add_spans(self, spans, *, step, mode):
        for phase, start_ns, end_ns in spans:
            self.add(phase, start_ns, end_ns, step=step, mode=mode, phase=phase)

    def close(self):
        pass


def test_loop_with_accumulation_gives_every_phase_in_order(make_hook, mlp, batches):
    hook = make_hook(save_config=SaveConfig(save_interval=1000), profiler_config=ProfilerConfig(system_monitor=False))
    hook.timeline.close()
    timeline = hook.timeline = RecordingTimeline()
    model = mlp()
    loss_fn = nn.CrossEntropyLoss()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    hook.register_module(model)
    hook.register_loss(loss_fn)
    hook.register_optimizer(optimizer)
    for i, (x, y) in enumerate(batches(4)):
        loss_fn(model(x), y).backward()
        if i % 2 == 1:
            optimizer.step()
            optimizer.zero_grad()
    model.eval()
    with torch.no_grad():
        model(batches(1)[0][0])
    hook.close()

    by_step = {}
    for step, mode, phase, start, end in timeline.spans:
        assert start <= end
        by_step.setdefault((step, mode), []).append(phase)
    assert by_step[(0, ModeKeys.TRAIN)] == ["data", "forward", "backward", "forward", "backward", "optimizer", "step"]
    assert by_step[(1, ModeKeys.TRAIN)] == ["data", "forward", "backward", "forward", "backward", "optimizer", "step"]
    assert by_step[(2, ModeKeys.EVAL)] == ["data", "forward", "eval_step"]
    # Each TRAIN step's phases lie inside its step span, and steps follow each other.
    for step in (0, 1):
        spans = [s for s in timeline.spans if s[0] == step]
        step_span = spans[-1]
        assert all(step_span[3] <= s[3] and s[4] <= step_span[4] for s in spans)
    assert [s for s in timeline.spans if s[2] == "step"][1][3] == [s for s in timeline.spans if s[2] == "step"][0][4]
    # The phases tile each step: together they account for all of its time.
    for key in by_step:
        spans = [s for s in timeline.spans if (s[0], s[1]) == key]
        step_span = spans[-1]
        assert sum(s[4] - s[3] for s in spans[:-1]) == step_span[4] - step_span[3]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_timer_resolves_events_later():
    timer = StepTimer(device_clock(torch.device("cuda")))
    x = torch.randn(2048, 2048, device="cuda")
    a = timer.clock.now()
    for _ in range(20):
        x = x @ x / 2048
    b = timer.clock.now()
    timer.add_step(0, ModeKeys.TRAIN, [("step", a, b)])
    [(step, mode, [(phase, start, end)])] = list(timer.ready_steps(wait=True))
    assert 0 < end - start < 10_000_000_000
    assert abs(start - time.time_ns()) < 60_000_000_000
