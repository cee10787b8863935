"""Steps that save only a few scalars, handed to the writer in batches.

Under the capture defaults losses and metrics are saved at every step. Handed over one by
one, each such step wakes the writer thread and becomes an event file and an index file of
its own: on a CPU-bound loop that costs more than the step's few bytes (the thread's wake-up
and its turn at the GIL, about ten system calls). So a step whose due collections are only
losses and metrics is held here, and the held steps go to the writer together
(`Writer.write_held_steps`: one event file for them all, one index file per step, as smdebug's
reader wants) once HOLD_STEPS are held or HOLD_S passed since the first, before any other
step, and at flush and close. When no step follows (a hang, a long pause between steps), a
daemon thread that wakes every HOLD_S hands them over, so a reader sees such a step at most
about 2 x HOLD_S (or HOLD_STEPS steps) later than it would otherwise, and a process killed
while it hangs loses none of them; `hook.flush()` publishes everything at once.

A compiled plugin that ends such steps itself (stepscope_torch's scalar steps) keeps them
in a list of its own: `attach_source` gives its `take_held()` (the steps ended since the
last take, oldest first) and `held_age()` (seconds since the oldest of them ended, or
None). Every hand-over, release and check takes them first, so steps reach the writer in
the order they ended whichever path ended them; the source calls `release()` itself once
`max_steps` wait or the first waited `max_s`. `note(mode, tensors)`, when given, hears of
every step handed over or taken (the evidence count of saved losses), under the lock."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ..modes import ModeKeys

HOLD_STEPS = 100
HOLD_S = 1.0
# A held step has at most this many values of at most MAX_BYTES together (scalars: a user's
# save_scalar of a large array goes to the writer as a step of its own).
MAX_VALUES = 16
MAX_BYTES = 1 << 16


def _small(tensors: Mapping[str, Any]) -> bool:
    """Whether `tensors` hold at most MAX_BYTES (a loop: no generator at every step)."""
    total = 0
    for value in tensors.values():
        if value.__class__ is not float:  # (Keras hands its logs as Python floats: no nbytes to ask for)
            total += getattr(value, "nbytes", 0) or 0
    return total <= MAX_BYTES


class HeldSteps:
    """The scalar-only steps not yet handed to `writer`. The training thread holds and hands
    over; a daemon thread (started with the first held step) hands over what waited past
    its time. One lock keeps the steps reaching the writer in order."""

    __slots__ = ("_writer", "_steps", "_until", "_lock", "_closed", "_releaser", "_source", "_note", "max_steps", "max_s")

    def __init__(self, writer: Any, max_steps: int = HOLD_STEPS, max_s: float = HOLD_S, note: Callable[[ModeKeys, Mapping[str, Any]], None] | None = None) -> None:
        self._writer = writer
        self._source: Any = None
        self._note = note
        self._steps: list[tuple[int, ModeKeys, int, Mapping[str, Any], Mapping[str, Sequence[int]]]] = []
        self._until = 0.0
        self._lock = threading.Lock()
        self._closed = threading.Event()
        self._releaser: threading.Thread | None = None
        self.max_steps = max_steps
        self.max_s = max_s

    def __len__(self) -> int:
        with self._lock:
            self._take()
            return len(self._steps)

    def attach_source(self, source: Any) -> None:
        """Take the steps a compiled plugin ended itself from `source` (see above)."""
        with self._lock:
            self._take()  # (a source attached before: its steps come first)
            self._source = source
            if self._releaser is None:
                self._start_releaser()

    def _take(self) -> None:
        """Move the source's ended steps behind the held ones (the lock is held)."""
        source = self._source
        if source is None:
            return
        age = source.held_age()
        steps = source.take_held()
        if not steps:
            return
        if not self._steps:
            self._until = time.monotonic() - (age or 0.0) + self.max_s
        note = self._note
        if note is not None:
            for _step, mode, _mode_step, tensors, _shapes in steps:
                note(mode, tensors)
        self._steps += steps

    def hand_over(self, step: int, mode: ModeKeys, mode_step: int, tensors: Mapping[str, Any], shapes: Mapping[str, Sequence[int]], scalars: bool) -> None:
        """Hand a closed step to the writer, or hold it when `scalars` (only losses and
        metrics were due) and its values are few and small. Steps reach the writer in order."""
        with self._lock:
            if self._source is not None:
                self._take()
            if self._note is not None:
                self._note(mode, tensors)
            if scalars and len(tensors) <= MAX_VALUES and _small(tensors):
                held = self._steps
                now = time.monotonic()
                if not held:
                    self._until = now + self.max_s
                    if self._releaser is None:
                        self._start_releaser()
                held.append((step, mode, mode_step, tensors, shapes))
                if len(held) >= self.max_steps or now >= self._until:
                    self._release()
                return
            self._release()
            self._writer.write_step(step, mode, mode_step, tensors, shapes)

    def release(self) -> None:
        """Hand every held step to the writer (one job)."""
        with self._lock:
            self._release()

    def close(self) -> None:
        """Hand over what is held and stop the daemon thread."""
        self._closed.set()
        self.release()

    def _release(self) -> None:
        self._take()
        if self._steps:
            steps, self._steps = self._steps, []
            self._writer.write_held_steps(steps)

    def _start_releaser(self) -> None:
        self._releaser = threading.Thread(target=self._release_late_steps, name="stepscope-held-steps", daemon=True)
        self._releaser.start()

    def _release_late_steps(self) -> None:
        while not self._closed.wait(min(max(self.max_s, 0.05), 60.0)):
            with self._lock:
                source = self._source
                age = source.held_age() if source is not None else None
                if (self._steps and time.monotonic() >= self._until) or (age is not None and age >= self.max_s):
                    try:
                        self._release()
                    except Exception:  # noqa: BLE001 - the writer reports its own failures; the next step retries
                        pass


__all__ = ["HOLD_S", "HOLD_STEPS", "HeldSteps"]
