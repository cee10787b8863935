"""stepscope's own cost, measured by the hooks while the job runs: time spent inside the
hooks and in the writer per step, against the step time, and bytes written. The hooks
publish one `stepscope-cost/<worker>.json` at close; the report shows it."""

from __future__ import annotations

import json
import logging
import platform
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..layout import COST_DIR as COST_DIR  # re-exported: the format is described here
from ..layout import cost_key as cost_key

logger = logging.getLogger("stepscope")

MAX_COST_BYTES = 16 << 20  # a cost file holds at most MAX_SAMPLES samples
MAX_SAMPLES = 2000  # per-step samples kept (every k-th step beyond that)
# Steps where nothing is due are accounted in blocks (their mean is the sample): the hook
# times the first step of a block (and every step that saves), and counts the others' time
# in it as the last such step's where nothing was due. A step where nothing is due then
# costs the meter one integer comparison. A block has BLOCK_STEPS steps, or more where
# steps are so short that it would last under MIN_BLOCK_S: the timed step is a call into
# Python, which must stay a small share of a loop of microsecond steps.
BLOCK_STEPS = 32
MIN_BLOCK_S = 0.005
MAX_BLOCK_STEPS = 1 << 14
# An untimed step is counted at the median of the last IDLE_SAMPLES idle begins measured,
# not at the last one alone: one outlier (the first step's warm-up, a page fault, the
# scheduler) would otherwise be multiplied by a block's length, or, where saves come more
# often than blocks end, by every step between them for the rest of the run.
IDLE_SAMPLES = 5


@dataclass
class HookCost:
    """What one worker's hook measured. Times in seconds; `samples` are per-step
    (step, step seconds, hook seconds) for the steps kept."""

    worker: str
    steps: int = 0
    step_s: float = 0.0
    hook_s: float = 0.0
    writer_s: float = 0.0
    bytes_written: int = 0
    samples: list[tuple[int, float, float]] = field(default_factory=list)
    versions: dict[str, str] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "worker": self.worker, "steps": self.steps, "step_s": self.step_s, "hook_s": self.hook_s,
            "writer_s": self.writer_s, "bytes_written": self.bytes_written,
            "samples": [list(s) for s in self.samples], "versions": self.versions,
        }

    @classmethod
    def from_json(cls, body: dict[str, Any]) -> HookCost:
        """From a cost file; ValueError/TypeError when a field has the wrong type or an
        impossible value (NaN seconds, a step of 1e20, a negative count)."""
        if not isinstance(body.get("worker"), str):
            raise TypeError(f"worker must be a string, got {body.get('worker')!r:.40}")
        return cls(
            worker=body["worker"], steps=_count(body.get("steps", 0)), step_s=_seconds(body.get("step_s", 0.0)),
            hook_s=_seconds(body.get("hook_s", 0.0)), writer_s=_seconds(body.get("writer_s", 0.0)),
            bytes_written=_count(body.get("bytes_written", 0)),
            samples=[(_count(s), _seconds(a), _seconds(b)) for s, a, b in body.get("samples", ())],
            versions={str(k): str(v) for k, v in (body.get("versions") or {}).items()},
        )


def _count(value: Any) -> int:
    if type(value) is not int or not 0 <= value < 1 << 62:
        raise ValueError(f"expected a non-negative integer, got {value!r:.40}")
    return value


def _seconds(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < 1e9:  # NaN fails too
        raise ValueError(f"expected a duration in seconds, got {value!r:.40}")
    return float(value)


class CostMeter:
    """Accumulates the hook's own time. `timed(method)` wraps a hook entry point; nested
    entry points count once (the outer one). `step_begins(step, at)` closes the previous
    step. A wrapped call costs two perf_counter reads and a few attribute updates: the
    meter stays on in every job."""

    __slots__ = (
        "cost", "depth", "hook_s", "step_hook_s", "idle_begin_s", "block_steps", "min_block_s",
        "_step", "_step_started", "_stride", "_entered", "_idle_samples",
    )

    def __init__(self, worker: str, versions: dict[str, str] | None = None, min_block_s: float = MIN_BLOCK_S):
        self.cost = HookCost(worker, versions={"python": platform.python_version(), **(versions or {})})
        self.depth = 0
        self.hook_s = 0.0
        self.step_hook_s = 0.0
        self.idle_begin_s = 0.0  # the hook's time in a step's begin where nothing is due (median of the last measured)
        self._idle_samples: list[float] = []  # those last measured, oldest first
        self.block_steps = BLOCK_STEPS  # the steps of the next block
        self.min_block_s = min_block_s
        self._step: int | None = None
        self._step_started = 0.0
        self._stride = 1
        self._entered = 0.0

    def timed(self, method: Callable[..., Any]) -> Callable[..., Any]:
        meter = self
        clock = time.perf_counter

        def timed(*args: Any, **kwargs: Any) -> Any:
            if meter.depth:
                return method(*args, **kwargs)
            meter.depth = 1
            started = clock()
            try:
                return method(*args, **kwargs)
            finally:
                elapsed = clock() - started
                meter.depth = 0
                meter.hook_s += elapsed
                meter.step_hook_s += elapsed

        timed.__wrapped__ = method  # type: ignore[attr-defined]
        timed.__doc__ = method.__doc__
        return timed

    def enter(self) -> None:
        """For code that cannot be wrapped: `enter()` ... `leave()` (not nested)."""
        self.depth += 1
        self._entered = time.perf_counter()

    def leave(self) -> None:
        elapsed = time.perf_counter() - self._entered
        self.depth -= 1
        self.hook_s += elapsed
        self.step_hook_s += elapsed

    def steps_begin(self, step: int, at: float, begin_s: float, idle: bool) -> int:
        """The hook began `step` at `at`, which took it `begin_s` (`idle`: nothing was due
        and nothing ended). The untimed steps since the last call (one per step after the
        first) are counted at the median of the last IDLE_SAMPLES idle begin times
        measured. Returns the length of the block that begins here: BLOCK_STEPS, doubled
        while a whole block lasts under `min_block_s`, halved again while one lasts over
        four times that; 1 after a step that was not idle, so that the next one is timed
        too and, once one is idle, measures the steps that go untimed (saves every few
        steps would otherwise leave them counted at a measure from the run's start)."""
        previous = self._step
        if previous is not None and step - previous > 1:
            estimate = (step - previous - 1) * self.idle_begin_s
            self.hook_s += estimate
            self.step_hook_s += estimate
        if previous is not None and step - previous >= self.block_steps:  # a whole block ended
            lasted = at - self._step_started
            if lasted < self.min_block_s:
                self.block_steps = min(2 * self.block_steps, MAX_BLOCK_STEPS)
            elif lasted > 4 * self.min_block_s:
                self.block_steps = max(self.block_steps // 2, BLOCK_STEPS)
        self.step_begins(step, at)
        self.hook_s += begin_s
        self.step_hook_s += begin_s
        if not idle:
            return 1
        samples = self._idle_samples
        samples.append(begin_s)
        if len(samples) > IDLE_SAMPLES:
            del samples[0]
        self.idle_begin_s = sorted(samples)[len(samples) // 2]
        return self.block_steps

    def step_begins(self, step: int, at: float) -> None:
        """Step `step` begins at `at`: the steps since the last call (one, or a block of
        several: the hook calls this every BLOCK_STEPS steps where nothing is due, and at
        every step where something is) end. Step time runs from one step's start to the
        next one's (what a user calls a step)."""
        if self._step is not None:
            self._steps_done(self._step, max(1, step - self._step), at - self._step_started)
        self._step, self._step_started = step, at

    def step_ends(self, at: float, next_step: int | None = None) -> None:
        """Close the last steps (at close: `next_step` is the number of the step that
        would come next, so a block of several steps is counted whole)."""
        if self._step is not None:
            self._steps_done(self._step, 1 if next_step is None else max(1, next_step - self._step), at - self._step_started)
            self._step = None

    def step_done(self, step: int, step_s: float) -> None:
        """One step `step` took `step_s` (and the hook time since the last call)."""
        self._steps_done(step, 1, step_s)

    def _steps_done(self, first: int, n: int, elapsed: float) -> None:
        """Steps `first` .. `first + n - 1` took `elapsed`: a block's sample is its first
        step, with the block's means."""
        cost = self.cost
        cost.steps += n
        cost.step_s += elapsed
        if self._stride == 1 or first % self._stride == 0:
            cost.samples.append((first, elapsed / n, self.step_hook_s / n))
            if len(cost.samples) >= MAX_SAMPLES:
                cost.samples = cost.samples[::2]
                self._stride *= 2
        self.step_hook_s = 0.0

    def to_bytes(self, writer_s: float, bytes_written: int) -> bytes:
        cost = self.cost
        cost.hook_s, cost.writer_s, cost.bytes_written = self.hook_s, writer_s, bytes_written
        return json.dumps(cost.to_json()).encode()
