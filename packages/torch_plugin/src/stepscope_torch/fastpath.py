"""The torch Hook's per-step state, and its compiled hot path where it is built.

On a step where nothing is due, the hook counts the step and, with the step timeline,
appends four clock readings to the phase log. In Python that is four calls into the hook
(the driven forward's two callbacks, the optimizer's pre- and post-hook), each a frame and
a few dozen attribute reads: about twice what two calls of an empty `nn.Module` cost
(bench/bench_torch_hook.py). The C extension `_fastpath` has `Counters`, the same state as
`TorchCounters` below in one C struct, whose `forward` / `optimizer_pre` / `optimizer_post`
do the routine case of those entry points themselves and hand every other case to the
hook's Python method, unchanged: the results are the same either way (tested).

Scalar steps. Under the capture defaults the losses and metrics are due at every step, so
every step saves, and in Python such a step cost about 25 calls into the hook (about 7 % of
a small model's step, bench/callgrind_torch_hook.py --default-config). Once a step that
saves only them opens on the Python path and nothing else is to be done at such steps
(`compile_scalar_steps` says what that takes: the registered losses' plans known, no
activation to save, one optimizer whose state saves nothing, ...), the counters run the
rest of that run of steps themselves: each step is a real `StepState` (anything Python
saves into it goes in as usual), the registered loss modules' forwards (compiled too,
`loss_forward`) read the loss with `.item()` as `ModelTensors._record_scalar` does, and an
ended step goes to a list that `HeldSteps` takes, in order with what the Python path hands
it. Anything else at such a step hands it back (`Hook._adopt_step`), and Python goes on
with it as if it had opened it. A `register_*` call hands the open one back and ends the
run (`recompile`): the next step that opens in Python decides again.

The extension is optional: a build without a C compiler, or a free-threaded Python, has
the Python path only; `STEPSCOPE_PURE_PYTHON=1` chooses it where the extension is built."""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
import torch

from stepscope.capture.held_steps import MAX_BYTES, MAX_VALUES
from stepscope.capture.phases import (
    EVENT_CODES,
    FORWARD_BEGIN,
    FORWARD_END,
    OPTIMIZER_BEGIN,
    STEP_BEGIN_EVENT_RECORD,
    STEP_END_RECORD,
)
from stepscope.capture.step_counters import StepCounters
from stepscope.capture.step_driver import StepState
from stepscope.compiled import PURE_PYTHON_ENV as PURE_PYTHON_ENV  # (the switch, where callers found it)
from stepscope.compiled import load_extension
from stepscope.modes import ModeKeys

from .model_tensors import PLAIN_SCALARS

logger = logging.getLogger("stepscope")

MISSES, BACK_OFF = 8, 512  # compile_scalar_steps: runs handed back at once in a row, then steps without one
# The phase-log vocabulary the compiled code writes (stepscope.capture.phases), given to it rather
# than repeated in C.
_CODES = {
    "forward_begin": EVENT_CODES[FORWARD_BEGIN],
    "forward_end": EVENT_CODES[FORWARD_END],
    "optimizer_begin": EVENT_CODES[OPTIMIZER_BEGIN],
    "step_end": STEP_END_RECORD,
    "begin_event": STEP_BEGIN_EVENT_RECORD,
}


class TorchCounters(StepCounters):
    """The hook's per-step state (stepscope.capture.step_counters) and the torch plugin's own:
    `explicit_mode` (the mode `set_mode` gave, else None: `model.training` says),
    `drives_optimizer` (a registered optimizer's step ends TRAIN steps) and `train_at`
    (the global step of the open TRAIN step while it still takes forwards, its optimizer
    not stepped yet; compared with the open step, so a step ended any other way, by
    end_step, set_mode or load_state_dict, is no longer taken for it)."""

    __slots__ = ("explicit_mode", "drives_optimizer", "train_at")

    def __init__(self, failsafe: Any, profiler_failsafe: Any, notify: bool) -> None:
        super().__init__(failsafe, profiler_failsafe, notify)
        self.explicit_mode: ModeKeys | None = None
        self.drives_optimizer = False
        self.train_at = -1


def compiled() -> Any:
    """The `_fastpath` extension module, or None (not built, or $STEPSCOPE_PURE_PYTHON)."""
    return load_extension(__package__, "_fastpath")


def make_counters(failsafe: Any, profiler_failsafe: Any, notify: bool) -> TorchCounters:
    """The compiled counters where the extension is built (and the fail-safes are ones it
    can read), else `TorchCounters`."""
    module = compiled()
    if module is not None:
        try:
            # (The same fields as TorchCounters, not a subclass: typed as one.)
            return module.Counters(failsafe, profiler_failsafe, notify, ModeKeys.TRAIN, ModeKeys.EVAL, _CODES)
        except TypeError as exc:
            logger.warning("stepscope: the compiled hot path cannot run here (%s); using the Python path", exc)
    return TorchCounters(failsafe, profiler_failsafe, notify)


def attach(hook: Any) -> Any:
    """The compiled counters of `hook`, given the hook's Python methods for what they do
    not do themselves; None on the Python path. Their `forward(model, original)` makes the
    driven class's forward, `optimizer_pre` / `optimizer_post` are the optimizer's step
    hooks; `routine` and `handed_over` count the calls done in C and those given over."""
    counters = hook._counters
    if isinstance(counters, TorchCounters):
        return None
    counters.attach(hook._forward_begins, hook._forward_ends, hook._on_optimizer_pre, hook._on_optimizer_post, hook._meter_block)
    # What scalar steps are made of; a held step holds numpy scalars of these types and
    # numpy arrays (save_scalar, a functional loss's save_loss), as HeldSteps holds them.
    scalar_types = tuple(set(PLAIN_SCALARS.values()))
    counters.setup_scalar_steps(StepState, hook._adopt_step, dict(PLAIN_SCALARS), torch.strided, scalar_types, np.ndarray, MAX_VALUES, MAX_BYTES)
    return counters


def compile_scalar_steps(hook: Any, step: StepState) -> None:
    """At a step that saves only losses and metrics, opened on the Python path: when the
    hook's set-up leaves nothing else to do at such steps, the compiled counters run it
    from here on, and the rest of its run (the steps of its mode where the same
    collections alone are due: StepDriver._due_at's run). Otherwise nothing changes."""
    c = hook._counters
    run = hook.__dict__.get("_due_runs", {}).get(step.mode)
    held = hook._runtime.held
    if run is None or run.names is not step.due_names or not run.first <= step.mode_step < run.until or held is None:
        return
    # A run armed at each step that the compiled path then hands back at once (each step
    # saves something it does not hold: a GPU loss, a large value) costs more than the
    # Python path alone: after MISSES such runs in a row, none is armed for BACK_OFF steps.
    opened, misses, resume = hook.__dict__.get("_scalar_tries", (-1, 0, 0))
    if opened >= 0:
        misses = misses + 1 if c.scalar_steps - opened <= 1 else 0
    if step.global_step < resume or misses >= MISSES:
        hook._scalar_tries = (-1, 0, step.global_step + BACK_OFF) if misses >= MISSES else (-1, misses, resume)
        return
    # What the Python path would do at such a step besides counting, timing and reading
    # the registered losses: watched activations, losses read through torch hooks, a
    # GradScaler's metrics, several optimizers' phases, a windowed profiler, per-step
    # notices to a plugin, optimizer state or parameters in the scalar collections.
    optimizers = hook._optimizers
    if (
        c.notify or c.detailed is not None or hook._hooked_losses or hook._scaler is not None or len(optimizers) > 1
        or (c.drives_optimizer and not (len(hook._optimizer_handles) == 1 and hook._ending and optimizers))
        or not hook._io_collections.isdisjoint(step.due_names) or not hook._only_scalars_due() or not hook._states_hold_no_scalars()
    ):  # fmt: skip
        return
    armed = []
    for name, _module in hook._losses:
        forward, known = hook._loss_forwards.get(name), hook._loss_plans.get(name)
        if forward is None or known is None or known[0] is not step.due_names or known[2].reductions:
            return  # (a loss saved once on the Python path has its plan: the next step arms)
        armed.append((forward, known))
    for forward, (_names, nargs, plan) in armed:
        forward.arm(plan.name, plan.save_raw, plan.save_shape, nargs)
    held.attach_source(c)
    hook._scalar_tries = (c.scalar_steps, misses, resume)
    until = run.until if run.until == float("inf") else int(run.until)
    c.arm_scalar_run(step, run.first, until, optimizers[0] if optimizers else None, hook._release_held, held.max_steps, held.max_s)
    hook._losses_armed = False  # (the compiled loss forwards save at this step now)


def recompile(hook: Any) -> None:
    """The hook's set-up changed (a registration): no step runs compiled as a scalar step
    until one opens on the Python path again and `compile_scalar_steps` decides anew."""
    fast = hook._fast
    if fast is not None:
        fast.disarm_scalar_run()
