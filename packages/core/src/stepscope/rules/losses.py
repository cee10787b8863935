"""Built-in rules over the course of training: LossNotDecreasing, Overfit, Overtraining,
StalledTrainingRule."""

from __future__ import annotations

import bisect
import math
import re
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..exceptions import ConfigError
from ..modes import ModeKeys
from ..trial import Trial
from .base import Rule, RuleParams, TensorRequest, require
from .params import ranged

# Used when a job has no "losses" collection (an old or partial one).
LOSS_REGEX = ("[Ll]oss",)
# The fewest values a window of losses may summarise (a median of fewer is too noisy).
MIN_WINDOW = 5
# LossDivergence on runs shorter than its windows: at least this many saved losses, and a
# rise of the last third's median to this many times the first third's.
SHORT_RUN_MIN = 6
SHORT_RUN_RISE = 10.0
# The largest loss read as ln K: ln of 10^6 classes (a vocabulary); above that a first loss
# is no classifier's at initialisation.
MAX_CHANCE_LOSS = math.log(1e6) * 1.1
# SlowConvergence's "still falling": the second half of the run lowers the loss by more
# than this share of its start (a 1000x too small learning rate: 0.4 %).
MIN_FALL_FRACTION = 1e-3
# ChanceLevelLoss's evaluation sets told apart by their place in each evaluation phase: a
# script that evaluates a few sets after each epoch (pytorch/examples' gat/main.py: the
# training nodes, then the validation nodes) at most this many per phase.
MAX_SETS = 3
# A set "at chance": its losses end within this share above ln K (a model that learned
# nothing of it predicts nearly uniformly; a small set of hard examples it got confidently
# wrong sits far above).
CHANCE_BAND = 0.1
# Loss names that are not a classifier's cross-entropy: never judged against chance level.
_REGRESSION_LOSS = re.compile(r"mse|mae|l1|huber|smooth|squared|absolute|regression|cosine|hinge|ctc|kl", re.IGNORECASE)


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
    num_steps: int = ranged(10, "positive_int")
    diff_percent: float = 0.0
    mode: str | None = None
    window: int = 0
    min_windows: int = 6
    min_improvement_percent: float = 5.0
    max_rise_percent: float = ranged(50.0, "positive")

    def validate(self, owner: str) -> None:
        require(owner, "window", self.window, self.window == 0 or self.window >= 5, "0 (SageMaker's pairwise test) or >= 5 saved steps")
        require(owner, "min_windows", self.min_windows, self.min_windows >= 2, ">= 2")
        require(owner, "min_improvement_percent", self.min_improvement_percent, 0 <= self.min_improvement_percent < 100, "a percentage in [0, 100)")
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
    mode is checked on its own.

    Jobs that declare several optimizers are not judged (status "no data", as
    LossDivergence and ChanceLevelLoss): their losses belong to competing objectives (a
    GAN's generator and discriminator, PPO's actor and critic) that are not meant to fall,
    and the job does not say which loss belongs to which optimizer."""

    params: LossNotDecreasingParams
    preset = {"window": 25, "mode": "TRAIN"}
    to_save = "losses every step"

    def __init__(self, base_trial: Trial, **kwargs: Any):
        super().__init__(base_trial, **kwargs)
        self._last: dict[tuple[ModeKeys, str], tuple[int, float]] = {}
        self._mode = ModeKeys.parse(self.params.mode) if self.params.mode else None
        self._windows: dict[tuple[ModeKeys, str], _Windows] = {}
        # Every finite loss seen, (global step, loss), for the end-of-run judgement of runs
        # too short for `min_windows` windows of `window` values.
        self._series: dict[tuple[ModeKeys, str], list[tuple[int, float]]] = {}
        # NaN/inf losses seen, per (mode, name): ExplodingTensor's finding, and the reason a
        # run that saved enough losses can still leave this rule without enough to judge.
        self._non_finite: dict[tuple[ModeKeys, str], int] = {}
        self._compared = 0
        self._skip: bool | None = None

    def _adversarial(self) -> bool:
        if self._skip is None:
            self._skip = sum(1 for scope in self.trial.scopes() if scope.kind == "optimizer") >= 2
        return self._skip

    def finish(self) -> None:
        """Runs too short for `min_windows` windows of `window` saved losses (30 to 150 of
        them) are judged once here by `_judge_short`; when that test has too little power to
        tell a falling loss from a flat one, the status is "not enough data (needs
        min_windows x window, has N)", never a finding and never "ok"."""
        p = self.params
        if self._adversarial():
            self.no_data("not judged: the job declares several optimizers (adversarial and actor-critic losses are not meant to fall)")
            return
        if not p.window:
            self.need(1, self._compared, f"loss comparisons {p.num_steps} steps apart")
            return
        unit = f"saved {self._mode.name} losses" if self._mode else "saved losses"
        most, undecided = 0, 0
        for (mode, name), series in self._series.items():
            most = max(most, len(series))
            if len(self._windows[(mode, name)].medians) >= p.min_windows or len(series) < MIN_WINDOW * p.min_windows:
                continue
            if self._judge_short(mode, name, series) is None:
                undecided = max(undecided, len(series))
        if undecided and not self.report.violations:
            self.need(p.window * p.min_windows, undecided, unit)
            return
        self.need(MIN_WINDOW * p.min_windows, most, unit, non_finite=max(self._non_finite.values(), default=0), finite_what="losses")

    def _judge_short(self, mode: ModeKeys, name: str, series: list[tuple[int, float]]) -> bool | None:
        """A short run's one test: the median of its first sixth of losses against the
        median of its last third (pooled, so the comparison has the power a sixth-sized
        window lacks). The noise is estimated from successive differences (1.4826 x MAD of
        the differences / sqrt 2: a falling trend does not inflate it), each median's
        standard error is 1.2533 x that / sqrt(n), and s is the standard error of their
        difference. With the improvement d = first - second: fired when even d + 3 s stays
        under `min_improvement_percent` % of the first median (the loss did not fall
        materially, or rose); ok (False) when d exceeds both that share and 3 s; None when
        neither is shown (the caller says "not enough data")."""
        p = self.params
        values = np.asarray([v for _, v in series], dtype=np.float64)
        head, tail = values[: max(MIN_WINDOW, len(values) // p.min_windows)], values[-max(MIN_WINDOW, len(values) // 3) :]
        diffs = np.diff(values)
        sigma = 1.4826 * float(np.median(np.abs(diffs - np.median(diffs)))) / math.sqrt(2.0)
        first, second = float(np.median(head)), float(np.median(tail))
        s = 1.2533 * sigma * math.sqrt(1.0 / len(head) + 1.0 / len(tail))
        improvement, needed = first - second, p.min_improvement_percent / 100.0 * abs(first)
        if improvement > max(needed, 3.0 * s):
            return False
        if improvement + 3.0 * s >= needed:
            return None
        start, end = self.mode_of(series[-len(tail)][0])[1], self.mode_of(series[-1][0])[1]
        self.violation(
            series[-1][0],
            f"{name} ({mode.name}): median {second:.4g} over the last {len(tail)} of its {len(values)} saved losses ({mode.name} steps "
            f"{start}-{end}) has not improved on {first:.4g} over the first {len(head)} by {needed:.3g} "
            f"({p.min_improvement_percent:g}% of it; change {-improvement:+.3g}, three standard errors {3.0 * s:.2g})",
            tensor=name, value=second, threshold=first - needed, first_median=first,
        )
        return True

    def _names(self) -> list[str]:
        p = self.params
        collections = p.collection_names + (("losses",) if p.use_losses_collection else ())
        return self._loss_names(collections, p.tensor_regex)

    def invoke_at_step(self, step: int) -> bool:
        mode, mode_step = self.mode_of(step)
        if mode == ModeKeys.PREDICT or (self._mode is not None and mode != self._mode) or self._adversarial():
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
            self._compared += 1
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
            self._non_finite[(mode, name)] = self._non_finite.get((mode, name), 0) + 1
            return False  # ExplodingTensor reports NaN/inf losses
        windows = self._windows.setdefault((mode, name), _Windows(self.params.window))
        self._series.setdefault((mode, name), []).append((step, loss))
        if not windows.add(mode_step, loss):
            return False
        return self._judge(step, mode, name, windows)

    def _judge(self, step: int, mode: ModeKeys, name: str, windows: _Windows) -> bool:
        """The two tests at the end of a window (see the class docstring)."""
        p = self.params
        if len(windows.medians) < 3:
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
                f"({len(windows.medians)} windows of {windows.size} saved steps)",
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
    start_step: int = ranged(0, "count")
    patience: int = ranged(1, "positive_int")
    ratio_threshold: float = 0.1
    trend_evaluations: int = 0
    min_rise_percent: float = ranged(10.0, "non_negative")

    def validate(self, owner: str) -> None:
        require(owner, "trend_evaluations", self.trend_evaluations, self.trend_evaluations == 0 or self.trend_evaluations >= 3, "0 (SageMaker's ratio test) or >= 3")


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

    params: OverfitParams
    preset = {"trend_evaluations": 5}
    to_save = "EVAL losses from validation during training"

    def finish(self) -> None:
        needed = self.params.trend_evaluations or self.params.patience
        # How many, too: a job that validated once per epoch for two epochs saved EVAL losses
        # and still needs more validation runs (more epochs, or validation more often).
        self.need(needed, len(self._points) if self.params.trend_evaluations else self._phase_id, "evaluations after training steps",
                  f"{self.to_save}: at least {needed} validation runs")

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


# --- whole-run loss rules: LossDivergence, ChanceLevelLoss, SlowConvergence ------------------


class _LossSeriesRule(_LossRule):
    """Collects each loss's finite values per mode, (global step, value), for rules that
    judge the whole course of training. Jobs that declare several optimizers (adversarial
    training: a GAN's losses rise and sit near ln 2 by design) are not judged."""

    modes: tuple[ModeKeys, ...] = (ModeKeys.TRAIN,)

    def __init__(self, base_trial: Trial, **kwargs: Any):
        super().__init__(base_trial, **kwargs)
        self._series: dict[tuple[ModeKeys, str], list[tuple[int, float]]] = {}
        self._non_finite: dict[str, int] = {}  # NaN/inf TRAIN losses per name (see _need_losses)

    def _adversarial(self) -> bool:
        return sum(1 for scope in self.trial.scopes() if scope.kind == "optimizer") >= 2

    def invoke_at_step(self, step: int) -> bool:
        mode, _ = self.mode_of(step)
        if mode not in self.modes:
            return False
        fired = False
        for name in self._names():
            loss = self._loss(name, step)
            if loss is not None and np.isfinite(loss):
                series = self._series.setdefault((mode, name), [])
                series.append((step, loss))
                fired = self._on_value(step, mode, name, series) or fired
            elif loss is not None and mode == ModeKeys.TRAIN:
                self._non_finite[name] = self._non_finite.get(name, 0) + 1
        return fired

    def _on_value(self, step: int, mode: ModeKeys, name: str, series: list[tuple[int, float]]) -> bool:
        return False

    def _train_series(self) -> dict[str, list[tuple[int, float]]]:
        return {name: series for (mode, name), series in self._series.items() if mode == ModeKeys.TRAIN}

    def _longest(self) -> int:
        return max((len(v) for v in self._train_series().values()), default=0)

    def _need_losses(self, needed: int) -> None:
        """`need` in saved TRAIN losses: the longest finite series, and the NaN/inf losses
        that would have made it long enough (a run whose loss blew up saved them: the
        summaries then ask for finite losses, not for saving more often)."""
        self.need(needed, self._longest(), "saved TRAIN losses", non_finite=max(self._non_finite.values(), default=0), finite_what="losses")


def _robust(values: list[float] | np.ndarray) -> tuple[float, float]:
    """Median and the standard error of the median (1.2533 x 1.4826 x MAD / sqrt(n))."""
    array = np.asarray(values, dtype=np.float64)
    median = float(np.median(array))
    sigma = 1.4826 * float(np.median(np.abs(array - median)))
    return median, 1.2533 * sigma / math.sqrt(len(array))


@dataclass(frozen=True)
class LossDivergenceParams(RuleParams):
    tensor_regex: tuple[str, ...] = ()
    start_points: int = 10
    window: int = 10
    rise_percent: float = ranged(50.0, "positive")

    def validate(self, owner: str) -> None:
        require(owner, "start_points", self.start_points, self.start_points >= MIN_WINDOW, f">= {MIN_WINDOW}")
        require(owner, "window", self.window, self.window >= MIN_WINDOW, f">= {MIN_WINDOW}")


class LossDivergence(_LossSeriesRule):
    """Fires when a training loss rises far above where it started: the median of a window
    of `window` (10) consecutive saved TRAIN losses exceeds the median of the first
    `start_points` (10) by more than `rise_percent` (50) % of it and by three standard
    errors of the difference (medians' standard errors from the median absolute
    deviation). A loss at initialisation is the worst a healthy run sees for long; one that
    climbs well above it (6.7 -> 15.4) diverges, even when it later comes back. Reported
    once per loss, at the first window over the bound, with the peak. A run too short for
    the windows is judged at its end (`_judge_short`). NaN/inf losses are
    ExplodingTensor's."""

    params: LossDivergenceParams
    to_save = "losses every step"

    def __init__(self, base_trial: Trial, **kwargs: Any):
        super().__init__(base_trial, **kwargs)
        self._start: dict[str, tuple[float, float]] = {}
        self._fired: set[str] = set()
        self._skip: bool | None = None

    def _on_value(self, step: int, mode: ModeKeys, name: str, series: list[tuple[int, float]]) -> bool:
        p = self.params
        n = len(series)
        if n == p.start_points:
            self._start[name] = _robust([v for _, v in series])
        if name in self._fired or n < p.start_points + p.window or (n - p.start_points) % p.window:
            return False
        if self._skip is None:
            self._skip = self._adversarial()
        if self._skip:
            return False
        start, start_err = self._start[name]
        window = [v for _, v in series[-p.window :]]
        median, err = _robust(window)
        bound = start + max(p.rise_percent / 100.0 * abs(start), 3.0 * math.hypot(start_err, err))
        if median <= bound:
            return False
        self._fired.add(name)
        first, last = series[-p.window][0], step
        mode_name = mode.name
        self.violation(
            step,
            f"{name}: median {median:.4g} over {mode_name} steps {self.mode_of(first)[1]}-{self.mode_of(last)[1]} is "
            f"{median / start if start > 0 else float('inf'):.2g}x its start ({start:.4g} over the first {p.start_points} saved steps); "
            f"bound {bound:.4g}: the loss diverges",
            tensor=name, value=median, threshold=bound, start=start,
        )
        return True

    def finish(self) -> None:
        if self._skip is None and any(len(v) >= SHORT_RUN_MIN for v in self._train_series().values()):
            self._skip = self._adversarial()
        if self._skip:
            self.no_data("not judged: the job declares several optimizers (adversarial losses rise by design)")
            return
        for name, series in self._train_series().items():
            if name not in self._fired and len(series) < self.params.start_points + self.params.window:
                self._judge_short(name, series)
        self._need_losses(self.params.start_points + self.params.window)

    def _judge_short(self, name: str, series: list[tuple[int, float]]) -> None:
        """A run too short for the windows (an LBFGS job's 15 optimizer steps, each a
        saved loss) can still show a divergence no noise explains: the last third of its
        losses (3 at least) all above every one of its first third, their median
        SHORT_RUN_RISE (10) times theirs or more. Only fires: a short run that passes is
        still "not enough data" (pytorch/examples' time_sequence_prediction on torch 2.13:
        6.9e-05 at step 4, 8.1e+22 at step 5, 16 saved losses, and nothing said so)."""
        if len(series) < SHORT_RUN_MIN:
            return
        k = max(SHORT_RUN_MIN // 2, len(series) // 3)
        head, tail = [v for _, v in series[:k]], [v for _, v in series[-k:]]
        start, median = float(np.median(head)), float(np.median(tail))
        if start <= 0 or min(tail) <= max(head) or median < SHORT_RUN_RISE * start:
            return
        self._fired.add(name)
        first, last = series[-k][0], series[-1][0]
        self.violation(
            last,
            f"{name}: median {median:.4g} over TRAIN steps {self.mode_of(first)[1]}-{self.mode_of(last)[1]} (its last {k} saved) is "
            f"{median / start:.2g}x its start ({start:.4g} over the first {k}), every one above every one of those: the loss diverges",
            tensor=name, value=median, threshold=SHORT_RUN_RISE * start, start=start,
        )


@dataclass(frozen=True)
class ChanceLevelLossParams(RuleParams):
    tensor_regex: tuple[str, ...] = ()
    num_classes: int = 0
    tolerance_percent: float = 3.0
    start_points: int = ranged(3, "positive_int")
    min_points: int = 30
    min_evaluations: int = ranged(3, "positive_int")

    def validate(self, owner: str) -> None:
        require(owner, "num_classes", self.num_classes, self.num_classes == 0 or self.num_classes >= 2, "0 (inferred) or >= 2")
        require(owner, "tolerance_percent", self.tolerance_percent, 0 <= self.tolerance_percent < 100, "a percentage in [0, 100)")
        require(owner, "min_points", self.min_points, self.min_points >= 3 * MIN_WINDOW, f">= {3 * MIN_WINDOW}")


class ChanceLevelLoss(_LossSeriesRule):
    """Fires when a classifier's cross-entropy stays at chance level, ln K for K classes:
    what a model that learned nothing about the inputs scores (shuffled labels, learning
    rate 0, inputs that do not reach the model). K is `num_classes`, or (0, the default)
    inferred from the loss at initialisation: a freshly initialised classifier predicts
    nearly uniform probabilities, so its first losses sit at ln K; the loss is judged only
    when the lowest of its first `start_points` (3) saved TRAIN losses is within 10 % of
    ln K for an integer K from 2 to 10^6, and never when its name says regression (MSE, L1, Huber, ...).

    Two findings, judged over the whole run once it holds `min_points` (30) saved TRAIN
    losses: the median of the last third of the TRAIN losses is above ln K minus
    `tolerance_percent` (3) % of it (training learns nothing); or, while training loss went
    below that, the validation loss (the mean of each evaluation phase, at least
    `min_evaluations` (3) of them) never did (the model memorises the training set and
    learns nothing that generalises: labels shuffled or unrelated to the inputs). A script
    that evaluates 2 to MAX_SETS (3) sets after each epoch, the same number each time, has
    each set judged on its own too, told apart by place (the training data, then the
    validation data): one that never went below chance level and ends within CHANCE_BAND
    (10 %) above ln K, while another went below it, is the same finding."""

    params: ChanceLevelLossParams
    modes = (ModeKeys.TRAIN, ModeKeys.EVAL)
    to_save = "losses every step"

    def _classes(self, series: list[tuple[int, float]]) -> int | None:
        if self.params.num_classes:
            return self.params.num_classes
        # The lowest of the first losses: a run that diverges from its first update has its
        # loss at initialisation there, not its median (a diverged loss of 20 is not ln 5e8).
        start = float(np.min([v for _, v in series[: self.params.start_points]]))
        if not 0.5 < start < MAX_CHANCE_LOSS:
            return None
        k = int(round(math.exp(start)))
        return k if k >= 2 and abs(start - math.log(k)) <= 0.1 * math.log(k) else None

    def finish(self) -> None:
        p = self.params
        if self._adversarial():
            self.no_data("not judged: the job declares several optimizers (adversarial losses sit near ln 2 by design)")
            return
        judged = 0
        for name, series in self._train_series().items():
            if len(series) < p.min_points or _REGRESSION_LOSS.search(name):
                continue
            k = self._classes(series)
            if k is None:
                continue
            judged += 1
            chance = math.log(k)
            bound = chance * (1 - p.tolerance_percent / 100.0)
            tail = [v for _, v in series[-(len(series) // 3) :]]
            median = float(np.median(tail))
            last = series[-1][0]
            if median >= bound:
                self.violation(
                    last,
                    f"{name}: median {median:.4g} over the last {len(tail)} saved TRAIN steps is at or above chance level for {k} classes "
                    f"(ln {k} = {chance:.4g}; bound {bound:.4g}): the model learns nothing from its inputs",
                    tensor=name, value=median, threshold=bound, num_classes=k, chance=chance,
                )
                continue
            evaluations = self._phase_means(name)
            if len(evaluations) >= p.min_evaluations and min(v for _, v in evaluations) >= bound:
                step, best = min(evaluations, key=lambda e: e[1])
                self.violation(
                    evaluations[-1][0],
                    f"{name}: the validation loss never went below chance level for {k} classes (best {best:.4g} over "
                    f"{len(evaluations)} evaluations, ln {k} = {chance:.4g}) while the training loss fell to {median:.4g}: "
                    "the model memorises the training set and learns nothing that generalises",
                    tensor=name, value=best, threshold=bound, num_classes=k, chance=chance, training_loss=median,
                )
                continue
            self._judge_sets(name, k, bound, median)
        if judged:
            self._need_losses(p.min_points)
        elif self._longest() >= p.min_points:
            self.no_data("no classifier loss to judge (no loss starts at ln K for K classes; give num_classes)")
        else:
            self._need_losses(p.min_points)

    def _judge_sets(self, name: str, k: int, bound: float, training: float) -> None:
        """The validation mean went below chance level, but one of the sets evaluated after
        each epoch may still sit at it: pytorch/examples' gat/main.py evaluates the training
        nodes and then the validation nodes, and with shuffled labels the first fell to 1.48
        while the second stayed at 1.97 (ln 7 = 1.95); their mean, 1.73, hid it."""
        sets = self._evaluation_sets(name)
        if not sets or len(sets[0]) < self.params.min_evaluations:
            return
        chance = math.log(k)
        best = [min(v for _, v in values) for values in sets]
        for place, values in enumerate(sets):
            tail = [v for _, v in values[-max(1, len(values) // 3) :]]
            learned = [b for other, b in enumerate(best) if other != place and b < bound]
            if best[place] < bound or not learned or float(np.median(tail)) > chance * (1 + CHANCE_BAND):
                continue
            self.violation(
                values[-1][0],
                f"{name}: evaluation {place + 1} of the {len(sets)} after each training phase never went below chance level for {k} classes "
                f"(best {best[place]:.4g} over {len(values)} evaluations, ln {k} = {chance:.4g}) while the training loss fell to {training:.4g} "
                f"and another evaluation reached {min(learned):.4g}: the model scores the data it trained on and learns nothing that generalises",
                tensor=name, value=best[place], threshold=bound, num_classes=k, chance=chance, training_loss=training, evaluation=place + 1,
            )
            return

    def _evaluation_sets(self, name: str) -> list[list[tuple[int, float]]]:
        """The k-th EVAL value of each evaluation phase as set k, when every phase holds the
        same 2 to MAX_SETS values (the last may hold more: a final test); else none. Values
        are told apart by place only: the losses carry no name of their data."""
        phases = self._phases(name)
        if not phases:
            return []
        n = len(phases[0])
        if not 2 <= n <= MAX_SETS or any(len(phase) != n for phase in phases[:-1]) or len(phases[-1]) < n:
            return []
        return [[phase[place] for phase in phases] for place in range(n)]

    def _phase_means(self, name: str) -> list[tuple[int, float]]:
        """(last global step, mean) of each evaluation phase of loss `name`."""
        return [(phase[-1][0], float(np.mean([v for _, v in phase]))) for phase in self._phases(name)]

    def _phases(self, name: str) -> list[list[tuple[int, float]]]:
        """The evaluation phases of loss `name`: EVAL values with no TRAIN step of it between
        them, as (global step, value)."""
        series = self._series.get((ModeKeys.EVAL, name), [])
        train_steps = [step for step, _ in self._series.get((ModeKeys.TRAIN, name), [])]
        phases: list[list[tuple[int, float]]] = []
        for step, value in series:
            previous = phases[-1][-1][0] if phases else None
            if previous is not None and bisect.bisect_left(train_steps, step) == bisect.bisect_left(train_steps, previous):
                phases[-1].append((step, value))
            else:
                phases.append([(step, value)])
        return phases


@dataclass(frozen=True)
class SlowConvergenceParams(RuleParams):
    tensor_regex: tuple[str, ...] = ()
    windows: int = 10
    min_decrease_percent: float = 10.0

    def validate(self, owner: str) -> None:
        require(owner, "windows", self.windows, self.windows >= 6, ">= 6")
        require(owner, "min_decrease_percent", self.min_decrease_percent, 0 < self.min_decrease_percent < 100, "a percentage in (0, 100)")


class SlowConvergence(_LossSeriesRule):
    """Fires when a training loss is still falling steadily at the end of the run but has
    come down by less than `min_decrease_percent` (10) % of where it started: it converges,
    slowly (a learning rate far too small, poor initialisation or input scaling). The saved
    TRAIN losses are cut into `windows` (10) windows (at least MIN_WINDOW losses each) and
    summarised by their medians; "still falling" is a negative Theil-Sen slope over the
    second half of the windows whose drop exceeds three standard errors of a window's
    median and 0.1 % of the first median. A loss that does not fall at all is
    LossNotDecreasing's."""

    params: SlowConvergenceParams
    to_save = "losses every step"

    def finish(self) -> None:
        p = self.params
        if self._adversarial():
            self.no_data("not judged: the job declares several optimizers")
            return
        for name, series in self._train_series().items():
            size = len(series) // p.windows
            if size < MIN_WINDOW:
                continue
            medians, errors = zip(*(_robust([v for _, v in series[i * size : (i + 1) * size]]) for i in range(p.windows)))
            first, last = medians[0], medians[-1]
            if first <= 0:
                continue
            decrease = (first - last) / first
            half = list(medians[p.windows // 2 :])
            slope = theil_sen_slope(half)
            noise = float(np.median(errors))
            drop = -slope * (len(half) - 1)
            # Also material: a loss at chance level drifting by 2e-4 over half the run (0.03 %
            # of it) is flat, and its noise can be smaller still; that is LossNotDecreasing's.
            falling = slope < 0 and drop > 3.0 * math.sqrt(2.0) * noise and drop > MIN_FALL_FRACTION * first
            if falling and 0 < decrease < p.min_decrease_percent / 100.0:
                self.violation(
                    series[-1][0],
                    f"{name}: fell only {100 * decrease:.1f}% ({first:.4g} -> {last:.4g}) over {len(series)} saved TRAIN steps and is "
                    f"still falling ({slope:.3g} per window of {size}): training converges slowly",
                    tensor=name, value=100 * decrease, threshold=p.min_decrease_percent, slope=slope,
                )
        self._need_losses(MIN_WINDOW * p.windows)


# --- Overtraining --------------------------------------------------------------------------


@dataclass(frozen=True)
class OvertrainingParams(RuleParams):
    tensor_regex: tuple[str, ...] = ()
    patience_train: int = ranged(5, "positive_int")
    patience_validation: int = ranged(10, "positive_int")
    delta: float = ranged(0.1, "non_negative")


class Overtraining(_LossRule):
    """Fires when the training loss has not improved on its best by more than `delta`
    (0.1, absolute) for `patience_train` (5) saved TRAIN steps, or the validation loss
    for `patience_validation` (10) saved EVAL steps. Inspects the `losses` collection plus
    `tensor_regex`."""

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
    threshold: float = ranged(1800.0, "positive")
    stop_training_on_fire: bool = False
    training_job_name_prefix: str | None = None


class StalledTrainingRule(Rule):
    """Fires when no step was saved for `threshold` seconds (1800): between two saved steps
    (by the wall time in the event records), or, while following a running job with
    `watch`, since the last one arrived. With `stop_training_on_fire` (False) it also asks
    the job to stop (a StopTraining action); `training_job_name_prefix` is accepted for
    SageMaker configurations and ignored: the job is the one the trial reads."""

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
