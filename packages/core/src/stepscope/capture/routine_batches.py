"""The routine batches of a framework callback: a step where only losses and metrics (and
the default collection) are due, every step under the capture defaults, and a step where
nothing is due (most steps of a job that saves every N steps), opened and ended in one
call each instead of through the step driver: `_batches.Batches` in C where the extension
is built, else `PythonBatches`, the same methods in Python.

Why: Keras runs a whole step in one compiled call and then calls the callback's batch
hooks; by then each object the hook touches is a cache miss. Through the step driver such
a step is about 50 Python calls (opening it, timing it, saving the logs, handing it to the
held steps) over a few dozen objects: about 6 us on warm caches but 55-105 us inside `fit`
(bench/bench_keras_callback.py, "hooks us"), 1.5-3 % of a small model's step, above the
default configuration's 1 % goal. Here a step reads and writes the hook's step counters,
a new `StepState`, the phase log's words and a list of ended steps that `HeldSteps` takes
(its source, as stepscope_torch's compiled scalar steps are), and nothing else. Measured
side by side in one process (docs/keras.md): 18-26 us a step in C, 22-32 us in Python.

A `Batches` runs only what it was armed for: the callback calls `arm` after a batch began
on the step driver's path, and it arms the rest of that run of steps (or the steps where
nothing is due) when the hook's set-up leaves nothing else to do at them
(`hook.routine_batches_allowed(step)`: the plugin reads nothing and arms no capture there;
no profiling window). Which steps are due it reads from the step driver's own state (the
run `_due_at` found, the counters' next due step), so it never decides that itself. `begin` and `end` check
their conditions before they change anything and return False when one fails; the
callback then takes the step driver's path, which finds the state it would have found
without this module. A step's logs are saved here when each is a Python float whose name
the driver's path planned before (`learn_logs`), and the step is ended here when the logs
are all it holds (anything else saved into it goes through the driver). The results are
the same either way (packages/tf_plugin/tests/test_routine_batches.py)."""

from __future__ import annotations

import logging
import time
from collections import deque
from typing import Any

from ..compiled import load_extension
from ..modes import ALL_MODES, ModeKeys
from .held_steps import MAX_VALUES
from .phases import COMPUTE, PHASE_CODES, PHASE_ENTER_RECORD, STEP_BEGIN_RECORD, STEP_END_RECORD
from .step_driver import StepState

logger = logging.getLogger("stepscope")

# The records a routine step writes to the phase log, and its one phase: a callback sees the
# framework's whole step as one call, its "compute" phase (the wait before it is "data").
_CODES = (STEP_BEGIN_RECORD, PHASE_ENTER_RECORD, STEP_END_RECORD, PHASE_CODES[COMPUTE])
_COMPUTE = _CODES[3]
_MODE_SLOTS = max(ALL_MODES) + 1
_monotonic = time.monotonic
_perf_counter = time.perf_counter


class PythonBatches:
    """The routine batches in Python: `_batches.Batches`' methods, for where the extension is
    not built (or $STEPSCOPE_PURE_PYTHON). About 4 us a step slower than C inside `fit`,
    and 2.5x faster than the step driver (module docstring)."""

    __slots__ = ("_counters", "_failsafe", "_profiler_failsafe", "_timeline_failed", "_meter_block", "_release", "_max_values",
                 "_runs", "_idle", "_switches", "_open", "_open_idle", "_held", "_first_held", "_hold_steps", "steps")  # fmt: skip

    def __init__(self, counters: Any, failsafe: Any, profiler_failsafe: Any, timeline_failed: Any, meter_block: Any, release: Any,
                 max_values: int = MAX_VALUES) -> None:  # fmt: skip
        self._counters = counters
        self._failsafe, self._profiler_failsafe = failsafe, profiler_failsafe
        self._timeline_failed, self._meter_block, self._release = timeline_failed, meter_block, release
        self._max_values = max_values
        # Per mode (indexed by its number): the armed run's (first, until, due, names, plans),
        # plans being {log name: whether its value is saved as it is (else not at all)}; and
        # whether its steps where nothing is due run here.
        self._runs: list[tuple[int, float, tuple[Any, ...], frozenset[str], dict[str, bool]] | None] = [None] * _MODE_SLOTS
        self._idle = [False] * _MODE_SLOTS
        self._switches: tuple[Any, ...] = ()
        self._open: Any = None  # the step begin() opened, until end() ends it
        self._open_idle = False
        self._held: deque[tuple[int, ModeKeys, int, dict[str, Any], dict[str, Any]]] = deque()
        self._first_held = 0.0
        self._hold_steps = 100
        self.steps = 0  # steps opened here

    # --- arming ---------------------------------------------------------------------------

    def set_run(self, mode: ModeKeys, first: int, until: float, due: tuple[Any, ...], names: frozenset[str], plans: dict[str, bool]) -> None:
        self._runs[mode] = (first, until, due, names, plans)

    def drop_run(self, mode: ModeKeys) -> None:
        self._runs[mode] = None

    def set_idle(self, mode: ModeKeys, allowed: bool) -> None:
        self._idle[mode] = bool(allowed)

    def run_plans(self, mode: ModeKeys, names: frozenset[str]) -> dict[str, bool] | None:
        run = self._runs[mode]
        return run[4] if run is not None and run[3] is names else None

    def set_switches(self, switches: tuple[Any, ...]) -> None:
        self._switches = switches

    def set_hold_steps(self, n: int) -> None:
        self._hold_steps = max(int(n), 1)

    # --- the batch hooks -----------------------------------------------------------------

    def begin(self, mode: ModeKeys) -> bool:
        """Open the next step of `mode` when it is routine (True); False: nothing changed."""
        c = self._counters
        if c.step is not None:
            return False
        run = self._runs[mode]
        begun = c.begun
        mode_step = begun[mode]
        global_step = c.global_step
        # A step of the armed run (due: a new step), else, where allowed, one before the next
        # due step (nothing due: the counters' shared idle step, as StepDriver._open_step opens it).
        idle = run is None or not run[0] <= mode_step < run[1]
        if idle:
            next_due = c.next_due[mode]
            if not self._idle[mode] or (next_due is not None and mode_step >= next_due):
                return False
        if c.closed or c.detailed is not None or not self._failsafe.enabled or c.idle is None:
            return False
        for switch in self._switches:
            if switch.on:  # a capture still on after a step that saved tensors: the hook switches it off
                return False
        # The cost meter times the first step of each block of steps (StepDriver._open_step).
        started = _perf_counter() if global_step >= c.meter_at else None
        now = c.now
        if now is not None and self._profiler_failsafe.enabled:
            try:
                token = now()
                last_end = c.last_end
                # The step's begin and its "compute" phase in one call (a flat log's records are words).
                c.log_append((STEP_BEGIN_RECORD, global_step, mode, token if last_end is None else last_end, PHASE_ENTER_RECORD, _COMPUTE, token))
                c.timing = True
            except Exception as exc:
                self._timeline_failed(exc)
        c.mode = mode
        begun[mode] = mode_step + 1
        c.global_step = global_step + 1
        if idle:
            c.step = self._open = c.idle
        else:
            c.next_due[mode] = mode_step + 1  # (StepDriver._due_at, in a run)
            c.step = self._open = StepState(global_step, mode, mode_step, run[2], run[3])  # type: ignore[index]
        self._open_idle = idle
        self.steps += 1
        if started is not None:
            self._meter_block(global_step, started, _perf_counter() - started, True)
        return True

    def end(self, logs: Any) -> bool:
        """End the step `begin` opened, saving `logs` (the framework's batch logs: Python
        floats) into it, when that is all there is to do (True); False: nothing changed."""
        c = self._counters
        step = self._open
        if step is None:
            return False
        if c.step is not step:
            self._open = None
            return False
        if self._open_idle:
            # Nothing is due: the logs are not saved (HookBase.save_logs), the timeline ends.
            if not self._failsafe.enabled:
                return False
            if c.timing:
                self._finish_timing()
            c.step = self._open = None
            return True
        run = self._runs[step.mode]
        tensors = step.tensors
        if run is None or step.due_names is not run[3] or tensors or step.shapes or not self._failsafe.enabled:
            return False  # (something was saved into it besides the logs: the driver hands it over)
        plans = run[4]
        if logs:
            if logs.__class__ is not dict or len(logs) > self._max_values:
                return False
            for name, value in logs.items():
                if value.__class__ is not float or name not in plans:
                    return False  # (the driver's path plans a new name; the next step finds it here)
        if c.timing:
            self._finish_timing()
        if logs:
            for name, value in logs.items():
                if plans[name]:
                    tensors[name] = value
        c.step = self._open = None
        if tensors:
            held = self._held
            if not held:
                self._first_held = _monotonic()
            held.append((step.global_step, step.mode, step.mode_step, tensors, step.shapes))
            # By count here; by age (HOLD_S since the first) on HeldSteps' own thread, which
            # asks held_age(): no clock reading at every step.
            if len(held) >= self._hold_steps:
                self._release()
        return True

    def _finish_timing(self) -> None:
        c = self._counters
        try:
            token = c.now()
            c.log_append((STEP_END_RECORD, token))
            c.last_end = token
            c.timing = False
        except Exception as exc:
            self._timeline_failed(exc)

    # --- HeldSteps' source ----------------------------------------------------------------

    def take_held(self) -> list[tuple[int, ModeKeys, int, dict[str, Any], dict[str, Any]]]:
        """The steps ended here since the last take, oldest first (any thread: a deque's
        append and popleft are atomic, so a step `end` appends meanwhile stays for the next)."""
        held, out = self._held, []
        try:
            while True:
                out.append(held.popleft())
        except IndexError:
            return out

    def held_age(self) -> float | None:
        """Seconds since the oldest step not yet taken ended, None when none waits."""
        return _monotonic() - self._first_held if self._held else None


def make_batches(hook: Any) -> Any:
    """The routine batches of `hook`: `_batches.Batches` where the extension is built (and
    can read the hook's counters), else `PythonBatches`."""
    parts = (hook._counters, hook.failsafe, hook.profiler_failsafe, hook._timeline_failed, hook._meter_block, hook._release_held)
    module = load_extension(__package__, "_batches")
    if module is not None:
        try:  # (C is given the step type and the records' codes; Python uses them directly)
            return module.Batches(*parts, StepState, _CODES, MAX_VALUES)
        except TypeError as exc:
            logger.warning("stepscope: the compiled routine batches cannot run here (%s); using the Python path", exc)
    return PythonBatches(*parts)


def arm(batches: Any, hook: Any, mode: ModeKeys) -> None:
    """At a batch the step driver opened: when it is a routine step of a run of them, the
    rest of that run runs in `batches` from the next batch on; when nothing is due at it,
    the next steps where nothing is due do too. Each as far as the hook allows
    (`hook.routine_batches_allowed(step)`); otherwise `mode`'s run or idle steps are
    disarmed."""
    counters = hook._counters
    step = counters.step
    if step is None or step.mode is not mode:
        return
    switches = hook.routine_batches_allowed(step)
    if switches is not None:
        batches.set_switches(switches)
    if step is counters.idle:
        batches.set_idle(mode, switches is not None)
        return
    run = hook.__dict__.get("_due_runs", {}).get(mode)
    held = hook._runtime.held
    if switches is None or run is None or run.names is not step.due_names or not run.first <= step.mode_step < run.until or held is None:
        batches.drop_run(mode)
        return
    plans = batches.run_plans(mode, run.names)
    batches.set_run(mode, run.first, run.until, run.due, run.names, plans if plans is not None else {})
    if held._source is not batches:
        held.attach_source(batches)
    batches.set_hold_steps(held.max_steps)


def disarm(batches: Any) -> None:
    """Nothing is armed (the hook's set-up changed: the next batch decides anew)."""
    for mode in ModeKeys:
        batches.drop_run(mode)
        batches.set_idle(mode, False)


def learn_logs(batches: Any, step: StepState, due: frozenset[str] | None, plans: dict[str, tuple[Any, bool]]) -> None:
    """After the step driver's path saved `step`'s logs: the log names it planned for the
    due names `due` (`plans`: name -> (plan or None, whether the plan saves the value as it
    is)) are saved by `end` from now on, those saved as they are or not at all."""
    known = batches.run_plans(step.mode, step.due_names)
    if known is None or due is not step.due_names or len(plans) == len(known):
        return
    for name, (plan, raw_only) in plans.items():
        if plan is None:
            known[name] = False
        elif raw_only and plan.name == name:
            known[name] = True


__all__ = ["PythonBatches", "arm", "disarm", "learn_logs", "make_batches"]
