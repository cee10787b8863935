"""The numbers the step driver keeps: everything a step reads and changes, in one object.

`HookBase` keeps its per-step state here rather than in its own attributes, so that a
plugin can replace this class with a compiled one of the same fields (stepscope_torch's
`_fastpath.Counters`): on a step where nothing is due, reading a few fields of one small
object is the whole of the hook's work, and scattered objects (each a cache miss after the
framework's own step has run) would cost more than the work itself."""

from __future__ import annotations

from typing import Any

from ..modes import ALL_MODES, ModeKeys
from .phases import Words

NEVER = 1 << 62  # a step number never reached (`meter_at`, `stop_check_at`)
_MODE_SLOTS = max(ALL_MODES) + 1  # per-mode tables are indexed by the mode's number


class StepCounters:
    """Per-step state of a hook (see `HookBase` for what each means to the driver):

    - `step`: the open step (a `StepState`, `idle` when nothing is due at it) or None;
    - `global_step`: the number the next step gets; `mode`: the mode of the open or last
      step; `begun[mode]`: steps of `mode` opened so far; `next_due[mode]`: the mode step
      at which a collection may next be due (None: never);
    - `closed`; `failsafe`, `profiler_failsafe` (the hook's); `notify` (the plugin's
      `notify_every_step`); `detailed` (the windowed profilers, or None); `meter_at` (the
      global step at which the cost meter next times a step);
    - the step timeline: `now` (the clock's reading function) and `log_append` (the phase
      log's), both None without a timeline, `timing` (the open step's timing runs) and
      `last_end` (the clock token at which the previous step's work ended);
    - stop decisions: `train_ends` (TRAIN steps ended) and `stop_check_at` (the count at
      which the hook decides next).

    A compiled replacement has the same fields with the same meaning and types."""

    __slots__ = (
        "step", "idle", "global_step", "mode", "begun", "next_due", "closed", "failsafe", "profiler_failsafe",
        "notify", "detailed", "meter_at", "now", "log_append", "timing", "last_end", "train_ends", "stop_check_at",
    )

    def __init__(self, failsafe: Any, profiler_failsafe: Any, notify: bool) -> None:
        self.step: Any = None
        self.idle: Any = None  # set by the hook (an IdleStep over these counters)
        self.global_step = 0
        self.mode = ModeKeys.TRAIN
        self.begun: Any = [0] * _MODE_SLOTS
        self.next_due: Any = [0] * _MODE_SLOTS
        self.closed = False
        self.failsafe = failsafe
        self.profiler_failsafe = profiler_failsafe
        self.notify = notify
        self.detailed: Any = None
        self.meter_at = NEVER
        self.now: Any = None
        self.log_append: Any = None
        self.timing = False
        self.last_end: Any = None
        self.train_ends = 0
        self.stop_check_at = 1

    def log_words(self) -> Words:
        """New words for a flat phase log (a compiled replacement gives words it can write
        without making an object per word)."""
        return Words()


__all__ = ["NEVER", "StepCounters"]
