"""Built-in rules over a model's input data: CheckInputImages, NLPSequenceRatio."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ..trial import Trial
from .base import Rule, RuleParams, TensorRequest, require
from .params import ranged


@dataclass(frozen=True)
class CheckInputImagesParams(RuleParams):
    threshold_mean: float = ranged(0.2, "non_negative")
    threshold_samples: int = ranged(500, "positive_int")
    regex: str = ".*hybridsequential0_input_0"
    channel: int = 1


class CheckInputImages(Rule):
    """Checks that input images are normalized: once `threshold_samples` (500) images were
    seen, fires when the mean of some channel over all images so far differs from 0 by more
    than `threshold_mean` (0.2). Images are the first tensor matching `regex` (smdebug's
    MXNet default `.*hybridsequential0_input_0`: set it to your input's name, e.g.
    `.*model_input_0`), batch first, channels on axis `channel` (1: NCHW; 3 or -1: NHWC)."""

    params: CheckInputImagesParams
    min_saved_steps = 1
    to_save = "model inputs"

    def __init__(self, base_trial: Trial, **kwargs: Any):
        super().__init__(base_trial, **kwargs)
        self._sums: np.ndarray | None = None
        self._pixels = 0
        self._images = 0

    def _input(self) -> str | None:
        found = self.select_tensors((), (self.params.regex,), all_when_empty=False)
        return found[0] if found else None

    def required_tensors(self, step: int):
        name = self._input()
        return [TensorRequest(name, step)] if name and self.has_raw(name, step) else []

    def invoke_at_step(self, step: int) -> bool:
        name = self._input()
        value = self.value(name, step) if name and self.has_raw(name, step) else None
        if value is None or value.ndim < 2 or value.size == 0:
            return False
        images = np.moveaxis(value.astype(np.float64), self.params.channel, -1)
        per_channel = images.reshape(-1, images.shape[-1])
        if self._sums is None or self._sums.shape != (per_channel.shape[1],):
            self._sums, self._pixels, self._images = np.zeros(per_channel.shape[1]), 0, 0
        self._sums += per_channel.sum(axis=0)
        self._pixels += per_channel.shape[0]
        self._images += value.shape[0]
        if self._images < self.params.threshold_samples:
            return False
        means = self._sums / self._pixels
        worst = int(np.argmax(np.abs(means)))
        if abs(means[worst]) > self.params.threshold_mean:
            self.violation(
                step, f"{name}: channel {worst} mean {means[worst]:.3g} over {self._images} images differs from 0 by more than {self.params.threshold_mean:g} (not normalized?)",
                tensor=name, channel_means=means, images=self._images,
            )
            return True
        return False


@dataclass(frozen=True)
class NLPSequenceRatioParams(RuleParams):
    tensor_regex: tuple[str, ...] = (".*embedding0_input_0",)
    token_values: tuple[float, ...] = (0.0,)
    token_thresholds_percent: tuple[float, ...] = (50.0, 50.0)

    def validate(self, owner: str) -> None:
        require(owner, "token_values", self.token_values, len(self.token_values) >= 1, "at least one token value")
        require(owner, "token_thresholds_percent", self.token_thresholds_percent, len(self.token_thresholds_percent) >= 1, "at least one threshold")
        for value in self.token_thresholds_percent:
            require(owner, "token_thresholds_percent", value, 0 <= value <= 100, "percentages in [0, 100]")


class NLPSequenceRatio(Rule):
    """Fires when a token (`token_values`, default 0: padding) makes up more than its
    threshold percent (`token_thresholds_percent`, default 50,50; the i-th threshold goes
    with the i-th token, the last one with any extra tokens) of a step's input sequences.
    Inspects tensors matching `tensor_regex` (`.*embedding0_input_0`: the embedding's input)."""

    params: NLPSequenceRatioParams
    min_saved_steps = 1
    to_save = "model inputs"

    def _inputs(self) -> list[str]:
        return self.select_tensors((), self.params.tensor_regex, all_when_empty=False)

    def required_tensors(self, step: int):
        return [TensorRequest(n, step) for n in self._inputs() if self.has_raw(n, step)]

    def invoke_at_step(self, step: int) -> bool:
        thresholds = self.params.token_thresholds_percent
        fired = False
        for name in self._inputs():
            value = self.value(name, step) if self.has_raw(name, step) else None
            if value is None or value.size == 0:
                continue
            for i, token in enumerate(self.params.token_values):
                threshold = thresholds[min(i, len(thresholds) - 1)]
                percent = 100.0 * float(np.count_nonzero(value == token)) / value.size
                if percent > threshold:
                    self.violation(step, f"{name}: token {token:g} is {percent:.1f}% of the sequence > {threshold:g}%", tensor=name, token=token, percent=percent)
                    fired = True
        return fired
