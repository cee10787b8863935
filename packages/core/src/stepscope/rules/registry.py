"""The one rule catalog: every rule stepscope knows by name, and the default set
`stepscope check` runs. Four kinds are registered here:

- the built-in tensor rules (rules.tensors, .losses, .activations, ...);
- the profiler rules (rules.profiler; they need pandas) and the trace rules (rules.traces;
  they need pyarrow), imported on first use;
- rules that live above `rules/` because they write a report (ProfilerReport, in
  stepscope.report), named here as `module:Class` and imported only when asked for, so
  `rules/` imports nothing of the report;
- third-party rules a package registers under the `stepscope.rules` entry-point group
  (`MyRule = "my_package.rules:MyRule"`), and any `package.module:ClassName`.

When a name is both a tensor rule and a whole-job rule, the tensor rule wins."""

from __future__ import annotations

import functools
import importlib
import logging
import sys
from importlib import metadata
from typing import TYPE_CHECKING, Any

from ..exceptions import ConfigError
from ..layout import FRAMEWORK_DIR, PROFILER_DIR
from .activations import DeadRelu, PoorWeightInitialization, SaturatedActivation
from .base import Rule
from .classification import ClassImbalance, Confusion
from .inputs import CheckInputImages, NLPSequenceRatio
from .losses import ChanceLevelLoss, LossDivergence, LossNotDecreasing, Overfit, Overtraining, SlowConvergence, StalledTrainingRule
from .tensors import AllZero, ExplodingTensor, SimilarAcrossRuns, TensorVariance, UnchangedTensor, VanishingGradient, WeightUpdateRatio

if TYPE_CHECKING:
    from ..trial import Trial

logger = logging.getLogger("stepscope")

ENTRY_POINT_GROUP = "stepscope.rules"

# Whole-job rules that write a report and so live in stepscope.report; loaded by name.
REPORT_RULES: dict[str, str] = {"ProfilerReport": "stepscope.report.profiler_report:ProfilerReport"}

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
    trace_names = set(trace_rules())
    return [cls(trial, **cls.preset) for name, cls in profiler_rules().items() if traced or name not in trace_names]


def has_trace_data(trial: Trial) -> bool:
    """Whether the job holds detailed traces (the trace rules then join the default set)."""
    return any(trial.store.list(f"{FRAMEWORK_DIR}/{framework}/detailed/") for framework in ("pytorch", "tensorflow"))


def _group(module: str, attribute: str) -> dict[str, type[Rule]]:
    """The rules `module` registers in `attribute`, or {} where its dependencies are missing."""
    try:
        return dict(getattr(importlib.import_module(module), attribute))
    except ImportError:
        return {}


def trace_rules() -> dict[str, type[Rule]]:
    """The rules over detailed traces (stepscope.rules.traces) and their allocator events
    (stepscope.rules.memory); {} without pyarrow."""
    return {**_group("stepscope.rules.traces", "TRACE_RULES"), **_group("stepscope.rules.memory", "MEMORY_RULES")}


def system_rules() -> dict[str, type[Rule]]:
    """The ten profiler rules over system metrics and the step timeline (stepscope.rules.profiler;
    {} without pandas): what SageMaker's ProfilerReport bundles."""
    return _group("stepscope.rules.profiler", "PROFILER_RULES")


def profiler_rules() -> dict[str, type[Rule]]:
    """The profiler rules (stepscope.rules.profiler; {} without pandas), then the trace rules."""
    return {**system_rules(), **trace_rules()}


def report_rules() -> dict[str, type[Rule]]:
    """REPORT_RULES loaded ({} where the report's dependencies, matplotlib, are missing)."""
    out = {}
    for name, spec in REPORT_RULES.items():
        try:
            out[name] = load_rule_class(spec)
        except ConfigError:
            logger.debug("stepscope: rule %s unavailable", name, exc_info=True)
    return out


def plugin_rules() -> dict[str, type[Rule]]:
    """Rules other packages register under the `stepscope.rules` entry-point group. One that
    cannot load is left out with a warning naming it (a broken plugin must not stop a check)."""
    out: dict[str, type[Rule]] = {}
    for name, spec in _entry_points(tuple(sys.path)):
        try:
            out[name] = load_rule_class(spec)
        except ConfigError as exc:
            _warn_once(name, spec, str(exc))
    return out


@functools.cache
def _entry_points(path: tuple[str, ...]) -> tuple[tuple[str, str], ...]:
    """(name, module:Class) of the group's entry points: scanning the installed
    distributions takes tens of ms, so once per sys.path (`path` is the cache key)."""
    return tuple((entry.name, entry.value) for entry in metadata.entry_points(group=ENTRY_POINT_GROUP))


@functools.cache
def _warn_once(name: str, spec: str, error: str) -> None:
    logger.warning("stepscope: rule entry point %s = %s left out: %s", name, spec, error)


def job_rules() -> dict[str, type[Rule]]:
    """Every rule known by name besides the built-in tensor rules: profiler, trace, report
    and plugin rules (ProfilerReport and plugins are not in the default set)."""
    return {**profiler_rules(), **report_rules(), **{n: c for n, c in plugin_rules().items() if n not in BUILTIN_RULES}}


def is_known(name: str) -> bool:
    """Whether `name` is exactly a built-in tensor, profiler or trace rule's name."""
    return name in BUILTIN_RULES or name in profiler_rules()


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
    registry = job_rules()
    found = _lookup(registry, name)
    if found:
        return "tensor" if registry[found].kind == "tensor" else "profiler"
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
    """The class of a rule of the catalog, or of `package.module:ClassName`."""
    if rule_kind(name) == "custom":
        return load_rule_class(name)
    if _lookup(BUILTIN_RULES, name):
        return BUILTIN_RULES[_lookup(BUILTIN_RULES, name) or name]
    registry = job_rules()
    return registry[_lookup(registry, name) or name]


def describe_rules() -> list[dict[str, Any]]:
    """Each rule's `describe()`: name, kind, parameters with defaults, preset, doc, explanation."""
    out = [cls.describe() for cls in BUILTIN_RULES.values()]
    out += [cls.describe() for name, cls in job_rules().items() if name not in BUILTIN_RULES]
    in_default_set = set(DEFAULT_RULES) | set(profiler_rules())
    for entry in out:
        entry["default"] = entry["name"] in in_default_set
    return out


__all__ = [
    "BUILTIN_RULES", "DEFAULT_RULES", "REPORT_RULES", "ENTRY_POINT_GROUP", "default_rules", "default_profiler_rules", "profiler_rules", "system_rules",
    "trace_rules", "report_rules", "plugin_rules", "job_rules", "rule_kind", "rule_class", "is_known", "load_rule_class",
    "describe_rules", "valid_rule_names", "has_profiler_data", "has_trace_data", "left_out_of_default",
]
