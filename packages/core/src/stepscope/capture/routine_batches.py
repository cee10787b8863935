"""The routine batches of a framework callback: a step where only losses and metrics (and
the default collection) are due, every step under the capture defaults, opened and ended
in one C call each (`_batches.Batches`) instead of through the step driver.

Why: Keras runs a whole step in one compiled call and then calls the callback's batch
hooks; by then each object the hook touches is a cache miss. Through the step driver such
a step is about 50 Python calls (opening it, timing it, saving the logs, handing it to the
held steps): about 6 us on warm caches but 23-31 us after a 3-4 ms step
(bench/bench_keras_callback.py, "hooks us"), close to the default configuration's 1 %
of a small model's step. `Batches` does the same work over a few objects, the hook's step
counters and a new `StepState` read and written at their __slots__ offsets, the phase
log's words and a list of ended steps that `HeldSteps` takes (its source, as
stepscope_torch's compiled scalar steps are): 18-21 us in the same runs. The same code in
Python measured 27-28 us, no better than the driver (the frames are not what costs after
the framework's step, the cache misses are), so without the extension (`NoBatches`) every
batch takes the driver's path. docs/tensorflow.md has the figures.

A `Batches` runs only what it was armed for: the callback calls `arm` after a batch began
on the step driver's path, and it arms the rest of that run of steps when the hook's
set-up leaves nothing else to do at them (`hook.routine_batches_allowed(step)`: the plugin
reads nothing and arms no capture there; no profiling window). `begin` and `end` check
their conditions before they change anything and return False when one fails; the
callback then takes the step driver's path, which finds the state it would have found
without this module. A step's logs are saved here when each is a Python float whose name
the driver's path planned before (`learn_logs`), and the step is ended here when the logs
are all it holds (anything else saved into it goes through the driver). The results are
the same either way (packages/tf_plugin/tests/test_routine_batches.py)."""

from __future__ import annotations

import logging
from typing import Any

from ..compiled import load_extension
from ..modes import ModeKeys
from .held_steps import MAX_VALUES
from .phases import COMPUTE, PHASE_CODES, PHASE_ENTER_RECORD, STEP_BEGIN_RECORD, STEP_END_RECORD
from .step_driver import StepState

logger = logging.getLogger("stepscope")

# The records a routine step writes to the phase log, and its one phase: a callback sees the
# framework's whole step as one call, its "compute" phase (the wait before it is "data").
_CODES = (STEP_BEGIN_RECORD, PHASE_ENTER_RECORD, STEP_END_RECORD, PHASE_CODES[COMPUTE])


class NoBatches:
    """Where the extension is not built (or $STEPSCOPE_PURE_PYTHON): every batch takes the
    step driver's path. (The same routine steps in Python were no faster than the driver:
    the frames are not what costs, the cache misses are; see the module's docstring.)"""

    steps = 0

    def begin(self, mode: ModeKeys) -> bool:
        return False

    def end(self, logs: Any) -> bool:
        return False

    def drop_run(self, mode: ModeKeys) -> None:
        pass

    def run_plans(self, mode: ModeKeys, names: frozenset[str]) -> dict[str, bool] | None:
        return None


def make_batches(hook: Any) -> Any:
    """The routine batches of `hook`: `_batches.Batches` where the extension is built (and
    can read the hook's counters), else `NoBatches`."""
    args = (hook._counters, hook.failsafe, hook.profiler_failsafe, hook._timeline_failed, hook._meter_block, hook._release_held, StepState, _CODES, MAX_VALUES)
    module = load_extension(__package__, "_batches")
    if module is not None:
        try:
            return module.Batches(*args)
        except TypeError as exc:
            logger.warning("stepscope: the compiled routine batches cannot run here (%s); using the step driver", exc)
    return NoBatches()


def arm(batches: Any, hook: Any, mode: ModeKeys) -> None:
    """At a batch the step driver opened: when it is a routine step of a run of them, the
    rest of that run runs in `batches` from the next batch on. Otherwise `mode`'s run is
    disarmed."""
    step = hook._counters.step
    run = hook.__dict__.get("_due_runs", {}).get(mode)
    if isinstance(batches, NoBatches):
        return
    held = hook._runtime.held
    switches = None
    if step is not None and step.mode is mode and run is not None and run.names is step.due_names and run.first <= step.mode_step < run.until and held is not None:
        switches = hook.routine_batches_allowed(step)
    if switches is None:
        batches.drop_run(mode)
        return
    plans = batches.run_plans(mode, run.names)
    batches.set_run(mode, run.first, run.until, run.due, run.names, plans if plans is not None else {})
    batches.set_switches(switches)
    if held._source is not batches:
        held.attach_source(batches)
    batches.set_hold_steps(held.max_steps)


def disarm(batches: Any) -> None:
    """No run is armed (the hook's set-up changed: the next batch decides anew)."""
    for mode in ModeKeys:
        batches.drop_run(mode)


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


__all__ = ["NoBatches", "arm", "disarm", "learn_logs", "make_batches"]
