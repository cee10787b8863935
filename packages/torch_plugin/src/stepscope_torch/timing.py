"""Step and phase timing without stalling the step.

On CPU a boundary is a `time.perf_counter_ns()` reading. On CUDA it is a `torch.cuda.Event`
recorded on the current stream: it says when the GPU got there, and reading it later costs
nothing once the GPU has passed it, so a step only records events and the times of finished
steps are collected at a later step end (or at close, where waiting is fine)."""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

from stepscope.hook_core import clock_origin, wall_ns
from stepscope.modes import ModeKeys

# Spans of a step: (phase, start boundary, end boundary); boundaries are clock tokens.
Span = tuple[str, Any, Any]


@dataclass
class _TimedStep:
    step: int
    mode: ModeKeys
    spans: list[Span] = field(default_factory=list)


class _CpuClock:
    def __init__(self) -> None:
        self._perf0, self._wall0 = clock_origin()

    def now(self) -> int:
        return time.perf_counter_ns()

    def ready(self, token: int) -> bool:
        return True

    def to_wall_ns(self, token: int) -> int:
        return wall_ns(token, self._perf0, self._wall0)


class _CudaClock:
    def __init__(self, device: torch.device) -> None:
        self.device = device
        # One synchronize, at registration (outside any step), anchors GPU times to wall time.
        with torch.cuda.device(device):
            self._anchor = torch.cuda.Event(enable_timing=True)
            self._anchor.record()
            self._anchor.synchronize()
        self._wall0 = time.time_ns()

    def now(self) -> torch.cuda.Event:
        event = torch.cuda.Event(enable_timing=True)
        event.record(torch.cuda.current_stream(self.device))
        return event

    def ready(self, token: torch.cuda.Event) -> bool:
        return token.query()

    def to_wall_ns(self, token: torch.cuda.Event) -> int:
        return self._wall0 + int(self._anchor.elapsed_time(token) * 1_000_000)


class StepTimer:
    """Collects the spans of each step and hands back those whose times are known.

    `mark()` reads the clock; `add_span(phase, start, end)` files a span of the open step;
    `end_step()` closes it; `ready_steps()` yields (step, mode, [(phase, start_ns, end_ns)])
    for steps whose times are known (all of them with `wait=True`)."""

    def __init__(self, device: torch.device | None = None):
        use_cuda = device is not None and device.type == "cuda" and torch.cuda.is_available()
        self._clock: _CpuClock | _CudaClock = _CudaClock(device) if use_cuda else _CpuClock()
        self._current: _TimedStep | None = None
        self._pending: deque[_TimedStep] = deque()

    @property
    def on_device(self) -> bool:
        return isinstance(self._clock, _CudaClock)

    def mark(self) -> Any:
        return self._clock.now()

    def begin_step(self, step: int, mode: ModeKeys) -> None:
        self._current = _TimedStep(step, mode)

    def add_span(self, phase: str, start: Any, end: Any) -> None:
        if self._current is not None and start is not None and end is not None:
            self._current.spans.append((phase, start, end))

    def end_step(self) -> None:
        if self._current is not None and self._current.spans:
            self._pending.append(self._current)
        self._current = None

    def ready_steps(self, wait: bool = False) -> Iterator[tuple[int, ModeKeys, list[tuple[str, int, int]]]]:
        clock = self._clock
        while self._pending:
            timed = self._pending[0]
            last = timed.spans[-1][2]
            if not wait and not clock.ready(last):
                return  # steps finish in order: a later one is not done either
            if wait and isinstance(last, torch.cuda.Event):
                last.synchronize()
            self._pending.popleft()
            yield timed.step, timed.mode, [(phase, clock.to_wall_ns(s), clock.to_wall_ns(e)) for phase, s, e in timed.spans]
