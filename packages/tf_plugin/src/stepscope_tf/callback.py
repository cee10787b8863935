"""The Keras 3 callback: maps fit/evaluate/predict batches to stepscope steps of the
matching mode and hands everything else to `Hook`, through its public step driver.

Step timeline: Keras runs a whole step (fetching the batch from a tf.data iterator,
forward, backward, optimizer update) in one compiled call between `on_*_batch_begin` and
`on_*_batch_end`, which the callback API cannot split; that call is the "compute" phase.
The time between a batch's end and the next one's begin (the Python loop, callbacks, and
data fetched outside the compiled step) is the next step's "data" phase. For a finer split,
use `Hook` in a custom loop with `hook.phase("forward")` etc."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import keras

from stepscope.capture import routine_batches
from stepscope.capture.hook_options import HookOptions
from stepscope.capture.phases import COMPUTE, PHASE_CODES
from stepscope.config import CollectionName
from stepscope.modes import ModeKeys

from .hook import Hook

# Which compiled function of the model runs each mode; see `_attach`.
_FUNCTIONS = {ModeKeys.TRAIN: "train", ModeKeys.EVAL: "test", ModeKeys.PREDICT: "predict"}
_COMPUTE = PHASE_CODES[COMPUTE]
_TRAIN, _EVAL = ModeKeys.TRAIN, ModeKeys.EVAL


class StepscopeCallback(keras.callbacks.Callback):
    """`model.fit(..., callbacks=[StepscopeCallback(out_dir)])`; also for `evaluate` and
    `predict` (validation inside `fit` is EVAL steps). Keep one instance per model and job:
    the global step continues across calls. Call `close()` at the end (or use it as a
    context manager); otherwise it closes at interpreter exit.

    Defining batch-end methods costs the training loop nothing extra with the TensorFlow
    backend: Keras 3 dispatches batch ends on a worker thread only for backends marked
    thread-safe (`keras.src.backend.IS_THREAD_SAFE`), which TensorFlow is not, so they run
    in the loop whether a callback defines them or not."""

    def __init__(self, out_dir: Any = None, *args: Any, **kwargs: Any):
        """The options of `stepscope.HookOptions` (by position or name), or one HookOptions."""
        super().__init__()
        self.hook = Hook(HookOptions.of(out_dir, *args, **kwargs))
        # The steps between tensor steps (only losses and metrics due, every step under the
        # capture defaults, or nothing due), run in one call each for begin and end:
        # capture/routine_batches.py.
        self._routine = routine_batches.make_batches(self.hook)
        self._stop = self.hook._stop  # (its `requested`: read after every batch)
        self._runs = 0  # nesting depth of fit/evaluate/predict (evaluate runs inside fit)

    @classmethod
    def from_json(cls, path: str | None = None, **overrides: Any) -> StepscopeCallback:
        """A callback configured by smdebug's hook JSON (`debughookconfig.json`); without
        `path`, the file named by STEPSCOPE_HOOK_CONFIG. Keyword arguments override it."""
        return cls(HookOptions.from_json(path, **overrides))

    # --- run boundaries -----------------------------------------------------------------

    def _attach(self, mode: ModeKeys) -> None:
        self._runs += 1
        routine_batches.disarm(self._routine)  # (what is installed decides what a routine step is)
        if self.hook.attach(self.model, getattr(self.model, "optimizer", None)):
            # Keras compiled this run's step before calling us: compile it again with the
            # captures in; the other modes' steps are compiled again when next needed.
            for other, function in _FUNCTIONS.items():
                if other == mode:
                    getattr(self.model, f"make_{function}_function")(force=True)
                elif not (other == ModeKeys.TRAIN and self._runs > 1):  # never under a running fit
                    setattr(self.model, f"{function}_function", None)

    def _run_begin(self, mode: ModeKeys) -> None:
        self.hook.failsafe.call(self._attach, mode)

    def _run_end(self) -> None:
        self._runs = max(self._runs - 1, 0)
        if self._runs == 0:
            self.hook.flush()

    def on_train_begin(self, logs: dict[str, Any] | None = None) -> None:
        self._run_begin(ModeKeys.TRAIN)

    def on_test_begin(self, logs: dict[str, Any] | None = None) -> None:
        self._run_begin(ModeKeys.EVAL)

    def on_predict_begin(self, logs: dict[str, Any] | None = None) -> None:
        self._run_begin(ModeKeys.PREDICT)

    def on_train_end(self, logs: dict[str, Any] | None = None) -> None:
        self._run_end()

    def on_test_end(self, logs: dict[str, Any] | None = None) -> None:
        self._run_end()

    def on_predict_end(self, logs: dict[str, Any] | None = None) -> None:
        self._run_end()

    # --- steps --------------------------------------------------------------------------

    def _batch_begin(self, mode: ModeKeys) -> None:
        # The batch is here: data ends, compute begins. (`begin_step(mode, phase=COMPUTE)`
        # with its arguments known good: this runs after every framework step, on cold caches.)
        self.hook._open_step(mode, None, _COMPUTE)
        routine_batches.arm(self._routine, self.hook, mode)  # (the next steps like this one, when routine)

    def on_train_batch_begin(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        try:  # (nothing escapes into training: a failure turns the hook off, as FailSafe does)
            if self._routine.begin(_TRAIN):
                return
        except Exception as exc:
            self.hook.failsafe.fail(exc)
        self._batch_begin(_TRAIN)

    def on_test_batch_begin(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        try:
            if self._routine.begin(_EVAL):
                return
        except Exception as exc:
            self.hook.failsafe.fail(exc)
        self._batch_begin(_EVAL)

    def on_predict_batch_begin(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        self._batch_begin(ModeKeys.PREDICT)

    def _batch_end(self, logs: dict[str, Any] | None) -> None:
        # (The step driver's path: a step the routine batches did not end.)
        hook = self.hook
        hook.finish_step_timing()
        step = hook.current_step
        hook.save_logs(logs)
        if step is not None:
            routine_batches.learn_logs(self._routine, step, *hook._log_plans)
        hook.end_step(raise_on_stop=False)

    def on_train_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        # (One frame for the routine step: this runs right after the framework's step.)
        try:
            done = self._routine.end(logs)
        except Exception as exc:
            self.hook.failsafe.fail(exc)
            done = False
        if not done:
            self._batch_end(logs)
        if self._stop.requested:
            self.model.stop_training = True

    # The same for evaluation batches (validation inside fit): the step's mode was set at its begin.
    on_test_batch_end = on_train_batch_end

    def on_predict_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        self.hook.finish_step_timing()
        self.hook.end_step(raise_on_stop=False)  # predict logs hold the batch's outputs, not scalars

    # --- end ----------------------------------------------------------------------------

    def save_tensor(self, name: str, value: Any, collections: Iterable[str] | str = CollectionName.DEFAULT) -> None:
        """Save a custom tensor at the current step (e.g. from another callback)."""
        self.hook.save_tensor(name, value, collections)

    def save_scalar(self, name: str, value: Any) -> None:
        """Save a number at the current step (metrics collection)."""
        self.hook.save_scalar(name, value)

    def save_loss(self, value: Any, name: str = "loss") -> None:
        """Save a loss value at the current step (losses collection)."""
        self.hook.save_loss(value, name)

    def close(self) -> None:
        self.hook.close()

    def __enter__(self) -> StepscopeCallback:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
