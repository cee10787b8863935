"""Health series: the figures of a job's training health, each defined once here, that the
rules judge, the report charts and the app draws (docs/reading.md, "Health series").

Every series is indexed by global step and belongs to one mode: a series never mixes TRAIN
steps with EVAL or PREDICT ones. The figures: weight-update ratios, gradient norms,
dead / saturated unit shares, and step-time outliers. Read side only: this module imports
the trial and plain numeric libraries, nothing of rules, report or app."""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .exceptions import StepscopeError
from .modes import ModeKeys
from .reductions import compute

# Weights and gradients change only while training: their values at an EVAL or PREDICT step
# repeat the last TRAIN step's (a ratio against one is 0, a gradient there is stale).
TRAINING_MODES = (ModeKeys.TRAIN, ModeKeys.GLOBAL)

# The update ratio's denominator is never below this root-mean-square per element: a
# zero-initialised parameter (a LayerNorm beta, a bias) has a norm near 0 after its first
# steps, and a plain ||w|| + 1e-9 made its ratio 1e7. Real weight matrices have an RMS of
# 1/sqrt(fan_in) >= 1e-2, far above it, so their ratio is exact.
UPDATE_RATIO_RMS_FLOOR = 1e-3
# Scalars saved to read a job's steps back, not as a training signal: the Lightning
# callback's optimizer-step counter (manual optimization). No health curve draws them.
STEP_COUNTERS = frozenset({"trainer/global_step"})


def non_finite_points(points: Iterable[tuple[int, float]]) -> tuple[int, int, int] | None:
    """(NaN count, infinity count, first step) of a scalar series' (step, value) points
    that a chart cannot draw; None when every value is finite."""
    bad = sorted(((step, value) for step, value in points if not math.isfinite(value)), key=lambda point: point[0])
    if not bad:
        return None
    nan = sum(1 for _, value in bad if value != value)
    return nan, len(bad) - nan, bad[0][0]


@dataclass
class Series:
    """One figure of one tensor (or layer, or rank) over global steps of one mode."""

    name: str
    mode: str  # a ModeKeys name: "TRAIN", "EVAL", ...
    steps: list[int] = field(default_factory=list)  # global steps, ascending
    values: list[float] = field(default_factory=list)

    def add(self, step: int, value: float) -> None:
        self.steps.append(step)
        self.values.append(value)

    def to_json(self) -> dict[str, Any]:
        return {"tensor": self.name, "mode": self.mode, "steps": list(self.steps), "values": [v if np.isfinite(v) else None for v in self.values]}


def mode_name(trial: Any, step: int) -> str:
    return ModeKeys(trial.mode_of(step)[0]).name


def steps_by_mode(trial: Any, name: str) -> dict[str, list[int]]:
    """{mode name: global steps} at which `name` was saved."""
    out: dict[str, list[int]] = {}
    for step in trial.tensor(name).steps():
        out.setdefault(mode_name(trial, step), []).append(step)
    return out


def training_steps(trial: Any, name: str) -> list[int]:
    """Global steps at which `name` was saved in a training mode (TRAIN, or GLOBAL for jobs
    without modes)."""
    return [s for s in trial.tensor(name).steps() if trial.mode_of(s)[0] in TRAINING_MODES]


def subsample(items: Sequence[int], limit: int) -> list[int]:
    """At most `limit` items, evenly spread, first and last kept."""
    if len(items) <= limit:
        return list(items)
    picks = np.linspace(0, len(items) - 1, limit).round().astype(int)
    return [items[i] for i in sorted(set(picks.tolist()))]


# --- weight-update ratio --------------------------------------------------------------------


def update_ratio(before: np.ndarray | None, after: np.ndarray | None, rms_floor: float = UPDATE_RATIO_RMS_FLOOR) -> float | None:
    """||after - before||_2 / max(||before||_2, rms_floor * sqrt(n)), n the number of elements,
    in float64: how far a weight moved relative to its size between two saved TRAIN steps.
    None when there is no ratio to speak of: a value missing, shapes differing, a
    non-float tensor, or `before` all zero (a start from zero is no relative change)."""
    if before is None or after is None or before.shape != after.shape or before.size == 0 or before.dtype.kind not in "fc":
        return None
    norm = float(compute(before, "l2"))
    if norm == 0.0:
        return None
    delta = np.asarray(after, dtype=np.float64) - np.asarray(before, dtype=np.float64)
    return float(np.linalg.norm(delta.ravel())) / max(norm, rms_floor * float(np.sqrt(before.size)))


def update_ratio_series(trial: Any, name: str, max_points: int | None = None) -> Series:
    """The update ratio of weight `name` at each saved TRAIN step after its first, against its
    previous saved TRAIN step (consecutive saved steps, whatever their distance: save every
    step for a per-step figure). The step axis is the later step's global step. With
    `max_points`, at most that many ratios, evenly spread; each still against the step
    saved just before it, so a long job's chart shows the figure the rule judges."""
    steps = training_steps(trial, name)
    later = list(range(1, len(steps)))
    if max_points is not None:
        later = subsample(later, max_points)
    needed = sorted({i - 1 for i in later} | set(later))
    values = dict(zip(needed, trial.read_many([(name, steps[i], None, None) for i in needed])))
    series = Series(name, ModeKeys.TRAIN.name)
    for i in later:
        ratio = update_ratio(values[i - 1], values[i])
        if ratio is not None:
            series.add(steps[i], ratio)
    return series


# --- gradient norm --------------------------------------------------------------------------


def gradient_norm(tensor: Any, step: int) -> float | None:
    """The l2 norm of a gradient at global `step`: the l2 reduction the job saved, else
    sqrt(sum g^2) of the raw value; None when neither was saved."""
    try:
        return float(tensor.reduction_value(step, "l2"))
    except (StepscopeError, KeyError):
        return None


def gradient_norm_series(trial: Any, name: str, max_points: int | None = None) -> Series:
    """The l2 norm of gradient `name` at each saved TRAIN step."""
    steps = training_steps(trial, name)
    if max_points is not None:
        steps = subsample(steps, max_points)
    tensor = trial.tensor(name)
    series = Series(name, ModeKeys.TRAIN.name)
    for step in steps:
        norm = gradient_norm(tensor, step)
        if norm is not None:
            series.add(step, norm)
    return series


# --- dead and saturated units ---------------------------------------------------------------

# Module classes (torch, Keras layer classes) of each activation function, lower case.
ACTIVATION_CLASSES = {
    "relu": ("relu", "relu6"),
    "tanh": ("tanh",),
    "sigmoid": ("sigmoid",),
}
IO_SUFFIX = re.compile(r"_(input|output)_\d+$")  # PyTorch: `<module>_output_0`


def io_side(name: str) -> str | None:
    """"input" or "output" for a layer's saved input/output (PyTorch `net.1_output_0`,
    Keras `outputs/dense_1`), else None."""
    found = IO_SUFFIX.search(name)
    if found is not None:
        return found.group(1)
    if name.startswith(("outputs/", "inputs/")):
        return name.split("/", 1)[0][:-1]
    return None


def activation_kind(module_class: str | None) -> str | None:
    """"relu", "tanh" or "sigmoid" for a module class name ("ReLU", "Tanh", ...)."""
    lowered = (module_class or "").lower()
    for kind, classes in ACTIVATION_CLASSES.items():
        if lowered in classes:
            return kind
    return None


def activation_input(kind: str | None, output: np.ndarray) -> np.ndarray:
    """The input an activation of `kind` must have had to give `output` (arctanh, logit;
    exact +-1 or 0/1 map to +-inf)."""
    y = output.astype(np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        if kind == "tanh":
            return np.arctanh(np.clip(y, -1.0, 1.0))
        if kind == "sigmoid":
            y = np.clip(y, 0.0, 1.0)
            return np.log(y) - np.log1p(-y)
    return y


def activation_layers(trial: Any, kind: str, io: str | None = None) -> list[str]:
    """Tensors saved as the input or output (`io`: "input", "output", None for either) of a
    module whose recorded class is an activation of `kind` ("relu", "tanh", "sigmoid")."""
    out = []
    for name in trial.tensor_names():
        side = io_side(name)
        if side is None or (io is not None and side != io):
            continue
        if activation_kind(trial.module_class(name)) == kind:
            out.append(name)
    return out


def unit_activity(value: np.ndarray, active: np.ndarray) -> np.ndarray:
    """Percentage of the batch (axis 0) in which each unit is active; a tensor without a
    batch axis counts each element as one sample of its own unit."""
    active = active.astype(np.float64)
    if value.ndim >= 2:
        return 100.0 * active.mean(axis=0).reshape(-1)
    return 100.0 * active.reshape(-1)


def inactive_units(value: np.ndarray, active: np.ndarray, threshold_inactivity: float) -> np.ndarray:
    """Per unit, whether it was active in less than `threshold_inactivity` % of the batch."""
    return unit_activity(value, active) < threshold_inactivity


def inactive_share(recent: Sequence[np.ndarray]) -> float:
    """% of a layer's units inactive at every one of `recent` saved steps (their masks)."""
    return 100.0 * float(np.mean(np.logical_and.reduce(list(recent))))


class InactiveTracker:
    """A layer's inactive-unit masks at its last `persistence` saved steps of one mode; the
    share is defined once `persistence` masks are in (each a different batch)."""

    def __init__(self, persistence: int):
        self.persistence = persistence
        self._recent: dict[tuple[str, str], list[np.ndarray]] = {}

    def add(self, layer: str, mode: str, mask: np.ndarray) -> float | None:
        recent = self._recent.setdefault((layer, mode), [])
        if recent and recent[-1].shape != mask.shape:
            recent.clear()  # another layout: the units are not the same ones
        recent.append(mask)
        del recent[: -self.persistence]
        return inactive_share(recent) if len(recent) >= self.persistence else None

    def longest(self) -> int:
        return max((len(v) for v in self._recent.values()), default=0)


def inactive_unit_series(trial: Any, name: str, active: Callable[[np.ndarray, int], np.ndarray | None], threshold_inactivity: float,
                         persistence: int = 1, steps: Iterable[int] | None = None) -> list[Series]:
    """Per mode, the % of units of layer `name` inactive (active, by `active(value, global
    step)`, in less than `threshold_inactivity` % of the batch) at each of its last
    `persistence` saved steps of that mode, at each of its saved steps (from the
    `persistence`-th on); a step where `active` gives None is not judged."""
    chosen = sorted(trial.tensor(name).steps() if steps is None else steps)
    values = trial.read_many([(name, s, None, None) for s in chosen])
    tracker = InactiveTracker(persistence)
    out: dict[str, Series] = {}
    for step, value in zip(chosen, values):
        if value is None or value.size == 0:
            continue
        mask = active(value, step)
        if mask is None:
            continue
        mode = mode_name(trial, step)
        share = tracker.add(name, mode, inactive_units(value, mask, threshold_inactivity))
        if share is not None:
            out.setdefault(mode, Series(name, mode)).add(step, share)
    return list(out.values())


# --- step-time outliers ---------------------------------------------------------------------

STEP_PHASES = ("step", "eval_step", "predict_step")


@dataclass(frozen=True)
class OutlierCriterion:
    """A step is an outlier of its rank and mode when it takes longer than
    max(mean + `stddev` * std, `min_ratio` * median, median + `min_excess_ms`) of that rank
    and mode's steps, the first step (warm-up, compilation) left out of both the statistics
    and the verdict. std is the population standard deviation."""

    stddev: float = 3.0
    min_ratio: float = 0.0
    min_excess_ms: float = 0.0


@dataclass
class StepGroup:
    """The steps of one node, rank and mode, with the outlier limit and the outliers."""

    node: str
    rank: int
    mode: str
    steps: list[int]  # global steps, in time order, the first one included
    duration_ms: list[float]
    mean_ms: float | None = None
    std_ms: float | None = None
    median_ms: float | None = None
    limit_ms: float | None = None  # None: fewer than 2 steps after the first
    outliers: list[int] = field(default_factory=list)  # global steps over the limit
    outlier_ms: list[float] = field(default_factory=list)

    @property
    def key(self) -> str:
        return f"{self.node}/rank{self.rank}/{self.mode}"

    @property
    def judged(self) -> int:
        """Steps the statistics cover (all but the first)."""
        return max(len(self.steps) - 1, 0) if self.limit_ms is not None else 0


def step_groups(timeline: Any, criterion: OutlierCriterion, modes: Iterable[str] | None = None) -> list[StepGroup]:
    """Every node/rank/mode's step durations from a step timeline (profiler
    `step_timeline()`), with `criterion`'s outlier limit and outliers; `modes` limits the
    modes (None: every mode)."""
    steps = timeline[timeline["phase"].isin(STEP_PHASES)]
    if modes is not None:
        steps = steps[steps["mode"].isin(list(modes))]
    groups = []
    for (node, rank, mode), frame in steps.groupby(["node_id", "rank", "mode"], sort=True):
        frame = frame.sort_values("start_ns")
        group = StepGroup(str(node), int(rank), str(mode), [int(s) for s in frame["step"]], [float(d) for d in frame["duration_ms"]])
        _judge(group, criterion)
        groups.append(group)
    return groups


def _judge(group: StepGroup, criterion: OutlierCriterion) -> None:
    durations = np.asarray(group.duration_ms[1:], dtype=np.float64)
    if len(durations) < 2:
        return
    group.mean_ms, group.std_ms, group.median_ms = float(durations.mean()), float(durations.std()), float(np.median(durations))
    group.limit_ms = max(group.mean_ms + criterion.stddev * group.std_ms, criterion.min_ratio * group.median_ms, group.median_ms + criterion.min_excess_ms)
    for step, duration in zip(group.steps[1:], durations):
        if duration > group.limit_ms:
            group.outliers.append(step)
            group.outlier_ms.append(float(duration))
