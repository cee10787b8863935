"""Built-in rules over single tensors and their history: VanishingGradient, ExplodingTensor,
AllZero, UnchangedTensor, TensorVariance, WeightUpdateRatio, SimilarAcrossRuns."""

from __future__ import annotations

import bisect
import re
from collections import deque
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..capture.scopes import WHOLE_JOB, ScopeMap, parameter_of
from ..exceptions import ConfigError
from ..health import TRAINING_MODES, training_steps, update_ratio
from ..trial import Trial, create_trial
from .base import Rule, RuleParams, TensorRequest, require
from .params import ranged

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


def _training_values(rule: Rule, names: list[str], step: int, kinds: str) -> list[tuple[str, np.ndarray]]:
    """(name, raw value) of each of `names` saved at `step` with a dtype kind in `kinds`; none
    at a step outside the training modes."""
    if rule.mode_of(step)[0] not in TRAINING_MODES:
        return []
    values = ((name, rule.value(name, step) if rule.has_raw(name, step) else None) for name in names)
    return [(name, value) for name, value in values if value is not None and value.dtype.kind in kinds]


# --- VanishingGradient ---------------------------------------------------------------------


@dataclass(frozen=True)
class VanishingGradientParams(RuleParams):
    threshold: float = ranged(1e-7, "non_negative")
    relative_threshold: float = 0.0
    skip_kinds: tuple[str, ...] = ()
    patience: int = ranged(1, "positive_int")
    healthy_update_ratio: float = ranged(0.0, "non_negative")  # 0: not used
    floor_ratio: float = 0.0

    def validate(self, owner: str) -> None:
        require(owner, "floor_ratio", self.floor_ratio, 0 <= self.floor_ratio < 1, "in [0, 1) (0: not used)")
        require(owner, "relative_threshold", self.relative_threshold, 0 <= self.relative_threshold < 1, "in [0, 1)")
        bad = [k for k in self.skip_kinds if k not in PARAMETER_KINDS]
        require(owner, "skip_kinds", self.skip_kinds, not bad, f"kinds among {', '.join(PARAMETER_KINDS)}")


PARAMETER_KINDS = ("matrix", "vector", "bias", "norm", "embedding", "attention", "head")

# Query/key projections: names of torch (q_proj, k_proj, query, key; MultiheadAttention's
# packed in_proj_weight), Hugging Face (q_lin, k_lin, attn.c_attn) and Keras
# MultiHeadAttention (query/kernel, key/kernel).
_ATTENTION = re.compile(r"(^|[._/])(q|k|query|key|q_proj|k_proj|q_lin|k_lin|in_proj_weight|in_proj|c_attn|qkv|wq|wk)([._/]|$)")
_HEAD = re.compile(r"(^|[._/])(head|heads|lm_head|classifier|cls|logits|output_layer|fc_out|predictions)([._/]|$)")


def parameter_kind(name: str, module_class: str | None, ndim: int | None) -> str:
    """The role of a parameter (of a weight, or of the gradient of one): "embedding"
    (lookup tables: only the rows used in a batch get a gradient), "norm"
    (BatchNorm/LayerNorm scales and shifts), "attention" (query/key projections: their
    gradient is small by construction early in training and under softmax saturation),
    "head" (the output layer), "bias", "vector" (other 1-D parameters), "matrix" (dense,
    convolution and recurrent weights)."""
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
    if _ATTENTION.search(lowered):
        return "attention"
    if _HEAD.search(lowered):
        return "head"
    return "matrix"


class VanishingGradient(Rule):
    """Fires when the mean of the absolute values of a gradient drops below `threshold`
    (default 1e-7), or, with `relative_threshold` > 0, below that fraction of the largest
    mean |gradient| among the judged gradients of the same step and the same scope (the
    layer-to-layer decay that defines vanishing gradients, independent of the loss's
    scale; a scope is one network or one optimizer's parameters as the hook declared them,
    so a GAN's generator is never compared with its discriminator). With `patience` N
    (SageMaker: 1) a layer fires only when it stays below at N saved steps in a row: a
    gradient that is small at initialisation and grows is not vanishing. With
    `healthy_update_ratio` r > 0, a layer whose weights (saved in the weights collection)
    moved by more than r of their norm per step since their previous saved step is learning
    and is not judged vanishing (adaptive optimizers move small gradients fine), unless its
    mean |gradient| is below `floor_ratio` of its scope's largest: Adam and its kin move
    every weight at about the learning rate whatever its gradient, so motion there says
    nothing, and a layer whose gradient is 1e-7 of its network's largest changes the loss
    1e7 times less per unit of motion than that layer: it is disconnected. Gradients
    of the kinds in `skip_kinds` ("bias", "vector", "norm", "embedding", "attention",
    "head") are not judged: a conv bias before BatchNorm has a zero gradient by design, an
    embedding table's unused rows get none, and attention query/key projections start
    small. Inspects the `gradients` collection (tensors named `gradient*` in jobs without a
    collections file); uses the saved abs_mean reduction when there is one."""

    params: VanishingGradientParams
    # Judge weight matrices only, against the other layers of the same network, over time,
    # and together with how fast the weights move: deep sigmoid stacks sit at 1e-8 of
    # their last layer and never move; healthy MLPs, CNNs, RNNs and transformers sit above
    # 1e-2, or move at 1e-4 of their norm per step or more.
    preset = {
        "relative_threshold": 1e-3, "skip_kinds": ("bias", "vector", "norm", "embedding", "attention"),
        "patience": 3, "healthy_update_ratio": 1e-4,
        # float32's machine epsilon: a deep sigmoid stack's first layer under Adam sits at
        # 5e-9-2e-8 of its network's largest gradient while Adam moves it at 3e-3 per step.
        "floor_ratio": float(np.finfo(np.float32).eps),
    }
    to_save = "gradients and weights"

    def __init__(self, base_trial: Trial, **kwargs: Any):
        super().__init__(base_trial, **kwargs)
        self._kinds: dict[str, str] = {}
        self._groups: ScopeMap | None = None
        self._below: dict[str, int] = {}  # saved steps in a row below the threshold
        self._judged_steps = 0
        self._non_finite_steps = 0  # TRAIN steps whose saved gradients were all NaN/inf
        self._weight_steps: dict[str, list[int]] = {}

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

    def _group(self, name: str) -> str:
        if self._groups is None:
            self._groups = self.trial.scope_map()
        return self._groups.group_of(name)

    def invoke_at_step(self, step: int) -> bool | None:
        p = self.params
        if self.mode_of(step)[0] not in TRAINING_MODES:
            return False
        by_scope: dict[str, dict[str, float]] = {}
        non_finite = False
        for name in self._gradients():
            if p.skip_kinds and self._kind(name, step) in p.skip_kinds:
                continue
            abs_mean = self.reduction(name, step, "mean", abs=True)
            if abs_mean is not None and np.isfinite(abs_mean):
                by_scope.setdefault(self._group(name), {})[name] = abs_mean
            elif abs_mean is not None:
                non_finite = True
        if not by_scope:
            self._non_finite_steps += non_finite
            return False
        self._judged_steps += 1
        for scope, judged in by_scope.items():
            self._judge_scope(step, scope, judged)
        return None  # fired follows from the violations reported

    def _judge_scope(self, step: int, scope: str, judged: dict[str, float]) -> None:
        p = self.params
        largest_name = max(judged, key=judged.__getitem__)
        largest = judged[largest_name]
        in_scope = f" in {scope}" if scope != WHOLE_JOB else ""
        for name, abs_mean in judged.items():
            absolute = abs_mean < p.threshold
            relative = bool(p.relative_threshold) and largest > 0 and abs_mean / largest < p.relative_threshold
            if not (absolute or relative):
                self._below[name] = 0
                continue
            moving = self._update_ratio(name, step) if p.healthy_update_ratio else None
            disconnected = largest > 0 and abs_mean / largest < p.floor_ratio
            if moving is not None and moving >= p.healthy_update_ratio and not disconnected:
                self._below[name] = 0  # small gradient, weights still learning
                continue
            run = self._below[name] = self._below.get(name, 0) + 1
            if run < p.patience:
                continue
            held = f" for {run} saved steps" if p.patience > 1 else ""
            moved = f"; its weights moved {moving:.2g} of their norm per step" if moving is not None else ""
            if disconnected and moving is not None and moving >= p.healthy_update_ratio:
                moved += f" (under {p.floor_ratio:.3g} of the largest, motion is an adaptive optimizer's, not the loss's)"
            if absolute:
                self.violation(
                    step, f"{name}: mean |gradient| {abs_mean:.3g} < {p.threshold:g}{held}{moved}",
                    tensor=name, value=abs_mean, threshold=p.threshold, abs_mean=abs_mean, scope=scope, update_ratio=moving,
                )
            else:
                ratio = abs_mean / largest
                self.violation(
                    step, f"{name}: mean |gradient| {abs_mean:.3g} is {ratio:.2g} of the largest{in_scope} ({largest_name}: {largest:.3g}) "
                    f"< {p.relative_threshold:g}{held}{moved}",
                    tensor=name, value=ratio, threshold=p.relative_threshold, abs_mean=abs_mean, largest=largest_name, scope=scope, update_ratio=moving,
                )

    def _update_ratio(self, gradient: str, step: int) -> float | None:
        """The weight-update ratio (stepscope.health.update_ratio) of the weight of `gradient`
        against its previous saved TRAIN step, divided by the steps between them; None when
        the weights were not saved at both."""
        weight = parameter_of(gradient)
        if weight == gradient or not self.trial.has_tensor(weight):
            return None
        steps = self._weight_steps.get(weight)
        if steps is None or (steps and steps[-1] < step):
            steps = self._weight_steps[weight] = training_steps(self.trial, weight)
        at = bisect.bisect_left(steps, step)
        if at >= len(steps) or steps[at] != step or at == 0:
            return None
        previous = steps[at - 1]
        ratio = update_ratio(self.value(weight, previous), self.value(weight, step))
        return None if ratio is None else ratio / (step - previous)

    def finish(self) -> None:
        self.need(self.params.patience, self._judged_steps, "saved TRAIN steps with gradients", non_finite=self._non_finite_steps, finite_what="gradients")


# --- ExplodingTensor -----------------------------------------------------------------------


@dataclass(frozen=True)
class ExplodingTensorParams(SelectionParams):
    only_nan: bool = False


class ExplodingTensor(_SelectingRule):
    """Fires when a tensor holds NaN, or (unless `only_nan`, default False) an infinity.
    Inspects `collection_names` / `tensor_regex`, or every tensor when neither is given.
    When only reductions were saved, a NaN or infinite min/max/mean gives it away."""

    params: ExplodingTensorParams
    min_saved_steps = 1
    to_save = "any tensors"
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
    patience: int = ranged(1, "positive_int")

    def validate(self, owner: str) -> None:
        require(owner, "threshold", self.threshold, 0 < self.threshold <= 100, "a percentage in (0, 100]")


class AllZero(_SelectingRule):
    """Fires when at least `threshold` percent (default 100) of a tensor's values are zero
    at `patience` (1) saved steps in a row.
    Inspects `collection_names` / `tensor_regex`, or every tensor when neither is given.
    Without the raw value, an abs max of 0 counts as all zero."""

    params: AllZeroParams
    to_save = "weights"

    def finish(self) -> None:
        self.need(self.params.patience, len(self._data_steps), "saved steps")
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

    params: UnchangedTensorParams
    to_save = "the tensors it inspects"

    def finish(self) -> None:
        self.need(self.params.num_steps, len(self._data_steps), "saved TRAIN steps")

    def __init__(self, base_trial: Trial, **kwargs: Any):
        super().__init__(base_trial, **kwargs)
        self._history: dict[str, deque[np.ndarray]] = {}

    def required_tensors(self, step: int):
        if self.mode_of(step)[0] not in TRAINING_MODES:
            return []
        return [TensorRequest(n, step) for n in self.tensors() if self.has_raw(n, step)]

    def invoke_at_step(self, step: int) -> bool:
        p = self.params
        fired = False
        for name, value in _training_values(self, self.tensors(), step, "fciub"):
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

    params: TensorVarianceParams
    min_saved_steps = 1
    to_save = "the tensors it inspects"

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
    num_steps: int | None = ranged(None, "positive_int")
    large_threshold: float = 10.0
    small_threshold: float = 1e-8
    epsilon: float = 1e-9
    skip_frozen: bool = False

    def validate(self, owner: str) -> None:
        require(owner, "small_threshold", self.small_threshold, self.small_threshold < self.large_threshold, f"< large_threshold ({self.large_threshold})")


# Saved steps in a row without any weight moving that may still be a gradient-accumulation
# gap (each forward a step, an update every few) before the rule judges them.
MIN_STALL_PAIRS = 8


class WeightUpdateRatio(Rule):
    """Fires when the weight-update ratio (stepscope.health.update_ratio: ||w_s - w_prev|| /
    max(||w_prev||, 1e-3 * sqrt(n)); SageMaker's `epsilon` is accepted and not used) is
    above `large_threshold` (10) or below `small_threshold` (1e-8). w_prev is the previous
    saved TRAIN step, or with `num_steps` the earliest saved step >= s - num_steps (skipped
    when there is none).
    Save weights at close steps (save_interval 1) for a meaningful ratio. Inspects the
    `weights` collection; a weight that was all zero has no meaningful ratio and is skipped.
    With `skip_frozen` (the default set), weights whose gradient (`gradient/<name>`) the job
    never saved while saving others' are frozen on purpose and not judged. Saved steps between
    which no judged weight moved at all are a gradient-accumulation gap while their run is
    no longer than twice the longest gap seen between updates (and MIN_STALL_PAIRS): judged
    only beyond that, or at the end of a job whose weights never moved."""

    params: WeightUpdateRatioParams
    to_save = "weights"

    def __init__(self, base_trial: Trial, **kwargs: Any):
        super().__init__(base_trial, **kwargs)
        self._history: dict[str, deque[tuple[int, np.ndarray]]] = {}
        self._trained: tuple[list[str], list[str]] | None = None
        self._ratios = 0  # update ratios computed (pairs of saved weights)
        # Saved steps between which no judged weight moved at all (bitwise): the violations
        # they would give, held (`_held_run`) while they may be a gradient-accumulation gap.
        self._held_run: list[tuple[int, list[tuple[str, float, int]]]] = []
        self._longest_gap = 0  # the longest such run followed by an update, so far
        self._updated = False  # some saved step's weights moved
        self._stalled = False  # the current run is past its bound: its pairs fire at once

    def finish(self) -> None:
        if not self._updated:  # (the weights never moved: not accumulation)
            self._release_held()
        self.need(1, self._ratios, "update ratios (weights saved at 2 TRAIN steps)")

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
        p = self.params
        pairs: list[tuple[str, float, int]] = []  # (weight, ratio, previous step)
        for name, value in _training_values(self, self._weights(), step, "fc"):
            history = self._history.setdefault(name, deque())
            previous = self._previous(history, step)
            history.append((step, np.array(value, dtype=np.float64, copy=True)))
            while len(history) > 1 and (p.num_steps is None or history[0][0] < step - p.num_steps):
                history.popleft()
            ratio = None if previous is None else update_ratio(previous[1], value)
            if previous is None or ratio is None:
                continue
            self._ratios += 1
            pairs.append((name, ratio, previous[0]))
        if pairs and all(ratio == 0.0 for _, ratio, _ in pairs):
            # No judged weight moved since the previous saved step. A loop that accumulates
            # gradients over several forwards, each a step (a torch hook without a registered
            # optimizer, as smdebug counted steps), has such steps between its updates: held
            # while the run is no longer than twice the longest gap seen between updates
            # (and MIN_STALL_PAIRS), then judged; a job whose weights never move is judged
            # at its end at the latest (a learning rate of 0).
            self._held_run.append((step, pairs))
            if self._stalled or len(self._held_run) >= max(MIN_STALL_PAIRS, 2 * self._longest_gap + 1):
                self._stalled = True
                return self._release_held()
            return False
        if pairs:
            if self._held_run:
                self._longest_gap = max(self._longest_gap, len(self._held_run))
            self._held_run, self._updated, self._stalled = [], True, False
        return self._judge(step, pairs)

    def _judge(self, step: int, pairs: list[tuple[str, float, int]]) -> bool:
        p = self.params
        fired = False
        for name, ratio, previous_step in pairs:
            if ratio > p.large_threshold or ratio < p.small_threshold:
                bound = f"> large_threshold {p.large_threshold:g}" if ratio > p.large_threshold else f"< small_threshold {p.small_threshold:g}"
                self.violation(step, f"{name}: update/weight ratio {ratio:.3g} {bound} (vs step {previous_step})", tensor=name, ratio=ratio, previous_step=previous_step)
                fired = True
        return fired

    def _release_held(self) -> bool:
        held, self._held_run = self._held_run, []
        fired = False
        for step, pairs in held:
            fired = self._judge(step, pairs) or fired
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

    params: SimilarAcrossRunsParams
    min_saved_steps = 1
    to_save = "the same tensors at the same steps in both runs"

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
