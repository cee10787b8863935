"""Which tensors and steps an export takes (`--regex`, `--steps A:B` with both ends
included, `--mode`), and the
walk over them: batches of steps read with one `Trial.read_many` each, so an export of a
large job holds one batch in memory, never the job."""

from __future__ import annotations

import logging
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..cli_common import parse_steps
from ..exceptions import ConfigError, StepscopeError
from ..modes import ModeKeys
from ..trial import Trial

logger = logging.getLogger("stepscope")

BATCH_STEPS = 32


@dataclass(frozen=True)
class StepValues:
    """The selected values of one step of one worker."""

    step: int  # global step
    mode: ModeKeys
    mode_step: int
    worker: str
    wall_time: float | None
    values: dict[str, np.ndarray]


@dataclass(frozen=True)
class Selection:
    """Tensors matching any of `regex` (all when empty) at steps in [start, stop): global
    steps, or steps of `mode` when a mode is given. (`stop` is excluded, as in a Python
    slice; the CLI's `--steps A:B` includes B and is turned into stop = B + 1.)"""

    regex: tuple[str, ...] = ()
    start: int | None = None
    stop: int | None = None
    mode: ModeKeys | None = None

    def __post_init__(self) -> None:
        if isinstance(self.regex, str):
            object.__setattr__(self, "regex", (self.regex,))
        for pattern in self.regex:
            try:
                re.compile(pattern)
            except re.error as exc:
                raise ConfigError(f"regex {pattern!r} is not a valid regular expression: {exc}") from None
        if self.mode is not None:
            try:
                object.__setattr__(self, "mode", ModeKeys.parse(self.mode))
            except ValueError as exc:
                raise ConfigError(f"mode: {exc}") from None
        if self.start is not None and self.stop is not None and self.stop <= self.start:
            raise ConfigError(f"steps {self.start}:{self.stop}: the end must be greater than the start")

    @classmethod
    def from_args(cls, regex: Any = (), steps: str | None = None, mode: str | None = None) -> Selection:
        """From the CLI's strings; `steps` is `--steps` (A:B with both ends included)."""
        first, last = parse_steps(steps) or (None, None)
        return cls(tuple(regex or ()), first, None if last is None else last + 1, mode)  # type: ignore[arg-type]

    def position(self, trial: Trial, step: int) -> int:
        """Where global step `step` sits on the axis the selection counts: itself, or its
        step within `mode`."""
        return step if self.mode is None else trial.mode_of(step)[1]

    def tensor_names(self, trial: Trial) -> list[str]:
        return trial.tensor_names(regex=list(self.regex)) if self.regex else trial.tensor_names()

    def global_steps(self, trial: Trial) -> list[int]:
        if self.mode is None:
            chosen = trial.steps()
        else:
            chosen = [trial.global_step(self.mode, s) for s in trial.steps(mode=self.mode)]
        out = []
        for step in chosen:
            position = self.position(trial, step)
            if (self.start is None or position >= self.start) and (self.stop is None or position < self.stop):
                out.append(step)
        return out


def iter_step_values(trial: Trial, selection: Selection, progress: Any = None, batch_steps: int = BATCH_STEPS, wall_time: bool = True) -> Iterator[StepValues]:
    """Every selected step of every worker with its selected values, in step order; with
    `wall_time`, when the step was saved (one more small read per step)."""
    names = selection.tensor_names(trial)
    steps = selection.global_steps(trial)
    workers = trial.workers() or ["worker_0"]
    if progress:
        progress(0, len(steps))
    for first in range(0, len(steps), batch_steps):
        batch = steps[first : first + batch_steps]
        requests = [(name, step, None, worker) for step in batch for worker in workers for name in names]
        arrays = iter(_read_batch(trial, requests, len(workers) * len(names)) if names else [])
        for step in batch:
            mode, mode_step = trial.mode_of(step)
            for worker in workers:
                values = {}
                for name in names:
                    array = next(arrays)
                    if array is not None:
                        values[name] = array
                if values:
                    # The wall time is read from the smallest record of the step (one more read).
                    smallest = min(values, key=lambda n: values[n].nbytes) if wall_time else ""
                    yield StepValues(step, mode, mode_step, worker, _wall_time(trial, smallest, step, worker) if wall_time else None, values)
        if progress:
            progress(min(first + batch_steps, len(steps)), len(steps))


def _read_batch(trial: Trial, requests: list[Any], per_step: int) -> list[Any]:
    """The values of a batch; when the batch cannot be read (a file refused or corrupt),
    step by step, a step that cannot be read skipped with a warning naming why: one bad
    file costs its step, not the export."""
    try:
        return trial.read_many(requests)
    except (StepscopeError, OSError):
        pass
    out: list[Any] = []
    for at in range(0, len(requests), per_step):
        part = requests[at : at + per_step]
        try:
            out += trial.read_many(part)
        except (StepscopeError, OSError) as exc:
            logger.warning("stepscope export: step %s skipped: %s", part[0][1], exc)
            out += [None] * len(part)
    return out


def _wall_time(trial: Trial, name: str, step: int, worker: str) -> float | None:
    try:
        return trial.tensor(name).wall_time(step, worker=worker)
    except StepscopeError:
        return None
