"""The Rule base class, its report, and typed rule parameters (strings accepted, as rule
configurations carry every value as a string)."""

from __future__ import annotations

import dataclasses
import logging
import re
import types
import typing
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Union

import numpy as np

from ..config import parse_bool
from ..exceptions import ConfigError, StepNotYetAvailable, StepscopeError, StepUnavailable, TensorUnavailable, TensorUnavailableForStep
from ..modes import ModeKeys
from ..reductions import compute as compute_reduction
from ..reductions import normalize_reduction, parse_reduction_tensor_name, reduction_tensor_name

if TYPE_CHECKING:
    from ..trial import Trial
    from .actions import Action
    from .engine import ReadCache

logger = logging.getLogger("stepscope")

# A report keeps this many violation details; the count keeps going.
MAX_DETAILS = 100

_MISSING = (TensorUnavailable, TensorUnavailableForStep, StepUnavailable, StepNotYetAvailable)


class RuleEvaluationConditionMet(StepscopeError):
    """Raised by `invoke_rule(..., raise_on_fire=True)` when a rule fires (smdebug's name)."""

    def __init__(self, rule: str, step: int, report: RuleReport | None = None):
        super().__init__(f"rule {rule} fired at step {step}")
        self.rule, self.step, self.report = rule, step, report


# --- typed parameters -------------------------------------------------------------------


def _split_list(value: Any) -> list[Any]:
    if isinstance(value, str):
        text = value.strip()
        if text.startswith(("(", "[")) and text.endswith((")", "]")):
            text = text[1:-1]
        return [part.strip() for part in text.split(",") if part.strip()]
    if isinstance(value, Iterable):
        return list(value)
    return [value]


def _convert(owner: str, name: str, kind: Any, value: Any) -> Any:
    """Convert `value` (maybe a string) to the annotated type `kind`, or raise ConfigError
    naming the parameter and the value."""
    origin = typing.get_origin(kind)
    args = typing.get_args(kind)
    if origin in (Union, types.UnionType):
        if value is None or (isinstance(value, str) and value.strip().lower() in ("", "none", "null")):
            if type(None) in args:
                return None
        inner = [a for a in args if a is not type(None)]
        return _convert(owner, name, inner[0], value)
    if origin is tuple:
        item_kind = args[0] if args else str
        return tuple(_convert(owner, name, item_kind, item) for item in _split_list(value))
    try:
        if kind is bool:
            return parse_bool(f"{owner}.{name}", value)
        if kind is int:
            if isinstance(value, bool):
                raise ValueError
            number = float(value)
            if number != int(number):
                raise ValueError
            return int(number)
        if kind is float:
            if isinstance(value, bool):
                raise ValueError
            return float(value)
        if kind is str:
            if not isinstance(value, (str, int, float)):
                raise ValueError
            return str(value)
    except ConfigError:
        raise
    except (TypeError, ValueError):
        raise ConfigError(f"{owner}.{name} must be {getattr(kind, '__name__', kind)}, got {value!r}") from None
    return value


@dataclass(frozen=True)
class RuleParams:
    """Base of every rule's parameters. Subclasses are frozen dataclasses whose fields carry
    the defaults; `parse` converts strings and rejects unknown names."""

    @classmethod
    def parse(cls, owner: str, values: Mapping[str, Any]) -> RuleParams:
        hints = typing.get_type_hints(cls)
        fields = {f.name: f for f in dataclasses.fields(cls)}
        unknown = sorted(set(values) - set(fields))
        if unknown:
            raise ConfigError(f"{owner}: unknown parameter(s) {', '.join(map(repr, unknown))}; valid: {', '.join(fields) or '(none)'}")
        converted = {name: _convert(owner, name, hints[name], value) for name, value in values.items()}
        params = cls(**converted)
        params.validate(owner)
        return params

    def validate(self, owner: str) -> None:
        """Check values together (ranges, required combinations); raise ConfigError."""

    def to_json(self) -> dict[str, Any]:
        return {k: list(v) if isinstance(v, tuple) else v for k, v in dataclasses.asdict(self).items()}


def require(owner: str, name: str, value: float | None, ok: bool, what: str) -> None:
    if not ok:
        raise ConfigError(f"{owner}.{name} must be {what}, got {value!r}")


# --- the report ---------------------------------------------------------------------------


@dataclass
class RuleReport:
    """What one rule found: whether it fired, where, and why. JSON-serialisable."""

    rule: str
    rule_class: str
    parameters: dict[str, Any]
    fired: bool = False
    fired_steps: list[int] = field(default_factory=list)
    violations: int = 0
    details: list[dict[str, Any]] = field(default_factory=list)
    steps_evaluated: int = 0
    first_step: int | None = None
    last_step: int | None = None
    tensors_inspected: int = 0
    errors: list[str] = field(default_factory=list)

    @property
    def status(self) -> str:
        if self.fired:
            return "fired"
        if self.errors:
            return "error"
        if not self.steps_evaluated or not self.tensors_inspected:
            return "no data"
        return "ok"

    def to_json(self) -> dict[str, Any]:
        body = dataclasses.asdict(self)
        body["status"] = self.status
        return body

    def summary(self) -> str:
        if self.fired:
            first = self.details[0]["message"] if self.details else ""
            return f"fired at {len(self.fired_steps)} step(s), first {self.fired_steps[0]}: {first}"
        if self.errors:
            return self.errors[0]
        if not self.steps_evaluated:
            return "no steps to evaluate"
        if not self.tensors_inspected:
            return "no matching tensors were saved"
        return f"ok over {self.steps_evaluated} step(s)"


# --- the rule -----------------------------------------------------------------------------


@dataclass(frozen=True)
class TensorRequest:
    """A value a rule will read at a step: the raw tensor, or one of its reductions."""

    name: str
    step: int
    reduction: str | None = None
    abs: bool = False


class Rule:
    """A check run over a trial step by step.

    Subclasses set `Params` (a RuleParams dataclass) and implement `invoke_at_step(step)`,
    returning True when the condition holds at that global step; `self.violation(...)`
    records why. `required_tensors(step)` lists what the step will read so the engine can
    fetch it for every rule at once. Read through `self.value` / `self.reduction`, which
    share one cache between the rules of a run and return None for anything not saved."""

    Params: ClassVar[type[RuleParams]] = RuleParams
    # Name used in configurations and reports; defaults to the class name.
    rule_name: ClassVar[str | None] = None

    def __init__(self, base_trial: Trial, *, name: str | None = None, actions: Sequence[Action] = (), **params: Any):
        self.base_trial = base_trial
        self.name = name or self.rule_name or type(self).__name__
        self.params = self.Params.parse(self.name, params)
        self.actions: list[Action] = list(actions)
        # Collections a rule configuration asked the hook to save (see rules.config).
        self.collection_configurations: list[Any] = []
        self.report = RuleReport(self.name, type(self).__name__, self.params.to_json())
        self._cache: ReadCache | None = None
        self._inspected: set[str] = set()
        self._selection: tuple[int, tuple[str, ...], tuple[str, ...], list[str]] | None = None

    @property
    def trial(self) -> Trial:
        return self.base_trial

    # --- what subclasses implement -----------------------------------------------------

    def required_tensors(self, step: int) -> Iterable[TensorRequest]:
        """What `invoke_at_step(step)` will read; an optimisation, never a restriction."""
        return ()

    def invoke_at_step(self, step: int) -> bool:
        raise NotImplementedError

    def check_idle(self, idle_s: float, last_step: int | None) -> bool:
        """Called while following a running job that has written nothing new for `idle_s`
        seconds; True fires the rule (StalledTrainingRule uses it)."""
        return False

    # --- reading ------------------------------------------------------------------------

    def select_tensors(self, collections: Iterable[str] = (), regex: Iterable[str] = (), *, all_when_empty: bool = True) -> list[str]:
        """Base tensor names (reduction tensors mapped back to the tensor they reduce) in any of
        `collections` or matching any `regex`; every tensor when both are empty."""
        collections, regex = tuple(collections), tuple(regex)
        known = self.trial.tensor_names()
        if self._selection and self._selection[0] == len(known) and self._selection[1:3] == (collections, regex):
            return self._selection[3]
        base = sorted({(parse_reduction_tensor_name(n) or (n,))[0] for n in known})
        if not collections and not regex:
            chosen = base if all_when_empty else []
        else:
            available = self.trial.collections()
            members = [available[c] for c in collections if c in available]
            patterns = [re.compile(r) for r in regex]
            chosen = [n for n in base if any(c.matches(n) for c in members) or any(p.search(n) for p in patterns)]
        self._selection = (len(known), collections, regex, chosen)
        return chosen

    def has_raw(self, name: str, step: int) -> bool:
        return self.trial.has_tensor(name) and self.trial.tensor(name).has_value(step)

    def value(self, name: str, step: int, trial: Trial | None = None) -> np.ndarray | None:
        """The raw value of `name` at global `step`, or None when it was not saved."""
        trial = trial or self.trial
        if self._cache is not None:
            array = self._cache.value(trial, name, step)
        else:
            try:
                array = trial.tensor(name).value(step)
            except _MISSING:
                array = None
        if array is not None and trial is self.trial:
            self._inspected.add(name)
        return array

    def reduction(self, name: str, step: int, reduction: str, abs: bool = False, trial: Trial | None = None) -> float | None:
        """A reduction of `name` at `step`: the saved one, else computed from the raw value;
        None when neither was saved."""
        trial = trial or self.trial
        if self._cache is not None:
            result = self._cache.reduction(trial, name, step, reduction, abs)
        else:
            result = read_reduction(trial, name, step, reduction, abs, lambda n, s: _plain_value(trial, n, s))
        if result is not None and trial is self.trial:
            self._inspected.add(name)
        return result

    def mode_of(self, step: int) -> tuple[ModeKeys, int]:
        return self.trial.mode_of(step)

    # --- recording ----------------------------------------------------------------------

    def violation(self, step: int, message: str, **details: Any) -> None:
        """Record one reason the rule fires at `step` (kept up to MAX_DETAILS per report)."""
        self.report.violations += 1
        if len(self.report.details) < MAX_DETAILS:
            self.report.details.append({"step": step, "message": message, **{k: _jsonable(v) for k, v in details.items()}})

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r}, params={self.params})"


def _plain_value(trial: Trial, name: str, step: int) -> np.ndarray | None:
    try:
        return trial.tensor(name).value(step)
    except _MISSING:
        return None


def read_reduction(trial: Trial, name: str, step: int, reduction: str, abs: bool, raw_value) -> float | None:
    """A saved reduction tensor (either spelling of the norms) or, failing that, the
    reduction computed from the raw value read with `raw_value(name, step)`."""
    base = normalize_reduction(reduction)
    for spelling in (base, f"{base}_norm") if base in ("l1", "l2") else (base,):
        saved_name = reduction_tensor_name(name, spelling, abs)
        if trial.has_tensor(saved_name):
            saved = raw_value(saved_name, step)
            if saved is not None:
                return float(np.asarray(saved).reshape(-1)[0])
    raw = raw_value(name, step)
    if raw is None or np.asarray(raw).size == 0:
        return None
    return float(compute_reduction(raw, base, abs))


def _jsonable(value: Any) -> Any:
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, float) and not np.isfinite(value):
        return str(value)
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    return value


__all__ = ["Rule", "RuleParams", "RuleReport", "TensorRequest", "RuleEvaluationConditionMet", "MAX_DETAILS", "read_reduction", "require"]
