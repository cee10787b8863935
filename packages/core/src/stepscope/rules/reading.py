"""How rules read tensors: one interface (`value`, `reduction` of a tensor at a global
step, None when not saved), a direct reader and the engine's cache shared by the rules of
one run. Reductions follow `stepscope.reductions.saved_or_computed`, as `Trial` does."""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from ..exceptions import StepNotYetAvailable, StepUnavailable, TensorUnavailable, TensorUnavailableForStep
from ..reductions import saved_names, saved_or_computed

if TYPE_CHECKING:
    from ..trial import Trial

MISSING = (TensorUnavailable, TensorUnavailableForStep, StepUnavailable, StepNotYetAvailable)


@dataclass(frozen=True)
class TensorRequest:
    """A value a rule will read at a step: the raw tensor, or one of its reductions."""

    name: str
    step: int
    reduction: str | None = None
    abs: bool = False


class TensorReader:
    """Reads values straight from the trial, nothing kept. Rules get this unless the
    engine gives them its shared `ReadCache`."""

    def value(self, trial: Trial, name: str, step: int) -> np.ndarray | None:
        """The raw value of `name` at global `step`, or None when it was not saved."""
        if not trial.has_tensor(name):
            return None
        try:
            return trial.tensor(name).value(step)
        except MISSING:
            return None

    def reduction(self, trial: Trial, name: str, step: int, reduction: str, abs: bool = False) -> float | None:
        """The saved reduction, else computed from the raw value; None when neither was saved."""
        return saved_or_computed(lambda n: self.value(trial, n, step), name, reduction, abs)

    def has_value(self, trial: Trial, name: str, step: int) -> bool:
        """Whether the raw value of `name` was saved at global `step`."""
        return trial.has_tensor(name) and trial.tensor(name).has_value(step)

    def start_step(self, step: int) -> None:
        """Called by the engine before the rules of `step` run."""

    def prefetch(self, trial: Trial, requests: Iterable[TensorRequest]) -> None:
        """Read ahead what `requests` will need (a no-op here)."""


class ReadCache(TensorReader):
    """Raw values and reductions read at the last `keep_steps` steps, keyed by trial, tensor
    and global step, so each value is read once per step however many rules look at it.
    Rules that need older values keep them themselves."""

    def __init__(self, keep_steps: int = 2):
        self.keep_steps = keep_steps
        self._recent: deque[int] = deque(maxlen=keep_steps)
        self._values: dict[tuple[int, str, int], np.ndarray | None] = {}
        self._reductions: dict[tuple[int, str, int, str, bool], float | None] = {}
        self._has: dict[tuple[int, str, int], bool] = {}
        self._saved_names: dict[tuple[int, str, str, bool], list[str]] = {}
        self.reads = 0  # values fetched from the store (directly or by prefetch)
        self.hits = 0

    def start_step(self, step: int) -> None:
        if step in self._recent:
            return
        self._recent.append(step)
        keep = set(self._recent)
        self._values = {k: v for k, v in self._values.items() if k[2] in keep}
        self._reductions = {k: v for k, v in self._reductions.items() if k[2] in keep}
        self._has = {k: v for k, v in self._has.items() if k[2] in keep}

    def has_value(self, trial: Trial, name: str, step: int) -> bool:
        key = (id(trial), name, step)
        found = self._has.get(key)
        if found is None:
            found = self._has[key] = super().has_value(trial, name, step)
        return found

    def value(self, trial: Trial, name: str, step: int) -> np.ndarray | None:
        key = (id(trial), name, step)
        if key in self._values:
            self.hits += 1
            return self._values[key]
        array = super().value(trial, name, step)
        self.reads += array is not None
        self._values[key] = array
        return array

    def reduction(self, trial: Trial, name: str, step: int, reduction: str, abs: bool = False) -> float | None:
        key = (id(trial), name, step, reduction, abs)
        if key in self._reductions:
            self.hits += 1
        else:
            self._reductions[key] = super().reduction(trial, name, step, reduction, abs)
        return self._reductions[key]

    def prefetch(self, trial: Trial, requests: Iterable[TensorRequest]) -> None:
        """Read every value the requests need that is not cached yet, in one batch."""
        wanted: dict[tuple[str, int], None] = {}
        for request in requests:
            names = [request.name]
            if request.reduction is not None:
                key = (id(trial), request.name, request.reduction, request.abs)
                saved = self._saved_names.get(key)
                if saved is None:
                    # Tensor names only grow; a name saved once stays known.
                    saved = [n for n in saved_names(request.name, request.reduction, request.abs) if trial.has_tensor(n)]
                    if saved:
                        self._saved_names[key] = saved
                names = saved[:1] or names
            for name in names:
                if (id(trial), name, request.step) not in self._values and trial.has_tensor(name):
                    wanted[(name, request.step)] = None
        if not wanted:
            return
        keys = list(wanted)
        arrays = trial.read_many([(name, step, None, None) for name, step in keys])
        for (name, step), array in zip(keys, arrays):
            self._values[(id(trial), name, step)] = array
            self.reads += array is not None


__all__ = ["TensorRequest", "TensorReader", "ReadCache", "MISSING"]
