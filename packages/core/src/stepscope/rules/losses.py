"""Built-in rules over the course of training: LossNotDecreasing, Overfit, Overtraining,
StalledTrainingRule."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..exceptions import ConfigError
from ..modes import ModeKeys
from ..trial import Trial
from .base import Rule, RuleParams, TensorRequest, require

# Used when a job has no "losses" collection (an old or partial one).
LOSS_REGEX = ("[Ll]oss",)


class _LossRule(Rule):
    """Reads the losses: the `losses` collection plus `tensor_regex`, as scalars (a
    non-scalar loss counts by its mean)."""

    def _loss_names(self, collections: tuple[str, ...] = ("losses",), regex: tuple[str, ...] = ()) -> list[str]:
        if "losses" in collections and "losses" not in self.trial.collections():
            regex = regex + LOSS_REGEX
        return self.select_tensors(collections, regex, all_when_empty=False)

    def _names(self) -> list[str]:
        return self._loss_names(regex=tuple(getattr(self.params, "tensor_regex", ())))

    def has_inputs(self) -> bool:
        return bool(self._names())

    def required_tensors(self, step: int):
        return [TensorRequest(n, step, "mean") for n in self._names()]

    def _loss(self, name: str, step: int) -> float | None:
        return self.reduction(name, step, "mean")

    def _mean_loss(self, step: int) -> float | None:
        values = [v for v in (self._loss(n, step) for n in self._names()) if v is not None]
        return float(np.mean(values)) if values else None


# --- LossNotDecreasing ---------------------------------------------------------------------


@dataclass(frozen=True)
class LossNotDecreasingParams(RuleParams):
    collection_names: tuple[str, ...] = ()
    tensor_regex: tuple[str, ...] = ()
    use_losses_collection: bool = True
    num_steps: int = 10
    diff_percent: float = 0.0
    mode: str | None = None

    def validate(self, owner: str) -> None:
        require(owner, "num_steps", self.num_steps, self.num_steps >= 1, ">= 1")
        require(owner, "diff_percent", self.diff_percent, 0 <= self.diff_percent < 100, "a percentage in [0, 100)")
        if self.mode is not None:
            try:
                ModeKeys.parse(self.mode)
            except ValueError as exc:
                raise ConfigError(f"{owner}.mode: {exc}") from None
        if not (self.collection_names or self.tensor_regex or self.use_losses_collection):
            raise ConfigError(f"{owner}: nothing to inspect; give collection_names or tensor_regex, or keep use_losses_collection true")


class LossNotDecreasing(_LossRule):
    """Fires when a loss did not decrease by at least `diff_percent` percent (default 0:
    any decrease will do) between a step and the last checked step at least `num_steps`
    (10) steps before it (steps of the loss's mode; checks happen every `num_steps` or at
    the next saved step after). Inspects the `losses` collection (`use_losses_collection`,
    True) plus `collection_names` and `tensor_regex`. `mode` (TRAIN, EVAL, GLOBAL) limits
    it to one mode; by default each mode is checked on its own."""

    Params = LossNotDecreasingParams
    params: LossNotDecreasingParams

    def __init__(self, base_trial: Trial, **kwargs: Any):
        super().__init__(base_trial, **kwargs)
        self._last: dict[tuple[ModeKeys, str], tuple[int, float]] = {}
        self._mode = ModeKeys.parse(self.params.mode) if self.params.mode else None

    def _names(self) -> list[str]:
        p = self.params
        collections = p.collection_names + (("losses",) if p.use_losses_collection else ())
        return self._loss_names(collections, p.tensor_regex)

    def invoke_at_step(self, step: int) -> bool:
        mode, mode_step = self.mode_of(step)
        if mode == ModeKeys.PREDICT or (self._mode is not None and mode != self._mode):
            return False
        p = self.params
        fired = False
        for name in self._names():
            loss = self._loss(name, step)
            if loss is None:
                continue
            key = (mode, name)
            last = self._last.get(key)
            if last is None:
                self._last[key] = (mode_step, loss)
                continue
            if mode_step - last[0] < p.num_steps:
                continue
            self._last[key] = (mode_step, loss)
            needed = p.diff_percent / 100.0 * abs(last[1])
            if last[1] - loss <= needed:
                change = 100.0 * (loss - last[1]) / abs(last[1]) if last[1] else float("inf") if loss > last[1] else 0.0
                self.violation(
                    step, f"{name} ({mode.name}): {loss:.4g} at step {mode_step} vs {last[1]:.4g} at step {last[0]} ({change:+.2f}%)",
                    tensor=name, mode=mode.name, loss=loss, previous_loss=last[1], previous_mode_step=last[0],
                )
                fired = True
        return fired


# --- Overfit -------------------------------------------------------------------------------


@dataclass(frozen=True)
class OverfitParams(RuleParams):
    tensor_regex: tuple[str, ...] = ()
    start_step: int = 0
    patience: int = 1
    ratio_threshold: float = 0.1

    def validate(self, owner: str) -> None:
        require(owner, "patience", self.patience, self.patience >= 1, ">= 1")
        require(owner, "start_step", self.start_step, self.start_step >= 0, ">= 0")


class Overfit(_LossRule):
    """Fires when (mean validation loss - mean training loss) / mean training loss exceeds
    `ratio_threshold` (0.1) at `patience` (1) evaluation steps in a row, from global step
    `start_step` (0) on. The validation mean is over the current EVAL phase, the training
    mean over the TRAIN phase before it. Inspects the `losses` collection plus `tensor_regex`."""

    Params = OverfitParams
    params: OverfitParams

    def __init__(self, base_trial: Trial, **kwargs: Any):
        super().__init__(base_trial, **kwargs)
        self._train: list[float] = []
        self._eval: list[float] = []
        self._previous_mode: ModeKeys | None = None
        self._over = 0

    def invoke_at_step(self, step: int) -> bool:
        mode, _ = self.mode_of(step)
        loss = self._mean_loss(step)
        if loss is None or mode not in (ModeKeys.TRAIN, ModeKeys.EVAL):
            return False
        if mode != self._previous_mode:
            # A new phase starts: keep the last training phase until the next one begins.
            if mode == ModeKeys.TRAIN:
                self._train = []
            else:
                self._eval = []
            self._previous_mode = mode
        (self._train if mode == ModeKeys.TRAIN else self._eval).append(loss)
        if mode != ModeKeys.EVAL or not self._train or step < self.params.start_step:
            return False
        train, val = float(np.mean(self._train)), float(np.mean(self._eval))
        if train == 0:
            return False
        ratio = (val - train) / abs(train)
        self._over = self._over + 1 if ratio > self.params.ratio_threshold else 0
        if self._over >= self.params.patience:
            self.violation(
                step, f"validation loss {val:.4g} vs training loss {train:.4g}: ratio {ratio:.3g} > {self.params.ratio_threshold:g}",
                validation_loss=val, training_loss=train, ratio=ratio,
            )
            return True
        return False


# --- Overtraining --------------------------------------------------------------------------


@dataclass(frozen=True)
class OvertrainingParams(RuleParams):
    tensor_regex: tuple[str, ...] = ()
    patience_train: int = 5
    patience_validation: int = 10
    delta: float = 0.1

    def validate(self, owner: str) -> None:
        require(owner, "patience_train", self.patience_train, self.patience_train >= 1, ">= 1")
        require(owner, "patience_validation", self.patience_validation, self.patience_validation >= 1, ">= 1")
        require(owner, "delta", self.delta, self.delta >= 0, ">= 0")


class Overtraining(_LossRule):
    """Fires when the training loss has not improved on its best by more than `delta`
    (0.1, absolute) for `patience_train` (5) saved TRAIN steps, or the validation loss
    for `patience_validation` (10) saved EVAL steps. Inspects the `losses` collection plus
    `tensor_regex`."""

    Params = OvertrainingParams
    params: OvertrainingParams

    def __init__(self, base_trial: Trial, **kwargs: Any):
        super().__init__(base_trial, **kwargs)
        self._best: dict[ModeKeys, float] = {}
        self._since: dict[ModeKeys, int] = {}

    def invoke_at_step(self, step: int) -> bool:
        mode, _ = self.mode_of(step)
        if mode not in (ModeKeys.TRAIN, ModeKeys.EVAL):
            return False
        loss = self._mean_loss(step)
        if loss is None:
            return False
        best = self._best.get(mode)
        if best is None or loss < best - self.params.delta:
            self._best[mode], self._since[mode] = loss, 0
            return False
        self._since[mode] += 1
        patience = self.params.patience_train if mode == ModeKeys.TRAIN else self.params.patience_validation
        if self._since[mode] >= patience:
            self.violation(step, f"{mode.name} loss has not improved by more than {self.params.delta:g} for {self._since[mode]} saved steps (best {best:.4g})", mode=mode.name, loss=loss, best=best)
            return True
        return False


# --- StalledTrainingRule -------------------------------------------------------------------


@dataclass(frozen=True)
class StalledTrainingRuleParams(RuleParams):
    threshold: float = 1800.0
    stop_training_on_fire: bool = False
    training_job_name_prefix: str | None = None

    def validate(self, owner: str) -> None:
        require(owner, "threshold", self.threshold, self.threshold > 0, "> 0 (seconds)")


class StalledTrainingRule(Rule):
    """Fires when no step was saved for `threshold` seconds (1800): between two saved steps
    (by the wall time in the event records), or, while following a running job with
    `watch`, since the last one arrived. With `stop_training_on_fire` (False) it also asks
    the job to stop (a StopTraining action); `training_job_name_prefix` is accepted for
    SageMaker configurations and ignored: the job is the one the trial reads."""

    Params = StalledTrainingRuleParams
    params: StalledTrainingRuleParams

    def __init__(self, base_trial: Trial, **kwargs: Any):
        super().__init__(base_trial, **kwargs)
        if self.params.stop_training_on_fire:
            from .actions import StopTraining

            if not any(isinstance(a, StopTraining) for a in self.actions):
                self.actions.append(StopTraining())
        self._last_wall: float | None = None
        self._probe: str | None = None
        self._idle_fired = False

    def _wall_time(self, step: int) -> float | None:
        trial = self.trial
        if self._probe is None or not trial.tensor(self._probe).has_value(step):
            names = trial.tensor_names(step=step)
            if not names:
                return None
            self._probe = names[0]
        self.mark_inspected(self._probe)
        return trial.tensor(self._probe).wall_time(step)

    def invoke_at_step(self, step: int) -> bool:
        self._idle_fired = False
        wall = self._wall_time(step)
        if wall is None:
            return False
        last, self._last_wall = self._last_wall, wall
        if last is not None and wall - last > self.params.threshold:
            self.violation(step, f"no step was saved for {wall - last:.1f} s before step {step} (threshold {self.params.threshold:g} s)", gap_s=wall - last)
            return True
        return False

    def check_idle(self, idle_s: float, last_step: int | None) -> bool:
        if self._idle_fired:
            return False
        # The job may have stalled before the watch began: count from its last saved step.
        since = max(idle_s, time.time() - self._last_wall) if self._last_wall is not None else idle_s
        if since > self.params.threshold:
            self._idle_fired = True
            self.violation(last_step if last_step is not None else -1, f"no new step for {since:.1f} s (threshold {self.params.threshold:g} s)", idle_s=since)
            return True
        return False
