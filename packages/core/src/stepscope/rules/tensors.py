"""Built-in rules over single tensors and their history: VanishingGradient, ExplodingTensor,
AllZero, UnchangedTensor, TensorVariance, WeightUpdateRatio, SimilarAcrossRuns."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..exceptions import ConfigError
from ..modes import ModeKeys
from ..trial import Trial, create_trial
from .base import Rule, RuleParams, TensorRequest, require

# Weights change only while training: EVAL/PREDICT steps would look "unchanged".
TRAINING_MODES = (ModeKeys.TRAIN, ModeKeys.GLOBAL)
# Used when a job has no collections file (an old or partial one).
GRADIENT_REGEX = ("^gradient",)
WEIGHT_REGEX = ("^(?!gradient).*weight",)


@dataclass(frozen=True)
class SelectionParams(RuleParams):
    """Which tensors a rule inspects: the union of `collection_names` and `tensor_regex`;
    every saved tensor when both are empty."""

    collection_names: tuple[str, ...] = ()
    tensor_regex: tuple[str, ...] = ()


class _SelectingRule(Rule):
    params: SelectionParams

    def tensors(self) -> list[str]:
        return self.select_tensors(self.params.collection_names, self.params.tensor_regex)

    def has_inputs(self) -> bool:
        return bool(self.tensors())


def _is_float(array: np.ndarray) -> bool:
    return array.dtype.kind in "fc"


# --- VanishingGradient ---------------------------------------------------------------------


@dataclass(frozen=True)
class VanishingGradientParams(RuleParams):
    threshold: float = 1e-7
    relative_threshold: float = 0.0
    skip_kinds: tuple[str, ...] = ()

    def validate(self, owner: str) -> None:
        require(owner, "threshold", self.threshold, self.threshold >= 0, ">= 0")
        require(owner, "relative_threshold", self.relative_threshold, 0 <= self.relative_threshold < 1, "in [0, 1)")
        bad = [k for k in self.skip_kinds if k not in PARAMETER_KINDS]
        require(owner, "skip_kinds", self.skip_kinds, not bad, f"kinds among {', '.join(PARAMETER_KINDS)}")


PARAMETER_KINDS = ("matrix", "vector", "bias", "norm", "embedding")


def parameter_kind(name: str, module_class: str | None, ndim: int | None) -> str:
    """What kind of parameter a weight or gradient belongs to: "embedding" (lookup tables:
    only the rows used in a batch get a gradient), "norm" (BatchNorm/LayerNorm scales and
    shifts), "bias", "vector" (other 1-D parameters), "matrix" (dense, convolution and
    recurrent weights)."""
    lowered = name.lower()
    cls = (module_class or "").lower()
    last = lowered.rsplit(".", 1)[-1].rsplit("/", 1)[-1]
    if "embedding" in cls or "embed" in lowered:
        return "embedding"
    if "norm" in cls or any(part in lowered for part in ("norm", ".bn", "batchnorm")):
        return "norm"
    if "bias" in last:
        return "bias"
    if ndim is not None and ndim <= 1:
        return "vector"
    return "matrix"


class VanishingGradient(Rule):
    """Fires when the mean of the absolute values of a gradient drops below `threshold`
    (default 1e-7), or, with `relative_threshold` > 0, below that fraction of the largest
    mean |gradient| among the judged gradients of the same step (the layer-to-layer decay
    that defines vanishing gradients, independent of the loss's scale). Gradients of the
    kinds in `skip_kinds` ("bias", "vector", "norm", "embedding") are not judged: a conv
    bias before BatchNorm has a zero gradient by design, and an embedding table's unused
    rows get none. Inspects the `gradients` collection (tensors named `gradient*` in jobs
    without a collections file); uses the saved abs_mean reduction when there is one."""

    Params = VanishingGradientParams
    params: VanishingGradientParams
    # Judge weight matrices only, and against the other layers: deep sigmoid stacks sit at
    # 1e-8 of their last layer, healthy MLPs, CNNs, RNNs and transformers above 1e-2.
    preset = {"relative_threshold": 1e-3, "skip_kinds": ("bias", "vector", "norm", "embedding")}

    def __init__(self, base_trial: Trial, **kwargs: Any):
        super().__init__(base_trial, **kwargs)
        self._kinds: dict[str, str] = {}

    def _gradients(self) -> list[str]:
        return self.select_tensors(("gradients",), GRADIENT_REGEX)

    def has_inputs(self) -> bool:
        return bool(self._gradients())

    def required_tensors(self, step: int):
        return [TensorRequest(n, step, "mean", True) for n in self._gradients()]

    def _kind(self, name: str, step: int) -> str:
        known = self._kinds.get(name)
        if known is not None:
            return known
        ndim = None
        if self.has_raw(name, step):
            value = self.value(name, step)
            ndim = None if value is None else value.ndim
        param = name.split("/", 1)[1] if name.startswith("gradient") and "/" in name else name
        kind = parameter_kind(param, self.trial.module_class(name) or self.trial.module_class(param), ndim)
        if ndim is not None:  # a kind found without the shape may change once a raw value comes
            self._kinds[name] = kind
        return kind

    def invoke_at_step(self, step: int) -> bool | None:
        p = self.params
        judged: dict[str, float] = {}
        for name in self._gradients():
            if p.skip_kinds and self._kind(name, step) in p.skip_kinds:
                continue
            abs_mean = self.reduction(name, step, "mean", abs=True)
            if abs_mean is not None and np.isfinite(abs_mean):
                judged[name] = abs_mean
        if not judged:
            return False
        largest_name = max(judged, key=judged.__getitem__)
        largest = judged[largest_name]
        for name, abs_mean in judged.items():
            if abs_mean < p.threshold:
                self.violation(step, f"{name}: mean |gradient| {abs_mean:.3g} < {p.threshold:g}", tensor=name, value=abs_mean, threshold=p.threshold, abs_mean=abs_mean)
            elif p.relative_threshold and largest > 0 and abs_mean / largest < p.relative_threshold:
                ratio = abs_mean / largest
                self.violation(
                    step, f"{name}: mean |gradient| {abs_mean:.3g} is {ratio:.2g} of the largest ({largest_name}: {largest:.3g}) < {p.relative_threshold:g}",
                    tensor=name, value=ratio, threshold=p.relative_threshold, abs_mean=abs_mean, largest=largest_name,
                )
        return None  # fired follows from the violations reported


# --- ExplodingTensor -----------------------------------------------------------------------


@dataclass(frozen=True)
class ExplodingTensorParams(SelectionParams):
    only_nan: bool = False


class ExplodingTensor(_SelectingRule):
    """Fires when a tensor holds NaN, or (unless `only_nan`, default False) an infinity.
    Inspects `collection_names` / `tensor_regex`, or every tensor when neither is given.
    When only reductions were saved, a NaN or infinite min/max/mean gives it away."""

    Params = ExplodingTensorParams
    params: ExplodingTensorParams
    _REDUCTIONS = ("max", "min", "mean")

    def required_tensors(self, step: int):
        out = []
        for name in self.tensors():
            if self.has_raw(name, step):
                out.append(TensorRequest(name, step))
            else:
                out.extend(TensorRequest(name, step, r) for r in self._REDUCTIONS)
        return out

    def _bad(self, values: np.ndarray) -> tuple[int, int]:
        if np.isfinite(values).all():  # the common case: one pass, no counting
            return 0, 0
        nans = int(np.count_nonzero(np.isnan(values)))
        infs = 0 if self.params.only_nan else int(np.count_nonzero(np.isinf(values)))
        return nans, infs

    def invoke_at_step(self, step: int) -> bool:
        fired = False
        for name in self.tensors():
            if self.has_raw(name, step):
                value = self.value(name, step)
                if value is None or not _is_float(value):
                    continue
            else:
                found = [self.reduction(name, step, r) for r in self._REDUCTIONS]
                found = [v for v in found if v is not None]
                if not found:
                    continue
                value = np.asarray(found)
            nans, infs = self._bad(value)
            if nans or infs:
                what = f"{nans} NaN" + ("" if self.params.only_nan else f", {infs} inf")
                self.violation(step, f"{name}: {what} value(s)", tensor=name, nan=nans, inf=infs)
                fired = True
        return fired


# --- AllZero -------------------------------------------------------------------------------


@dataclass(frozen=True)
class AllZeroParams(SelectionParams):
    threshold: float = 100.0
    patience: int = 1

    def validate(self, owner: str) -> None:
        require(owner, "threshold", self.threshold, 0 < self.threshold <= 100, "a percentage in (0, 100]")
        require(owner, "patience", self.patience, self.patience >= 1, ">= 1")


class AllZero(_SelectingRule):
    """Fires when at least `threshold` percent (default 100) of a tensor's values are zero
    at `patience` (1) saved steps in a row.
    Inspects `collection_names` / `tensor_regex`, or every tensor when neither is given.
    Without the raw value, an abs max of 0 counts as all zero."""

    Params = AllZeroParams
    params: AllZeroParams
    # Weights only, and only when they stay zero: a zero-initialised gamma (ResNet's
    # zero_init_residual) or bias is healthy; weights that never leave zero are not.
    preset = {"collection_names": ("weights",), "patience": 3}

    def __init__(self, base_trial: Trial, **kwargs: Any):
        super().__init__(base_trial, **kwargs)
        self._zero_run: dict[str, int] = {}

    def required_tensors(self, step: int):
        return [TensorRequest(n, step) if self.has_raw(n, step) else TensorRequest(n, step, "max", True) for n in self.tensors()]

    def invoke_at_step(self, step: int) -> bool:
        fired = False
        for name in self.tensors():
            if self.has_raw(name, step):
                value = self.value(name, step)
                if value is None or value.size == 0 or value.dtype.kind not in "fciub":
                    continue
                if self.params.threshold >= 100 and value.any():
                    self._zero_run[name] = 0  # not all zero; counting would tell no more
                    continue
                percent = float(100.0 * (value.size - np.count_nonzero(value)) / value.size)
            else:
                abs_max = self.reduction(name, step, "max", abs=True)
                if abs_max is None:
                    continue
                percent = 100.0 if abs_max == 0 else 0.0
            run = self._zero_run[name] = self._zero_run.get(name, 0) + 1 if percent >= self.params.threshold else 0
            if run >= self.params.patience:
                held = f" for {run} saved steps" if self.params.patience > 1 else ""
                self.violation(step, f"{name}: {percent:.1f}% zeros >= {self.params.threshold:g}%{held}", tensor=name, value=percent, threshold=self.params.threshold)
                fired = True
        return fired


# --- UnchangedTensor -----------------------------------------------------------------------


@dataclass(frozen=True)
class UnchangedTensorParams(SelectionParams):
    num_steps: int = 3
    rtol: float = 1e-5
    atol: float = 1e-8
    equal_nan: bool = False

    def validate(self, owner: str) -> None:
        require(owner, "num_steps", self.num_steps, self.num_steps >= 2, ">= 2")


class UnchangedTensor(_SelectingRule):
    """Fires when a tensor is the same (numpy.allclose with `rtol` 1e-5, `atol` 1e-8,
    `equal_nan` False) over its last `num_steps` (default 3) saved training steps, which
    need not be consecutive. Inspects `collection_names` / `tensor_regex`, or every tensor.
    Only TRAIN (and GLOBAL) steps count: nothing is meant to change during evaluation."""

    Params = UnchangedTensorParams
    params: UnchangedTensorParams

    def __init__(self, base_trial: Trial, **kwargs: Any):
        super().__init__(base_trial, **kwargs)
        self._history: dict[str, deque[np.ndarray]] = {}

    def required_tensors(self, step: int):
        if self.mode_of(step)[0] not in TRAINING_MODES:
            return []
        return [TensorRequest(n, step) for n in self.tensors() if self.has_raw(n, step)]

    def invoke_at_step(self, step: int) -> bool:
        if self.mode_of(step)[0] not in TRAINING_MODES:
            return False
        p = self.params
        fired = False
        for name in self.tensors():
            value = self.value(name, step) if self.has_raw(name, step) else None
            if value is None or value.dtype.kind not in "fciub":
                continue
            history = self._history.setdefault(name, deque(maxlen=p.num_steps))
            history.append(np.array(value, copy=True))
            if len(history) < p.num_steps:
                continue
            latest = history[-1]
            if all(old.shape == latest.shape and np.allclose(old, latest, rtol=p.rtol, atol=p.atol, equal_nan=p.equal_nan) for old in list(history)[:-1]):
                self.violation(step, f"{name}: unchanged over its last {p.num_steps} saved steps", tensor=name)
                fired = True
        return fired


# --- TensorVariance ------------------------------------------------------------------------


@dataclass(frozen=True)
class TensorVarianceParams(SelectionParams):
    max_threshold: float | None = None
    min_threshold: float | None = None

    def validate(self, owner: str) -> None:
        if self.max_threshold is None and self.min_threshold is None:
            raise ConfigError(f"{owner}: give max_threshold or min_threshold (or both); neither has a default")
        if self.max_threshold is not None and self.min_threshold is not None:
            require(owner, "max_threshold", self.max_threshold, self.max_threshold >= self.min_threshold, f">= min_threshold ({self.min_threshold})")


class TensorVariance(_SelectingRule):
    """Fires when a tensor's variance is above `max_threshold` or below `min_threshold`
    (no defaults: give at least one). Inspects `collection_names` / `tensor_regex`, or
    every tensor; uses a saved variance reduction when there is one."""

    Params = TensorVarianceParams
    params: TensorVarianceParams

    def required_tensors(self, step: int):
        return [TensorRequest(n, step, "variance") for n in self.tensors()]

    def invoke_at_step(self, step: int) -> bool:
        p = self.params
        fired = False
        for name in self.tensors():
            variance = self.reduction(name, step, "variance")
            if variance is None:
                continue
            if p.max_threshold is not None and variance > p.max_threshold:
                self.violation(step, f"{name}: variance {variance:.3g} > max_threshold {p.max_threshold:g}", tensor=name, variance=variance)
                fired = True
            elif p.min_threshold is not None and variance < p.min_threshold:
                self.violation(step, f"{name}: variance {variance:.3g} < min_threshold {p.min_threshold:g}", tensor=name, variance=variance)
                fired = True
        return fired


# --- WeightUpdateRatio ---------------------------------------------------------------------


@dataclass(frozen=True)
class WeightUpdateRatioParams(RuleParams):
    num_steps: int | None = None
    large_threshold: float = 10.0
    small_threshold: float = 1e-8
    epsilon: float = 1e-9
    skip_frozen: bool = False

    def validate(self, owner: str) -> None:
        if self.num_steps is not None:
            require(owner, "num_steps", self.num_steps, self.num_steps >= 1, ">= 1")
        require(owner, "small_threshold", self.small_threshold, self.small_threshold < self.large_threshold, f"< large_threshold ({self.large_threshold})")


class WeightUpdateRatio(Rule):
    """Fires when the ratio of a weight's update to the weight, ||w_s - w_prev|| /
    (||w_prev|| + epsilon), is above `large_threshold` (10) or below `small_threshold`
    (1e-8); epsilon is 1e-9. w_prev is the previous saved training step, or with
    `num_steps` the earliest saved step >= s - num_steps (skipped when there is none).
    Save weights at close steps (save_interval 1) for a meaningful ratio. Inspects the
    `weights` collection; a weight that was all zero has no meaningful ratio and is skipped.
    With `skip_frozen` (the default set), weights whose gradient (`gradient/<name>`) the job
    never saved while saving others' are frozen on purpose and not judged."""

    Params = WeightUpdateRatioParams
    params: WeightUpdateRatioParams

    def __init__(self, base_trial: Trial, **kwargs: Any):
        super().__init__(base_trial, **kwargs)
        self._history: dict[str, deque[tuple[int, np.ndarray]]] = {}
        self._trained: tuple[list[str], list[str]] | None = None

    # A weight frozen on purpose (fine-tuning a head on a frozen backbone) has an update
    # ratio of 0 by design: judge only the weights that get gradients.
    preset = {"skip_frozen": True}

    def _weights(self) -> list[str]:
        weights = self.select_tensors(("weights",), WEIGHT_REGEX)
        if not self.params.skip_frozen:
            return weights
        if self._trained is not None and self._trained[0] is weights:  # same selection as before
            return self._trained[1]
        gradients = {n[len("gradient/") :] for n in self.trial.tensor_names() if n.startswith("gradient/")}
        # The job saved gradients: a weight without one is frozen.
        trained = [w for w in weights if w in gradients] if gradients else weights
        self._trained = (weights, trained)
        return trained

    def has_inputs(self) -> bool:
        return bool(self._weights())

    def required_tensors(self, step: int):
        if self.mode_of(step)[0] not in TRAINING_MODES:
            return []
        return [TensorRequest(n, step) for n in self._weights() if self.has_raw(n, step)]

    def _previous(self, history: deque[tuple[int, np.ndarray]], step: int) -> tuple[int, np.ndarray] | None:
        if not history:
            return None
        if self.params.num_steps is None:
            return history[-1]
        for old_step, old in history:
            if old_step >= step - self.params.num_steps:
                return old_step, old
        return None

    def invoke_at_step(self, step: int) -> bool:
        if self.mode_of(step)[0] not in TRAINING_MODES:
            return False
        p = self.params
        fired = False
        for name in self._weights():
            value = self.value(name, step) if self.has_raw(name, step) else None
            if value is None or not _is_float(value):
                continue
            history = self._history.setdefault(name, deque())
            previous = self._previous(history, step)
            history.append((step, np.array(value, dtype=np.float64, copy=True)))
            window = p.num_steps or 0
            while len(history) > 1 and (p.num_steps is None or history[0][0] < step - window):
                history.popleft()
            if previous is None or previous[1].shape != value.shape:
                continue
            prev_norm = float(np.linalg.norm(previous[1]))
            if prev_norm == 0.0:
                continue
            ratio = float(np.linalg.norm(value - previous[1])) / (prev_norm + p.epsilon)
            if ratio > p.large_threshold or ratio < p.small_threshold:
                bound = f"> large_threshold {p.large_threshold:g}" if ratio > p.large_threshold else f"< small_threshold {p.small_threshold:g}"
                self.violation(step, f"{name}: update/weight ratio {ratio:.3g} {bound} (vs step {previous[0]})", tensor=name, ratio=ratio, previous_step=previous[0])
                fired = True
        return fired


# --- SimilarAcrossRuns ---------------------------------------------------------------------


@dataclass(frozen=True)
class SimilarAcrossRunsParams(SelectionParams):
    other_trial: str = ""
    rtol: float = 1e-5
    atol: float = 1e-8

    def validate(self, owner: str) -> None:
        if not self.other_trial:
            raise ConfigError(f"{owner}.other_trial is required (the path or s3:// URL of the run to compare with)")


class SimilarAcrossRuns(_SelectingRule):
    """Fires when a tensor differs (not numpy.allclose, `rtol` 1e-5, `atol` 1e-8) between
    this run and `other_trial` (a path, s3:// URL or Trial) at the same global step.
    Inspects `collection_names` / `tensor_regex`, or every tensor; steps or tensors the other
    run lacks are skipped."""

    Params = SimilarAcrossRunsParams
    params: SimilarAcrossRunsParams

    def __init__(self, base_trial: Trial, other_trial: str | Trial = "", **kwargs: Any):
        other = other_trial if isinstance(other_trial, Trial) else None
        super().__init__(base_trial, other_trial=other.path if other is not None else other_trial, **kwargs)
        self.other = other if other is not None else create_trial(self.params.other_trial)

    def required_tensors(self, step: int):
        return [TensorRequest(n, step) for n in self.tensors() if self.has_raw(n, step)]

    def invoke_at_step(self, step: int) -> bool:
        if step not in self.other.steps() and not self.other.is_complete():
            self.other.refresh()
        p = self.params
        fired = False
        for name in self.tensors():
            if not self.has_raw(name, step):
                continue
            mine = self.value(name, step)
            theirs = self.value(name, step, trial=self.other)
            if mine is None or theirs is None:
                continue
            same = mine.shape == theirs.shape and (
                np.allclose(mine, theirs, rtol=p.rtol, atol=p.atol) if _is_float(mine) or _is_float(theirs) else np.array_equal(mine, theirs)
            )
            if not same:
                diff = float(np.max(np.abs(mine.astype(np.float64) - theirs.astype(np.float64)))) if mine.shape == theirs.shape else None
                self.violation(step, f"{name}: differs from {self.other.name}" + (f" (max |diff| {diff:.3g})" if diff is not None else " (shape)"), tensor=name, max_abs_diff=diff)
                fired = True
        return fired
