"""The torch Hook's per-step state, and its compiled hot path where it is built.

On a step where nothing is due, the hook counts the step and, with the step timeline,
appends four clock readings to the phase log. In Python that is four calls into the hook
(the driven forward's two callbacks, the optimizer's pre- and post-hook), each a frame and
a few dozen attribute reads: about twice what two calls of an empty `nn.Module` cost
(bench/bench_torch_hook.py). The C extension `_fastpath` has `Counters`, the same state as
`TorchCounters` below in one C struct, whose `forward` / `optimizer_pre` / `optimizer_post`
do the routine case of those entry points themselves and hand every other case to the
hook's Python method, unchanged: the results are the same either way (tested).

The extension is optional: a build without a C compiler, or a free-threaded Python, has
the Python path only; `STEPSCOPE_PURE_PYTHON=1` chooses it where the extension is built."""

from __future__ import annotations

import logging
import os
from typing import Any

from stepscope.capture.phases import (
    EVENT_CODES,
    FORWARD_BEGIN,
    FORWARD_END,
    OPTIMIZER_BEGIN,
    STEP_BEGIN_EVENT_RECORD,
    STEP_END_RECORD,
)
from stepscope.capture.step_counters import StepCounters
from stepscope.modes import ModeKeys

logger = logging.getLogger("stepscope")

PURE_PYTHON_ENV = "STEPSCOPE_PURE_PYTHON"
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
    if os.environ.get(PURE_PYTHON_ENV, "").strip() not in ("", "0"):
        return None
    try:
        from . import _fastpath
    except ImportError:
        return None
    return _fastpath


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
    return counters
