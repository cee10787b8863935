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
    window: int = 0
    min_windows: int = 6
    min_improvement_percent: float = 5.0
    max_rise_percent: float = 50.0

    def validate(self, owner: str) -> None:
        require(owner, "num_steps", self.num_steps, self.num_steps >= 1, ">= 1")
        require(owner, "window", self.window, self.window == 0 or self.window >= 5, "0 (SageMaker's pairwise test) or >= 5 saved steps")
        require(owner, "min_windows", self.min_windows, self.min_windows >= 2, ">= 2")
        require(owner, "min_improvement_percent", self.min_improvement_percent, 0 <= self.min_improvement_percent < 100, "a percentage in [0, 100)")
        require(owner, "max_rise_percent", self.max_rise_percent, self.max_rise_percent > 0, "> 0")
        require(owner, "diff_percent", self.diff_percent, 0 <= self.diff_percent < 100, "a percentage in [0, 100)")
        if self.mode is not None:
            try:
                ModeKeys.parse(self.mode)
            except ValueError as exc:
                raise ConfigError(f"{owner}.mode: {exc}") from None
        if not (self.collection_names or self.tensor_regex or self.use_losses_collection):
            raise ConfigError(f"{owner}: nothing to inspect; give collection_names or tensor_regex, or keep use_losses_collection true")


class LossNotDecreasing(_LossRule):
    """With `window` 0 (SageMaker's rule): fires when a loss did not decrease by at least
    `diff_percent` percent (default 0: any decrease will do) between a step and the last
    checked step at least `num_steps` (10) steps before it (steps of the loss's mode; checks
    happen every `num_steps` or at the next saved step after).

    With `window` > 0 (the default set uses 25): judges trends, not two noisy points. The
    saved losses of each mode are cut into consecutive windows of `window` saved steps and
    each window is summarised by its median. At the end of each window, once there are
    `min_windows` (6) of them, it fires when no window so far improved on the first one by
    more than the margin (the larger of
    `min_improvement_percent` % of the first median and three standard errors of the
    difference of two medians, the standard error of a median being 1.2533 x 1.4826 x the
    median absolute deviation / sqrt(window), the typical one over the windows), or when the
    current window's median (from the third window on) rose above the best earlier one by
    more than `max_rise_percent` % of it, half of what training had achieved, and three
    standard errors: a loss that oscillates or diverges.

    Inspects the `losses` collection (`use_losses_collection`, True) plus `collection_names`
    and `tensor_regex`. `mode` (TRAIN, EVAL, GLOBAL) limits it to one mode; by default each
    mode is checked on its own."""

    Params = LossNotDecreasingParams
    params: LossNotDecreasingParams
    preset = {"window": 25, "mode": "TRAIN"}

    def __init__(self, base_trial: Trial, **kwargs: Any):
        super().__init__(base_trial, **kwargs)
        self._last: dict[tuple[ModeKeys, str], tuple[int, float]] = {}
        self._mode = ModeKeys.parse(self.params.mode) if self.params.mode else None
        self._windows: dict[tuple[ModeKeys, str], _Windows] = {}

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
            if p.window:
                fired = self._trend(step, mode, mode_step, name, loss) or fired
                continue
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
                    step, f"{name}: {loss:.4g} at {mode.name} step {mode_step} vs {last[1]:.4g} at {mode.name} step {last[0]} ({change:+.2f}%)",
                    tensor=name, mode=mode.name, loss=loss, previous_loss=last[1], previous_mode_step=last[0],
                )
                fired = True
        return fired

    def _trend(self, step: int, mode: ModeKeys, mode_step: int, name: str, loss: float) -> bool:
        if not np.isfinite(loss):
            return False  # ExplodingTensor reports NaN/inf losses
        windows = self._windows.setdefault((mode, name), _Windows(self.params.window))
        done = windows.add(mode_step, loss)
        p = self.params
        if not done or len(windows.medians) < 3:
            return False
        first, current = windows.medians[0], windows.medians[-1]
        earlier = windows.medians[:-1]
        best = min(earlier, key=lambda w: w.median)
        where = f"{name} ({mode.name})"
        # The loss's noise: the typical window's standard error (a window the loss fell
        # through has a wide spread from the trend, not from noise, so not the first one's).
        noise = float(np.median([w.stderr for w in windows.medians]))
        margin = max(p.min_improvement_percent / 100.0 * abs(first.median), 3.0 * np.sqrt(2.0) * noise)
        if len(windows.medians) >= p.min_windows and min(w.median for w in windows.medians) > first.median - margin:
            self.violation(
                step,
                f"{where}: median {current.median:.4g} over {mode.name} steps {current.start}-{current.end} has not improved on "
                f"{first.median:.4g} over steps {first.start}-{first.end} by more than {margin:.3g} "
                f"({len(windows.medians)} windows of {p.window} saved steps)",
                tensor=name, value=current.median, threshold=first.median - margin, first_median=first.median,
            )
            return True
        # A rise must also be large against what training achieved, so the wobble of a loss
        # that went to nearly zero is not mistaken for divergence.
        achieved = max(first.median - best.median, 0.0)
        rise = max(p.max_rise_percent / 100.0 * abs(best.median), 0.5 * achieved, 3.0 * np.sqrt(2.0) * noise)
        if current.median > best.median + rise:
            self.violation(
                step,
                f"{where}: median {current.median:.4g} over {mode.name} steps {current.start}-{current.end} rose above its best "
                f"{best.median:.4g} (steps {best.start}-{best.end}) by more than {rise:.3g}: the loss oscillates or diverges",
                tensor=name, value=current.median, threshold=best.median + rise, best_median=best.median,
            )
            return True
        return False


@dataclass
class _Window:
    start: int
    end: int
    median: float
    stderr: float  # standard error of the median, from the median absolute deviation


class _Windows:
    """Consecutive windows of `size` loss values, summarised robustly."""

    def __init__(self, size: int):
        self.size = size
        self.values: list[float] = []
        self.start: int | None = None
        self.medians: list[_Window] = []

    def add(self, mode_step: int, loss: float) -> bool:
        """Add one value; True when it completed a window."""
        if self.start is None:
            self.start = mode_step
        self.values.append(loss)
        if len(self.values) < self.size:
            return False
        values = np.asarray(self.values)
        median = float(np.median(values))
        sigma = 1.4826 * float(np.median(np.abs(values - median)))
        self.medians.append(_Window(self.start, mode_step, median, 1.2533 * sigma / np.sqrt(len(values))))
        self.values, self.start = [], None
        return True


# --- Overfit -------------------------------------------------------------------------------


@dataclass(frozen=True)
class OverfitParams(RuleParams):
    tensor_regex: tuple[str, ...] = ()
    start_step: int = 0
    patience: int = 1
    ratio_threshold: float = 0.1
    trend_evaluations: int = 0
    min_rise_percent: float = 10.0

    def validate(self, owner: str) -> None:
        require(owner, "patience", self.patience, self.patience >= 1, ">= 1")
        require(owner, "trend_evaluations", self.trend_evaluations, self.trend_evaluations == 0 or self.trend_evaluations >= 3, "0 (SageMaker's ratio test) or >= 3")
        require(owner, "min_rise_percent", self.min_rise_percent, self.min_rise_percent >= 0, ">= 0")
        require(owner, "start_step", self.start_step, self.start_step >= 0, ">= 0")


class Overfit(_LossRule):
    """With `trend_evaluations` 0 (SageMaker's rule): fires when (mean validation loss -
    mean training loss) / mean training loss exceeds `ratio_threshold` (0.1) at `patience`
    (1) evaluation steps in a row, from global step `start_step` (0) on. The validation mean
    is over the current EVAL phase, the training mean over the TRAIN phase before it.

    With `trend_evaluations` N > 0 (the default set uses 4): one point per evaluation phase
    (its mean validation loss, and the mean training loss of the TRAIN phase before it);
    fires when over the last N evaluations the validation loss trends up while the training
    loss trends down (Theil-Sen slopes: medians of pairwise slopes, robust to one noisy
    evaluation), the validation loss's rise over those evaluations exceeds three times its
    noise (1.4826 x the median absolute deviation from the trend line), the trend ends more
    than `min_rise_percent` (10) % above the best validation loss so far, and the gap
    between validation and training loss widened. Inspects the `losses` collection plus
    `tensor_regex`."""

    Params = OverfitParams
    params: OverfitParams
    preset = {"trend_evaluations": 5}

    def __init__(self, base_trial: Trial, **kwargs: Any):
        super().__init__(base_trial, **kwargs)
        self._train: list[float] = []
        self._eval: list[float] = []
        self._previous_mode: ModeKeys | None = None
        self._over = 0
        self._points: list[tuple[float, float]] = []  # (train, val) per evaluation phase
        self._phase_id = 0
        self._eval_started_at = -1

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
                self._phase_id += 1
            self._previous_mode = mode
        (self._train if mode == ModeKeys.TRAIN else self._eval).append(loss)
        if mode != ModeKeys.EVAL or not self._train or step < self.params.start_step:
            return False
        train, val = float(np.mean(self._train)), float(np.mean(self._eval))
        if self.params.trend_evaluations:
            return self._trend(step, train, val)
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

    def _trend(self, step: int, train: float, val: float) -> bool:
        points = self._points
        if self._eval_started_at != self._phase_id:
            points.append((train, val))
            self._eval_started_at = self._phase_id
        else:
            points[-1] = (train, val)
        n = self.params.trend_evaluations
        if len(points) < n or not all(np.isfinite(v) for point in points[-n:] for v in point):
            return False
        recent = points[-n:]
        trains, vals = [t for t, _ in recent], [v for _, v in recent]
        val_slope, train_slope = theil_sen_slope(vals), theil_sen_slope(trains)
        # The validation loss's noise: the spread of the recent points around their trend line.
        fitted = np.median(vals) + val_slope * (np.arange(n) - (n - 1) / 2)
        noise = 1.4826 * float(np.median(np.abs(np.asarray(vals) - fitted)))
        best = min(v for _, v in points if np.isfinite(v))
        rise_needed = best * self.params.min_rise_percent / 100.0
        widened = (vals[-1] - trains[-1]) > (vals[0] - trains[0])
        rising = val_slope > 0 and val_slope * (n - 1) > 3.0 * noise and fitted[-1] - best > rise_needed
        if rising and train_slope < 0 and widened:
            self.violation(
                step,
                f"over the last {n} evaluations the validation loss rose ({vals[0]:.4g} -> {vals[-1]:.4g}, best {best:.4g}) "
                f"while the training loss fell ({trains[0]:.4g} -> {trains[-1]:.4g})",
                value=float(fitted[-1]), threshold=best + rise_needed, validation_loss=vals[-1], training_loss=trains[-1],
                validation_slope=val_slope, training_slope=train_slope, validation_noise=noise,
            )
            return True
        return False


def theil_sen_slope(values: list[float]) -> float:
    """The median of the slopes between every pair of points (x = 0, 1, ...)."""
    slopes = [(values[j] - values[i]) / (j - i) for i in range(len(values)) for j in range(i + 1, len(values))]
    return float(np.median(slopes)) if slopes else 0.0


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
