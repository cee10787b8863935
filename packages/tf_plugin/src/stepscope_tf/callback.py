"""The Keras 3 callback: maps fit/evaluate/predict batches to stepscope steps of the
matching mode and hands everything else to `Hook`."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import keras

from stepscope.config import Collection, ProfilerConfig, ReductionConfig, SaveConfig
from stepscope.hook_core import HookCore
from stepscope.modes import ModeKeys

from .hook import Hook

# Which compiled function of the model runs each mode; see `_attach`.
_FUNCTIONS = {ModeKeys.TRAIN: "train", ModeKeys.EVAL: "test", ModeKeys.PREDICT: "predict"}


class StepscopeCallback(keras.callbacks.Callback):
    """`model.fit(..., callbacks=[StepscopeCallback(out_dir)])`; also for `evaluate` and
    `predict` (validation inside `fit` is EVAL steps). Keep one instance per model and job:
    the global step continues across calls. Call `close()` at the end (or use it as a
    context manager); otherwise it closes at interpreter exit.

    Defining batch-end methods costs the training loop nothing extra with the TensorFlow
    backend: Keras 3 dispatches batch ends on a worker thread only for backends marked
    thread-safe (`keras.src.backend.IS_THREAD_SAFE`), which TensorFlow is not, so they run
    in the loop whether a callback defines them or not."""

    def __init__(
        self,
        out_dir: str,
        save_config: SaveConfig | None = None,
        reduction_config: ReductionConfig | None = None,
        include_collections: Iterable[str] | None = None,
        include_regex: Iterable[str] | str | None = None,
        save_all: bool = False,
        include_workers: str = "one",
        profiler_config: ProfilerConfig | None = None,
        collections: Iterable[Collection] = (),
    ):
        super().__init__()
        self.hook = Hook(
            out_dir,
            save_config=save_config,
            reduction_config=reduction_config,
            include_collections=include_collections,
            include_regex=include_regex,
            save_all=save_all,
            include_workers=include_workers,
            profiler_config=profiler_config,
            collections=collections,
        )
        self._runs = 0  # nesting depth of fit/evaluate/predict (evaluate runs inside fit)

    @classmethod
    def from_json(cls, path: str | None = None, **overrides: Any) -> StepscopeCallback:
        """A callback configured by smdebug's hook JSON (`debughookconfig.json`); without
        `path`, the file named by STEPSCOPE_HOOK_CONFIG. Keyword arguments override it."""
        options = HookCore.options_from_json(path)
        options.update(overrides)
        return cls(**options)

    # --- run boundaries -----------------------------------------------------------------

    def _attach(self, mode: ModeKeys) -> None:
        self._runs += 1
        if self.hook.attach(self.model, getattr(self.model, "optimizer", None)):
            # Keras compiled this run's step before calling us: compile it again with the
            # captures in; the other modes' steps are compiled again when next needed.
            for other, function in _FUNCTIONS.items():
                if other == mode:
                    getattr(self.model, f"make_{function}_function")(force=True)
                elif not (other == ModeKeys.TRAIN and self._runs > 1):  # never under a running fit
                    setattr(self.model, f"{function}_function", None)

    def _run_begin(self, mode: ModeKeys) -> None:
        self.hook.core.failsafe.call(self._attach, mode)

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

    def on_train_batch_begin(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        self.hook.begin_step(ModeKeys.TRAIN)

    def on_test_batch_begin(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        self.hook.begin_step(ModeKeys.EVAL)

    def on_predict_batch_begin(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        self.hook.begin_step(ModeKeys.PREDICT)

    def _batch_end(self, logs: dict[str, Any] | None) -> None:
        self.hook.save_logs(logs)
        self.hook.end_step(raise_on_stop=False)
        if self.hook.stop_requested:
            self.model.stop_training = True

    def on_train_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        self._batch_end(logs)

    def on_test_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        self._batch_end(logs)

    def on_predict_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        self.hook.end_step(raise_on_stop=False)  # predict logs hold the batch's outputs, not scalars

    # --- end ----------------------------------------------------------------------------

    def save_tensor(self, name: str, value: Any, collections: Iterable[str] = ("default",)) -> None:
        """Save a custom tensor at the current step (e.g. from another callback)."""
        self.hook.save_tensor(name, value, collections)

    def close(self) -> None:
        self.hook.close()

    def __enter__(self) -> StepscopeCallback:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
