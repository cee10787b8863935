"""Rules from existing configurations: the dicts smdebug_rulesconfig returns
(`vanishing_gradient()`, ...; parameter overrides as strings), SageMaker's
DebugRuleConfigurations entries, and smdebug_rulesconfig profiler rule objects."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..capture.hook_config import parse_hook_config
from ..config import Collection
from ..exceptions import ConfigError
from .actions import parse_actions
from .base import Rule
from .registry import build_rule, rule_class, rule_kind

if TYPE_CHECKING:
    from ..trial import Trial

# SageMaker passed these beside a rule's own parameters; they name the rule or its
# actions, not parameters of the rule.
_ACTION_KEYS = ("action_json", "actions")
_OTHER_TRIAL_KEYS = ("other_trials", "other_trial")


def _rule_entry(cfg: Mapping[str, Any]) -> tuple[str, str, dict[str, Any], list[Any]]:
    """(rule to invoke, configuration name, parameters, collection configurations)."""
    inner = cfg.get("DebugRuleConfiguration", cfg)
    if not isinstance(inner, Mapping):
        raise ConfigError(f"DebugRuleConfiguration must be an object, got {inner!r}")
    params = inner.get("RuleParameters", inner.get("rule_parameters", {})) or {}
    if not isinstance(params, Mapping):
        raise ConfigError(f"RuleParameters must be an object, got {params!r}")
    params = dict(params)
    config_name = inner.get("RuleConfigurationName") or inner.get("rule_name")
    to_invoke = params.pop("rule_to_invoke", None) or config_name
    if not to_invoke:
        raise ConfigError(f"rule configuration names no rule (RuleParameters.rule_to_invoke or RuleConfigurationName): {dict(cfg)!r}")
    collections = list(cfg.get("CollectionConfigurations") or [])
    return str(to_invoke), str(config_name or to_invoke), params, collections


def collection_configurations(entries: Iterable[Mapping[str, Any]]) -> list[Collection]:
    """Collections from smdebug's CollectionConfigurations entries (validated as the hooks
    validate them); pass them to a hook's `collections=` so a rule's tensors get saved."""
    return list(parse_hook_config({"CollectionConfigurations": list(entries)}).collections.values())


def from_config(cfg: Any, trial: Trial) -> Any:
    """A rule ready to run on `trial`, from:

    - a dict smdebug_rulesconfig returns, unchanged: {"DebugRuleConfiguration":
      {"RuleConfigurationName", "RuleParameters": {"rule_to_invoke", ...overrides}},
      "CollectionConfigurations": [...]}; string values are converted; an "action_json"
      parameter (an ActionList's serialization) or an "Actions" entry gives the actions;
    - SageMaker's flat {"RuleConfigurationName", "RuleParameters"} entry;
    - a profiler rule object (`rule_name`, `rule_parameters`) or a profiler rule's dict.

    Every rule keeps SageMaker's defaults and semantics (no `preset`). Tensor rules come
    back as Rule objects whose `collection_configurations` lists the
    collections the configuration asks the hook to save. Unknown rules or parameters raise
    ConfigError naming them and listing the valid ones."""
    if not isinstance(cfg, Mapping):
        if hasattr(cfg, "rule_name") and hasattr(cfg, "rule_parameters"):
            params = {k: v for k, v in dict(cfg.rule_parameters or {}).items() if k != "rule_to_invoke"}
            return build_rule(str(cfg.rule_name), trial, params)
        raise ConfigError(f"a rule configuration must be a dict or a profiler rule object, got {type(cfg).__name__}")
    to_invoke, config_name, params, collections = _rule_entry(cfg)
    kind = rule_kind(to_invoke)
    actions = []
    for key in _ACTION_KEYS:
        actions += parse_actions(params.pop(key, None))
    actions += parse_actions(cfg.get("Actions"))
    cls = rule_class(to_invoke)
    if kind == "profiler":
        try:
            return cls(trial, name=config_name if config_name != to_invoke else None, actions=actions, **params)
        except TypeError as exc:
            raise ConfigError(f"{config_name}: {exc}") from None
    if "other_trial" in _param_names(cls):
        for key in _OTHER_TRIAL_KEYS:
            if key in params and key != "other_trial":
                params["other_trial"] = params.pop(key)
    try:
        rule = cls(trial, name=config_name, actions=actions, **params)
    except TypeError as exc:
        raise ConfigError(f"{config_name}: {exc}") from None
    try:
        rule.collection_configurations = collection_configurations(collections)
    except ConfigError as exc:
        raise ConfigError(f"{config_name}: {exc}") from None
    return rule


def _is_profiler_report(cfg: Any) -> bool:
    if isinstance(cfg, Mapping):
        inner = cfg.get("DebugRuleConfiguration", cfg)
        params = inner.get("RuleParameters") or inner.get("rule_parameters") or {} if isinstance(inner, Mapping) else {}
        names: tuple[Any, ...] = (inner.get("RuleConfigurationName"), inner.get("rule_name"), params.get("rule_to_invoke") if isinstance(params, Mapping) else None)
    else:
        names = (getattr(cfg, "rule_name", None),)
    return any(str(n).lower() == "profilerreport" for n in names if n)


def rules_from_config(cfg: Any, trial: Trial) -> list[Any]:
    """Like `from_config`, but a ProfilerReport entry (a bundle of every profiler rule, with
    `<rule>_<parameter>` overrides) expands to its rules, followed by the ProfilerReport
    rule that writes the job's report from their results."""
    if _is_profiler_report(cfg):
        from ..profiler.rules import profiler_report_rules
        from ..report.rule import ProfilerReport

        rules = list(profiler_report_rules(cfg))
        for rule in rules:
            if trial is not None:
                rule.bind(trial)
        # ...and the report itself, from those rules' results (SageMaker's ProfilerReport output)
        return [*rules, ProfilerReport(trial, companions=rules)]
    return [from_config(cfg, trial)]


def _param_names(cls: type[Rule]) -> set[str]:
    import dataclasses

    return {f.name for f in dataclasses.fields(cls.Params)}


def load_rules_config(path: str | Path) -> list[Any]:
    """The entries of a rules configuration file: a JSON list of rule configurations, or an
    object with "DebugRuleConfigurations" / "ProfilerRuleConfigurations" lists (SageMaker's
    CreateTrainingJob shape), or a single configuration."""
    try:
        data = json.loads(Path(path).read_text())
    except OSError as exc:
        raise ConfigError(f"cannot read rules configuration {path}: {exc.strerror or exc}") from None
    except ValueError as exc:
        raise ConfigError(f"{path}: not valid JSON ({exc})") from None
    if isinstance(data, list):
        return data
    if isinstance(data, Mapping):
        lists = [k for k in ("DebugRuleConfigurations", "ProfilerRuleConfigurations", "rules") if k in data]
        if lists:
            return [entry for key in lists for entry in data[key]]
        return [data]
    raise ConfigError(f"{path}: expected a list of rule configurations, got {type(data).__name__}")


__all__ = ["from_config", "rules_from_config", "collection_configurations", "load_rules_config"]
