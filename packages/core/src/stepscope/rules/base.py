"""The one rule model: `Rule`, the base of every check. A tensor rule (kind "tensor") is
invoked step by step over a trial, smdebug-style; a whole-job rule (`JobRule`, kind "job":
profiler data, traces) is evaluated once over everything the job recorded. Both report
violations through `violation(...)` into one `RuleReport`, and the engine (rules.engine)
runs both and triggers their actions. See docs/rules.md."""

from __future__ import annotations

import logging
import os
import re
import sys
from collections import ChainMap
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from ..exceptions import CorruptRecord, StepscopeError, StoreError
from ..modes import ModeKeys
from ..reductions import parse_reduction_tensor_name
from .advice import EXPLANATIONS
from .params import RuleParams, require
from .reading import MISSING, TensorReader, TensorRequest
from .report import Evidence, Explanation, RuleReport, jsonable

if TYPE_CHECKING:
    from ..profiler.reader import ProfilerTrial
    from ..store import Store
    from ..trial import Trial
    from .actions import Action

_DIRECT = TensorReader()
logger = logging.getLogger("stepscope")


def _declared_params(cls: type, scope: Mapping[str, Any]) -> type[RuleParams] | None:
    """The RuleParams class a rule class annotates `params` with in its own body, or None (no
    annotation, or a union of several). Under postponed evaluation the annotation is a string:
    resolved in the class's body, the `scope` that defines the class (a function's locals)
    and its module, as typing.get_type_hints would with those namespaces."""
    annotation = cls.__dict__.get("__annotations__", {}).get("params")
    if isinstance(annotation, str):
        module = sys.modules.get(cls.__module__)
        try:
            annotation = eval(annotation, vars(module) if module else {}, ChainMap(dict(vars(cls)), dict(scope)))
        except NameError as exc:
            raise TypeError(f"{cls.__name__}: `params: {annotation}` names no class defined before the rule ({exc}); define the RuleParams dataclass first, or set `Params`") from None
    return annotation if isinstance(annotation, type) and issubclass(annotation, RuleParams) else None


class RuleEvaluationConditionMet(StepscopeError):
    """Raised by `invoke_rule(..., raise_on_fire=True)` when a rule fires (smdebug's name)."""

    def __init__(self, rule: str, step: int, report: RuleReport | None = None):
        super().__init__(f"rule {rule} fired at step {step}")
        self.rule, self.step, self.report = rule, step, report


class Rule:
    """A check over one training job.

    Subclasses declare `params: XParams` (a RuleParams dataclass: parameters with
    SageMaker's defaults; the class attribute `Params` is set from that annotation, or may
    be set directly), `explanation` (definition, causes, advice; built-in rules take theirs
    from rules.advice by class name) and, when stepscope's default set should use
    other values than SageMaker's, `preset`. A tensor rule implements
    `invoke_at_step(step)` and calls `self.violation(...)` for each problem it finds; the
    rule fired at a step when it reported a violation there (a custom rule that only returns
    True gets a generic violation). `required_tensors(step)` lists what the step will read
    so the engine fetches it for every rule at once. Read through `value` / `reduction`,
    which return None for anything not saved."""

    Params: ClassVar[type[RuleParams]] = RuleParams
    # Name used in configurations and reports; defaults to the class name.
    rule_name: ClassVar[str | None] = None
    kind: ClassVar[str] = "tensor"
    # What the rule checks, likely causes, advice; built-in rules take theirs from
    # rules.advice by class name, a user rule may set its own.
    explanation: ClassVar[Explanation | None] = None
    # Parameters stepscope's default set (`default_rules`) gives this rule instead of the
    # SageMaker defaults in `Params`; rules built by name or from configs use `Params`.
    preset: ClassVar[Mapping[str, Any]] = {}
    # What a job must save for the rule to judge it, in words (shown next to "no data" /
    # "not enough data" and in the summaries' "what to save for the others").
    to_save: ClassVar[str] = ""
    # The saved steps (with something the rule read) it needs before "ok" means anything;
    # 0: the rule does not say (user rules). Rules with other needs override `finish`.
    min_saved_steps: ClassVar[int] = 0

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        # One declaration per fact: the parameters class is the `params` annotation, the
        # explanation of a built-in rule is its entry in rules.advice.
        if "Params" not in cls.__dict__:
            declared = _declared_params(cls, sys._getframe(1).f_locals)  # the class statement's scope
            if declared is not None:
                cls.Params = declared
        if "explanation" not in cls.__dict__ and cls.__name__ in EXPLANATIONS:
            cls.explanation = EXPLANATIONS[cls.__name__]

    def __init__(self, base_trial: Any, *, name: str | None = None, actions: Sequence[Action] = (), **params: Any):
        self.base_trial = base_trial
        self.name = name or self.rule_name or type(self).__name__
        self.params = self.Params.parse(self.name, params)
        self.actions: list[Action] = list(actions)
        # Collections a rule configuration asked the hook to save (see rules.config).
        self.collection_configurations: list[Any] = []
        self.reader: TensorReader = _DIRECT
        self._inspected: set[str] = set()
        self._data_steps: set[int] = set()  # steps at which the rule read something saved
        self._selection: tuple[int, tuple[str, ...], tuple[str, ...], list[str]] | None = None
        self.report = self._new_report()

    def _new_report(self) -> RuleReport:
        report = RuleReport(self.name, type(self).__name__, self.kind, self.params.to_json(), self.explain())
        report.to_save = self.to_save
        return report

    @classmethod
    def explain(cls) -> Explanation:
        """The rule's explanation: its own or the built-in one of its class (or of a class it
        extends), else the docstring."""
        if cls.explanation is not None:
            return cls.explanation
        return Explanation(" ".join((cls.__doc__ or "A user-defined rule.").split()))

    @property
    def trial(self) -> Trial:
        return self.base_trial

    @property
    def store(self) -> Store:
        """Where the job lives (stop requests and reports are written there)."""
        return self.trial.store

    @property
    def path(self) -> str:
        return str(getattr(self.trial, "path", ""))

    def use_reader(self, reader: TensorReader) -> None:
        """Read through `reader` (the engine's shared cache) from now on."""
        self.reader = reader

    @classmethod
    def describe(cls) -> dict[str, Any]:
        """Name, kind, parameters (SageMaker defaults), preset, docstring and explanation."""
        return jsonable(
            {
                "name": cls.rule_name or cls.__name__, "kind": cls.kind, "parameters": cls.Params.defaults(), "preset": dict(cls.preset),
                "doc": " ".join((cls.__doc__ or "").split()), "explanation": cls.explain(),
            }
        )

    # --- what tensor rules implement ---------------------------------------------------

    def required_tensors(self, step: int) -> Iterable[TensorRequest]:
        """What `invoke_at_step(step)` will read; an optimisation, never a restriction."""
        return ()

    def invoke_at_step(self, step: int) -> bool | None:
        raise NotImplementedError

    def finish(self) -> None:
        """Called once after the last step: judge what only the whole run shows, and state
        the evidence the rule needed against what it had (`need`). By default: at least
        `min_saved_steps` steps at which the rule read something."""
        if self.min_saved_steps:
            self.need(self.min_saved_steps, len(self._data_steps), "saved steps")

    def need(self, needed: int, available: int, unit: str, to_save: str = "", *, non_finite: int = 0, finite_what: str = "values") -> None:
        """The rule needs `needed` `unit` to judge and the job gave it `available`: below
        that its status is "not enough data" (none: "no data"), never "ok". `to_save`: what
        to save, where the rule's `to_save` should say more for this job. `non_finite`:
        how many more the job saved that were NaN or infinite (`finite_what`: losses,
        gradients), which the summaries name instead of asking to save more."""
        self.report.need(needed, available, unit, to_save or self.to_save, non_finite=non_finite, finite_what=finite_what)

    def has_inputs(self) -> bool:
        """Whether the job saved what this rule reads; the default set leaves out rules
        without inputs (a rule run by name still runs and says "no data")."""
        return True

    def check_idle(self, idle_s: float, last_step: int | None) -> bool:
        """Called while following a running job that has written nothing new for `idle_s`
        seconds; report a violation to fire (StalledTrainingRule does)."""
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
        """Whether the raw value of `name` was saved at global `step`."""
        return self.reader.has_value(self.trial, name, step)

    def mark_inspected(self, name: str) -> None:
        if name not in self._inspected:
            self._inspected.add(name)
            self.report.tensors_inspected = len(self._inspected)

    def value(self, name: str, step: int, trial: Trial | None = None) -> np.ndarray | None:
        """The raw value of `name` at global `step`, or None when it was not saved."""
        trial = trial or self.trial
        array = self.reader.value(trial, name, step)
        if array is not None and trial is self.trial:
            self.mark_inspected(name)
            self._data_steps.add(step)
        return array

    def reduction(self, name: str, step: int, reduction: str, abs: bool = False, trial: Trial | None = None) -> float | None:
        """A reduction of `name` at `step`: the saved one, else computed from the raw value;
        None when neither was saved."""
        trial = trial or self.trial
        result = self.reader.reduction(trial, name, step, reduction, abs)
        if result is not None and trial is self.trial:
            self.mark_inspected(name)
            self._data_steps.add(step)
        return result

    def mode_of(self, step: int) -> tuple[ModeKeys, int]:
        return self.trial.mode_of(step)

    # --- reporting ----------------------------------------------------------------------

    def violation(
        self, step: int | None, message: str, *, tensor: str | None = None, value: Any = None, threshold: Any = None,
        mode: str | None = None, mode_step: int | None = None, **data: Any,
    ) -> None:
        """Record one problem at global `step` (None: the whole job): the message, the tensor
        or resource, the measured value and the threshold it crossed, and extras."""
        if step is not None and mode is None:
            try:
                found_mode, found_step = self.mode_of(step)
                mode, mode_step = found_mode.name, found_step
            except (MISSING + (AttributeError,)):
                pass
        self.report.add(Evidence(message, step, mode, mode_step, tensor, _number(value), _number(threshold), jsonable(data)))

    def no_data(self, reason: str) -> None:
        """Say why the rule could not judge the job (shown as status "no data")."""
        self.report.no_data_reason = reason

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r}, params={self.params})"


class JobRule(Rule):
    """A rule over the whole job at once (system metrics, the step timeline, traces),
    evaluated after the step-wise rules. `base_trial` is a Trial, a ProfilerTrial, a path /
    s3:// URL / Store, or None to give the job later (`run(trial)`, or the engine binds the
    trial of the run). Subclasses implement `evaluate()`: read `self.profiler`, put
    measurements in `self.report.statistics`, count what was judged in
    `self.report.datapoints`, and call `violation(...)` / `no_data(...)`."""

    kind: ClassVar[str] = "job"

    def __init__(self, base_trial: Any = None, *, name: str | None = None, actions: Sequence[Action] = (), **params: Any):
        super().__init__(None, name=name, actions=actions, **params)
        self._profiler: ProfilerTrial | None = None
        if base_trial is not None:
            self.bind(base_trial)

    def bind(self, trial: Any) -> None:
        """Judge `trial` (Trial, ProfilerTrial, path, s3:// URL or Store)."""
        from ..profiler.reader import ProfilerTrial
        from ..store import Store

        if isinstance(trial, (str, os.PathLike, Store)):
            trial = ProfilerTrial(trial)
        self.base_trial = trial
        self._profiler = trial if isinstance(trial, ProfilerTrial) else trial.profiler

    def parameters(self) -> dict[str, Any]:
        """The rule's parameters as JSON values."""
        return self.params.to_json()

    def detailed_traces(self) -> Any:
        """The job's trace analysis, or None after reporting "no data" when the job has no
        detailed traces (the rules over traces all start here)."""
        analysis = self.profiler.traces
        if not analysis.trace_keys():
            self.no_data("no detailed traces in the job (set ProfilerConfig.detailed_windows; see docs/traces.md)")
            return None
        return analysis

    @property
    def bound(self) -> bool:
        return self.base_trial is not None

    @property
    def profiler(self) -> ProfilerTrial:
        if self._profiler is None:
            raise StepscopeError(f"rule {self.name} has no job to judge; give it a trial")
        return self._profiler

    def evaluate(self) -> None:
        raise NotImplementedError

    def invoke_at_step(self, step: int) -> bool:  # a job rule is not step-wise
        return False

    def run(self, trial: Any = None) -> RuleReport:
        """Evaluate over `trial` (or the bound one) now, without actions; a fresh report."""
        if trial is not None:
            self.bind(trial)
        self.report = self._new_report()
        self.evaluate_guarded()
        return self.report

    def evaluate_guarded(self) -> None:
        """`evaluate()`, a crash becoming an error in the report: a broken (custom) rule or
        an unreadable file must not stop the other rules."""
        try:
            self.evaluate()
        except (CorruptRecord, StoreError) as exc:
            self.report.error(f"unreadable data: {exc}")
        except Exception as exc:
            logger.warning("stepscope: rule %s failed", self.name, exc_info=True)
            self.report.error(f"{type(exc).__name__}: {exc}")


def _number(value: Any) -> Any:
    if isinstance(value, (np.generic,)):
        return value.item()
    return value


__all__ = ["Rule", "JobRule", "RuleParams", "RuleReport", "TensorRequest", "RuleEvaluationConditionMet", "Evidence", "Explanation", "require"]
