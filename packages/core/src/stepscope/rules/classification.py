"""Built-in rules over labels and predictions: ClassImbalance, Confusion."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ..trial import Trial
from .base import Rule, RuleParams, TensorRequest, require
from .params import ranged


def as_classes(labels: np.ndarray, predictions: np.ndarray, argmax: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """Flat integer class ids of labels and predictions; predictions given as scores (one
    more axis than the labels, or `argmax`) are reduced with argmax over the last axis.
    One-hot labels are reduced the same way."""
    if argmax or predictions.ndim == labels.ndim + 1:
        predictions = np.argmax(predictions, axis=-1)
    if labels.ndim == predictions.ndim + 1:
        labels = np.argmax(labels, axis=-1)
    labels = np.asarray(labels).reshape(-1).astype(np.int64)
    predictions = np.asarray(predictions).reshape(-1).astype(np.int64)
    if labels.shape != predictions.shape:
        raise ValueError(f"labels ({labels.shape[0]}) and predictions ({predictions.shape[0]}) do not pair up")
    return labels, predictions


class _PairRule(Rule):
    """Reads one labels tensor and one predictions tensor per step."""

    def _pair(self) -> tuple[str, str] | None:
        raise NotImplementedError

    def has_inputs(self) -> bool:
        return self._pair() is not None

    def required_tensors(self, step: int):
        pair = self._pair()
        return [TensorRequest(n, step) for n in pair] if pair else []

    def _values(self, step: int) -> tuple[np.ndarray, np.ndarray] | None:
        pair = self._pair()
        if pair is None or not all(self.has_raw(n, step) for n in pair):
            return None
        labels, predictions = (self.value(n, step) for n in pair)
        if labels is None or predictions is None:
            return None
        return labels, predictions


@dataclass(frozen=True)
class ClassImbalanceParams(RuleParams):
    threshold_imbalance: float = 10.0
    threshold_misprediction: float = ranged(0.7, "fraction")
    samples: int = ranged(500, "positive_int")
    argmax: bool = False
    labels_regex: str = ".*labels"
    predictions_regex: str = ".*predictions"

    def validate(self, owner: str) -> None:
        require(owner, "threshold_imbalance", self.threshold_imbalance, self.threshold_imbalance >= 1, ">= 1")


class ClassImbalance(_PairRule):
    """Counts labels per class over the run; once `samples` (500) labels were seen, fires
    when the largest class has more than `threshold_imbalance` (10) times the samples of the
    smallest, or when the fraction of a class's samples that were mispredicted exceeds
    `threshold_misprediction` (0.7). Labels and predictions are the first tensors matching
    `labels_regex` (`.*labels`) and `predictions_regex` (`.*predictions`); scores are
    reduced with argmax (`argmax`, or automatically when they have a class axis)."""

    params: ClassImbalanceParams
    to_save = "labels and predictions"

    def finish(self) -> None:
        self.need(self.params.samples, sum(self._counts.values()), "labels")

    def __init__(self, base_trial: Trial, **kwargs: Any):
        super().__init__(base_trial, **kwargs)
        self._counts: dict[int, int] = {}
        self._wrong: dict[int, int] = {}

    def _pair(self) -> tuple[str, str] | None:
        labels = self.select_tensors((), (self.params.labels_regex,), all_when_empty=False)
        predictions = self.select_tensors((), (self.params.predictions_regex,), all_when_empty=False)
        return (labels[0], predictions[0]) if labels and predictions else None

    def invoke_at_step(self, step: int) -> bool:
        values = self._values(step)
        if values is None:
            return False
        labels, predictions = as_classes(*values, argmax=self.params.argmax)
        classes, counts = np.unique(labels, return_counts=True)
        for cls, count in zip(classes.tolist(), counts.tolist()):
            self._counts[cls] = self._counts.get(cls, 0) + count
            self._wrong[cls] = self._wrong.get(cls, 0) + int(np.count_nonzero(predictions[labels == cls] != cls))
        if sum(self._counts.values()) < self.params.samples:
            return False
        fired = False
        largest, smallest = max(self._counts.values()), min(self._counts.values())
        if largest / smallest > self.params.threshold_imbalance:
            self.violation(step, f"class imbalance {largest / smallest:.3g} > {self.params.threshold_imbalance:g} (samples per class {dict(sorted(self._counts.items()))})", counts=self._counts)
            fired = True
        for cls in sorted(self._counts):
            rate = self._wrong[cls] / self._counts[cls]
            if rate > self.params.threshold_misprediction:
                self.violation(step, f"class {cls}: {rate:.0%} mispredicted > {self.params.threshold_misprediction:g}", label=cls, misprediction=rate)
                fired = True
        return fired


@dataclass(frozen=True)
class ConfusionParams(RuleParams):
    category_no: int | None = None
    labels: str | None = None
    predictions: str | None = None
    labels_collection: str = "labels"
    predictions_collection: str = "predictions"
    min_diag: float = ranged(0.9, "fraction")
    max_off_diag: float = ranged(0.1, "fraction")

    def validate(self, owner: str) -> None:
        if self.category_no is not None:
            require(owner, "category_no", self.category_no, self.category_no >= 2, ">= 2")


class Confusion(_PairRule):
    """Builds the confusion matrix of each step's (labels, predictions) and fires when a
    class's share of correct predictions, confusion[i][i] / sum_j confusion[i][j], is
    below `min_diag` (0.9), or when a true class j makes up more than `max_off_diag` (0.1)
    of the predictions of another class i, confusion[j][i] / sum_j confusion[j][i].
    `category_no` defaults to the largest class id seen + 1. Labels and predictions are the
    tensors named `labels` / `predictions` (exact name or regex), else the first of the
    `labels_collection` / `predictions_collection` collections, else those matching
    `.*labels` / `.*predictions`."""

    params: ConfusionParams
    min_saved_steps = 1
    to_save = "labels and predictions"

    def _find(self, exact: str | None, collection: str, fallback: str) -> str | None:
        names = self.trial.tensor_names()
        if exact:
            if exact in names:
                return exact
            found = self.select_tensors((), (exact,), all_when_empty=False)
            return found[0] if found else None
        found = self.select_tensors((collection,), (), all_when_empty=False) if collection in self.trial.collections() else []
        found = found or self.select_tensors((), (fallback,), all_when_empty=False)
        return found[0] if found else None

    def _pair(self) -> tuple[str, str] | None:
        p = self.params
        labels = self._find(p.labels, p.labels_collection, ".*labels")
        predictions = self._find(p.predictions, p.predictions_collection, ".*predictions")
        return (labels, predictions) if labels and predictions else None

    def invoke_at_step(self, step: int) -> bool:
        values = self._values(step)
        if values is None:
            return False
        labels, predictions = as_classes(*values)
        if labels.size == 0:
            return False
        size = self.params.category_no or int(max(labels.max(), predictions.max())) + 1
        keep = (labels >= 0) & (labels < size) & (predictions >= 0) & (predictions < size)
        matrix = np.zeros((size, size), dtype=np.int64)
        np.add.at(matrix, (labels[keep], predictions[keep]), 1)
        fired = False
        rows, cols = matrix.sum(axis=1), matrix.sum(axis=0)
        for i in range(size):
            if rows[i] and matrix[i, i] / rows[i] < self.params.min_diag:
                self.violation(step, f"class {i}: {matrix[i, i] / rows[i]:.2f} of its samples predicted right < min_diag {self.params.min_diag:g}", label=i, diag=matrix[i, i] / rows[i])
                fired = True
            for j in range(size):
                if j != i and cols[i] and matrix[j, i] / cols[i] > self.params.max_off_diag:
                    self.violation(step, f"predictions of class {i}: {matrix[j, i] / cols[i]:.2f} are class {j} > max_off_diag {self.params.max_off_diag:g}", label=j, predicted=i, off_diag=matrix[j, i] / cols[i])
                    fired = True
        return fired
