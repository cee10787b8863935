"""Rules by name: the built-in tensor rules, the profiler rules (stepscope.profiler.rules,
imported only when asked for), and user rules named `package.module:ClassName`.
When a name is both a tensor rule and a profiler rule, the tensor rule wins."""

from __future__ import annotations

import importlib
from typing import Any

from ..exceptions import ConfigError
from .activations import DeadRelu, PoorWeightInitialization, SaturatedActivation
from .base import Rule
from .classification import ClassImbalance, Confusion
from .inputs import CheckInputImages, NLPSequenceRatio
from .losses import LossNotDecreasing, Overfit, Overtraining, StalledTrainingRule
from .tensors import AllZero, ExplodingTensor, SimilarAcrossRuns, TensorVariance, UnchangedTensor, VanishingGradient, WeightUpdateRatio

BUILTIN_RULES: dict[str, type[Rule]] = {
    cls.__name__: cls
    for cls in (
        VanishingGradient, ExplodingTensor, DeadRelu, SaturatedActivation, PoorWeightInitialization, WeightUpdateRatio,
        AllZero, UnchangedTensor, LossNotDecreasing, Overfit, Overtraining, SimilarAcrossRuns, StalledTrainingRule,
        TensorVariance, ClassImbalance, Confusion, CheckInputImages, NLPSequenceRatio,
    )
}

# What `stepscope check` runs when no rule is named: cheap, and silent on a healthy job
# whatever it saved (each looks only at collections that every hook saves or that it finds).
DEFAULT_RULES = ("VanishingGradient", "ExplodingTensor", "LossNotDecreasing", "WeightUpdateRatio", "Overfit")


def profiler_rules() -> dict[str, type]:
    """stepscope.profiler.rules.PROFILER_RULES, or {} where that module is not there."""
    try:
        module = importlib.import_module("stepscope.profiler.rules")
    except ImportError:
        return {}
    return dict(getattr(module, "PROFILER_RULES", {}))


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
    if _lookup(profiler_rules(), name):
        return "profiler"
    raise ConfigError(f"unknown rule {name!r}; valid: {', '.join(valid_rule_names())} (or package.module:ClassName for your own)")


def valid_rule_names() -> list[str]:
    return list(BUILTIN_RULES) + [n for n in profiler_rules() if n not in BUILTIN_RULES]


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


def tensor_rule_class(name: str) -> type[Rule]:
    if is_custom(name):
        return load_rule_class(name)
    found = _lookup(BUILTIN_RULES, name)
    if found is None:
        raise ConfigError(f"unknown rule {name!r}; valid: {', '.join(valid_rule_names())}")
    return BUILTIN_RULES[found]


def build_profiler_rule(name: str, params: dict[str, Any]) -> Any:
    """A profiler rule object from its name and (string) parameters, by stepscope.profiler.rules."""
    from ..profiler.rules import from_rulesconfig

    return from_rulesconfig({"rule_name": _lookup(profiler_rules(), name) or name, "rule_parameters": dict(params)})


def describe_rules() -> list[dict[str, Any]]:
    """Name, kind, parameters with defaults and first docstring line of each rule."""
    import dataclasses

    out = []
    for name, cls in BUILTIN_RULES.items():
        params = {f.name: f.default for f in dataclasses.fields(cls.Params)}
        out.append({"name": name, "kind": "tensor", "parameters": params, "doc": (cls.__doc__ or "").strip().split("\n")[0]})
    for name, cls in profiler_rules().items():
        if name in BUILTIN_RULES:
            continue
        try:
            params = {f.name: f.default for f in dataclasses.fields(cls)}
        except TypeError:
            params = {}
        out.append({"name": name, "kind": "profiler", "parameters": params, "doc": (cls.__doc__ or "").strip().split("\n")[0]})
    return out
