"""Rules by name: the built-in tensor rules, the profiler rules (stepscope.profiler.rules,
imported only when asked for: they need pandas), and user rules named
`package.module:ClassName`. Also the default set `stepscope check` runs.
When a name is both a tensor rule and a profiler rule, the tensor rule wins."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from ..exceptions import ConfigError
from .activations import DeadRelu, PoorWeightInitialization, SaturatedActivation
from .base import Rule
from .classification import ClassImbalance, Confusion
from .inputs import CheckInputImages, NLPSequenceRatio
from .losses import ChanceLevelLoss, LossDivergence, LossNotDecreasing, Overfit, Overtraining, SlowConvergence, StalledTrainingRule
from .tensors import AllZero, ExplodingTensor, SimilarAcrossRuns, TensorVariance, UnchangedTensor, VanishingGradient, WeightUpdateRatio

if TYPE_CHECKING:
    from ..trial import Trial

BUILTIN_RULES: dict[str, type[Rule]] = {
    cls.__name__: cls
    for cls in (
        VanishingGradient, ExplodingTensor, DeadRelu, SaturatedActivation, PoorWeightInitialization, WeightUpdateRatio,
        AllZero, UnchangedTensor, LossNotDecreasing, Overfit, Overtraining, SimilarAcrossRuns, StalledTrainingRule,
        TensorVariance, ClassImbalance, Confusion, CheckInputImages, NLPSequenceRatio, LossDivergence, ChanceLevelLoss, SlowConvergence,
    )
}

# The tensor rules of the default set, in report order. A rule whose inputs the job did not
# save (Rule.has_inputs) is left out rather than run to say "no data"; the profiler rules
# join when the job has profiler data.
DEFAULT_RULES = (
    "ExplodingTensor", "VanishingGradient", "WeightUpdateRatio", "AllZero", "LossNotDecreasing", "LossDivergence", "ChanceLevelLoss",
    "SlowConvergence", "Overfit", "DeadRelu", "SaturatedActivation", "ClassImbalance",
)


def has_profiler_data(trial: Trial) -> bool:
    from ..layout import PROFILER_DIR

    return bool(trial.store.list(PROFILER_DIR + "/"))


def default_rules(trial: Trial) -> list[Rule]:
    """stepscope's default rule set for `trial`: every built-in rule whose inputs the job
    saved, with its `preset` parameters (trend-based losses, per-kind gradient statistics,
    ...), plus the profiler rules when the job has profiler data. See docs/rules.md."""
    rules: list[Rule] = [rule for rule in (BUILTIN_RULES[n](trial, **BUILTIN_RULES[n].preset) for n in DEFAULT_RULES) if rule.has_inputs()]
    return rules + default_profiler_rules(trial)


def left_out_of_default(trial: Trial) -> list[tuple[str, str]]:
    """The default set's tensor rules left out because the job saved nothing they read:
    (rule name, what to save for it), for the summaries' "what to save for the others"."""
    return [(n, BUILTIN_RULES[n].to_save) for n in DEFAULT_RULES if not BUILTIN_RULES[n](trial, **BUILTIN_RULES[n].preset).has_inputs()]


def default_profiler_rules(trial: Trial) -> list[Rule]:
    """The whole-job part of `default_rules`: the profiler rules with their `preset`
    parameters when the job has profiler data, the trace rules when it has traces (what
    the web app runs live on a job)."""
    if not has_profiler_data(trial):
        return []
    traced = has_trace_data(trial)
    return [cls(trial, **cls.preset) for cls in profiler_rules().values() if traced or cls.__module__ not in ("stepscope.traces.rules", "stepscope.rules.memory")]


def has_trace_data(trial: Trial) -> bool:
    """Whether the job holds detailed traces (the trace rules then join the default set)."""
    from ..layout import FRAMEWORK_DIR

    return any(trial.store.list(f"{FRAMEWORK_DIR}/{framework}/detailed/") for framework in ("pytorch", "tensorflow"))


def profiler_rules() -> dict[str, type[Rule]]:
    """stepscope.profiler.rules.PROFILER_RULES, or {} where that module cannot load."""
    try:
        module = importlib.import_module("stepscope.profiler.rules")
    except ImportError:
        return {}
    rules = dict(getattr(module, "PROFILER_RULES", {}))
    try:  # the trace rules (stepscope.traces.rules) need pyarrow
        rules.update(importlib.import_module("stepscope.traces.rules").TRACE_RULES)
        rules.update(importlib.import_module("stepscope.rules.memory").MEMORY_RULES)
    except ImportError:
        pass
    return rules


def job_rules() -> dict[str, type[Rule]]:
    """The profiler rules plus the rules that bundle them (ProfilerReport, which writes the
    job's report): every whole-job rule known by name. Not in the default set."""
    rules = profiler_rules()
    try:
        from ..report.rule import ProfilerReport
    except ImportError:  # the report's dependencies (matplotlib) are not installed
        return rules
    return {**rules, "ProfilerReport": ProfilerReport}


def _lookup(registry: dict[str, Any], name: str) -> str | None:
    if name in registry:
        return name
    lowered = {k.lower(): k for k in registry}
    return lowered.get(name.lower())


def is_custom(name: str) -> bool:
    return ":" in name


def rule_kind(name: str) -> str:
    """"tensor", "profiler" or "custom" for a rule name; ConfigError listing the valid
    names when it is none of them."""
    if is_custom(name):
        return "custom"
    if _lookup(BUILTIN_RULES, name):
        return "tensor"
    if _lookup(job_rules(), name):
        return "profiler"
    raise ConfigError(f"unknown rule {name!r}; valid: {', '.join(valid_rule_names())} (or package.module:ClassName for your own)")


def valid_rule_names() -> list[str]:
    return list(BUILTIN_RULES) + [n for n in job_rules() if n not in BUILTIN_RULES]


def load_rule_class(spec: str) -> type[Rule]:
    """The class named by `package.module:ClassName`, which must subclass Rule."""
    module_name, _, class_name = spec.partition(":")
    if not module_name or not class_name:
        raise ConfigError(f"custom rule {spec!r}: expected package.module:ClassName")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError(f"custom rule {spec!r}: cannot import {module_name}: {exc}") from None
    cls = getattr(module, class_name, None)
    if not (isinstance(cls, type) and issubclass(cls, Rule)):
        raise ConfigError(f"custom rule {spec!r}: {module_name}.{class_name} is not a stepscope.rules.Rule subclass")
    return cls


def rule_class(name: str) -> type[Rule]:
    """The class of a built-in tensor rule, a profiler rule, or `package.module:ClassName`."""
    kind = rule_kind(name)
    if kind == "custom":
        return load_rule_class(name)
    if kind == "tensor":
        return BUILTIN_RULES[_lookup(BUILTIN_RULES, name) or name]
    registry = job_rules()
    return registry[_lookup(registry, name) or name]


def tensor_rule_class(name: str) -> type[Rule]:
    return rule_class(name)


def build_rule(name: str, trial: Any, params: dict[str, Any] | None = None, **kwargs: Any) -> Rule:
    """A rule by name with (string) parameters, SageMaker's defaults for the rest."""
    cls = rule_class(name)
    try:
        return cls(trial, **kwargs, **dict(params or {}))
    except TypeError as exc:
        raise ConfigError(f"{name}: {exc}") from None


def build_profiler_rule(name: str, params: dict[str, Any]) -> Rule:
    """A profiler rule object from its name and (string) parameters, not yet bound to a job."""
    return build_rule(name, None, params)


def describe_rules() -> list[dict[str, Any]]:
    """Each rule's `describe()`: name, kind, parameters with defaults, preset, doc, explanation."""
    out = [cls.describe() for cls in BUILTIN_RULES.values()]
    out += [cls.describe() for name, cls in job_rules().items() if name not in BUILTIN_RULES]
    in_default_set = set(DEFAULT_RULES) | set(profiler_rules())
    for entry in out:
        entry["default"] = entry["name"] in in_default_set
    return out


__all__ = [
    "BUILTIN_RULES", "DEFAULT_RULES", "default_rules", "profiler_rules", "rule_kind", "rule_class", "build_rule",
    "load_rule_class", "describe_rules", "valid_rule_names", "has_profiler_data", "left_out_of_default",
]
