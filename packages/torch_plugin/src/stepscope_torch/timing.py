"""The step timeline's clock on a GPU.

On CPU a boundary is a `time.perf_counter_ns()` reading (core's `CpuClock`). On CUDA it is
a `torch.cuda.Event` recorded on the current stream: it says when the GPU got there, and
reading it later costs nothing once the GPU has passed it, so a step only records events
and core's `StepTimer` collects the times of finished steps at a later step end (or at
close, where waiting is fine)."""

from __future__ import annotations

import time

import torch

from stepscope.capture.phases import Clock, CpuClock


class CudaClock:
    """Tokens are CUDA events on the device's current stream."""

    immediate = False

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
        return bool(token.query())

    def wait(self, token: torch.cuda.Event) -> None:
        token.synchronize()

    def to_wall_ns(self, token: torch.cuda.Event) -> int:
        return self._wall0 + int(self._anchor.elapsed_time(token) * 1_000_000)


def device_clock(device: torch.device | None) -> Clock:
    """The clock for a model on `device`: CUDA events on a GPU, perf_counter elsewhere."""
    if device is not None and device.type == "cuda" and torch.cuda.is_available():
        return CudaClock(device)
    return CpuClock()
