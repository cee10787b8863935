"""The one rule builder: every way a rule is named (a command-line string, the dicts
smdebug_rulesconfig returns, SageMaker's DebugRuleConfigurations / ProfilerRuleConfigurations
entries, smdebug_rulesconfig profiler rule objects, a rules file) is read into one
`RuleSpec`, and `build` turns it into a rule from the catalog (rules.registry)."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..capture.hook_config import parse_hook_config
from ..config import Collection
from ..exceptions import ConfigError
from .actions import Action, parse_actions
from .base import JobRule, Rule
from .registry import is_known, profiler_rules, rule_class, rule_kind, system_rules

if TYPE_CHECKING:
    from ..trial import Trial

# SageMaker passed these beside a rule's own parameters; they name the rule or its
# actions, not parameters of the rule.
_ACTION_KEYS = ("action_json", "actions")
_OTHER_TRIAL_KEYS = ("other_trials", "other_trial")
_REPORT_BUNDLE = "profilerreport"  # SageMaker's ProfilerReport: every profiler rule, then the report


@dataclass
class RuleSpec:
    """One rule as a configuration names it, whatever the shape it came in: the rule to
    invoke (a catalog name or `package.module:ClassName`), the name its report goes by,
    its parameters (strings are converted by the rule's Params), actions and the
    collections it asks the hook to save."""

    rule: str
    name: str
    parameters: dict[str, Any] = field(default_factory=dict)
    actions: list[Action] = field(default_factory=list)
    collections: list[Any] = field(default_factory=list)

    @property
    def is_report_bundle(self) -> bool:
        return self.rule.lower() == _REPORT_BUNDLE or self.name.lower() == _REPORT_BUNDLE


def parse_rule_spec(spec: str) -> tuple[str, dict[str, str]]:
    """A command-line rule: `NAME`, `NAME:key=value,key=value`, `package.module:ClassName`
    or `package.module:ClassName:key=value,...` -> (name, parameters). A comma-separated
    item without `=` continues the previous value, so lists work: `token_values=0,1`."""
    parts = spec.split(":")
    known = is_known(parts[0])
    if len(parts) >= 2 and "=" not in parts[1] and not known:
        name, rest = f"{parts[0]}:{parts[1]}", ":".join(parts[2:])
    else:
        name, rest = parts[0], ":".join(parts[1:])
    if not name.strip(":"):
        raise ConfigError(f"{spec!r}: no rule name")
    params: dict[str, str] = {}
    last = None
    for item in rest.split(",") if rest else []:
        if "=" in item:
            key, _, value = item.partition("=")
            last = key.strip()
            if not last:
                raise ConfigError(f"{spec!r}: empty parameter name in {item!r}")
            params[last] = value.strip()
        elif last is not None:
            params[last] += "," + item.strip()
        else:
            raise ConfigError(f"{spec!r}: expected key=value, got {item!r}")
    return name, params


def rule_spec(cfg: Any) -> RuleSpec:
    """The RuleSpec of any configuration shape stepscope reads:

    - a command-line string (`parse_rule_spec`);
    - a dict smdebug_rulesconfig returns, unchanged: {"DebugRuleConfiguration":
      {"RuleConfigurationName", "RuleParameters": {"rule_to_invoke", ...overrides}},
      "CollectionConfigurations": [...]}; an "action_json" parameter (an ActionList's
      serialization) or an "Actions" entry gives the actions;
    - SageMaker's flat {"RuleConfigurationName", "RuleParameters"} entry;
    - a profiler rule object (`rule_name`, `rule_parameters`), its dict {"rule_name",
      "rule_parameters"}, or flat parameters with "rule_to_invoke"."""
    if isinstance(cfg, str):
        name, given = parse_rule_spec(cfg)
        return RuleSpec(name, name, dict(given))
    if not isinstance(cfg, Mapping):
        if hasattr(cfg, "rule_name") and hasattr(cfg, "rule_parameters"):
            values = dict(cfg.rule_parameters or {})
            rule = str(values.pop("rule_to_invoke", None) or cfg.rule_name)
            return RuleSpec(rule, str(cfg.rule_name), values)
        raise ConfigError(f"a rule configuration must be a dict or a profiler rule object, got {type(cfg).__name__}")
    inner = cfg.get("DebugRuleConfiguration", cfg)
    if not isinstance(inner, Mapping):
        raise ConfigError(f"DebugRuleConfiguration must be an object, got {inner!r}")
    named = any(k in inner for k in ("RuleParameters", "rule_parameters", "RuleConfigurationName", "rule_name"))
    raw = inner.get("RuleParameters", inner.get("rule_parameters", {})) if named else inner
    if raw is not None and not isinstance(raw, Mapping):
        raise ConfigError(f"RuleParameters must be an object, got {raw!r}")
    params: dict[str, Any] = dict(raw or {})
    config_name = inner.get("RuleConfigurationName") or inner.get("rule_name")
    to_invoke = params.pop("rule_to_invoke", None) or config_name
    if not to_invoke:
        raise ConfigError(f"rule configuration names no rule (RuleParameters.rule_to_invoke or RuleConfigurationName): {dict(cfg)!r}")
    actions: list[Action] = []
    for key in _ACTION_KEYS:
        actions += parse_actions(params.pop(key, None))
    actions += parse_actions(cfg.get("Actions"))
    collections = list(cfg.get("CollectionConfigurations") or [])
    return RuleSpec(str(to_invoke), str(config_name or to_invoke), params, actions, collections)


def build(spec: RuleSpec, trial: Any, **kwargs: Any) -> Rule:
    """The rule a RuleSpec names, bound to `trial` (None: a whole-job rule given its job
    later). Tensor rules keep the configuration's name and get its collections; whole-job
    rules keep their own name unless the configuration renamed them."""
    kind = rule_kind(spec.rule)
    cls = rule_class(spec.rule)
    params = dict(spec.parameters)
    if kind != "tensor" and spec.name == spec.rule:
        name = None
    else:
        name = spec.name
    if "other_trial" in _param_names(cls):
        for key in _OTHER_TRIAL_KEYS:
            if key in params and key != "other_trial":
                params["other_trial"] = params.pop(key)
    try:
        rule = cls(trial, name=name, actions=list(spec.actions), **kwargs, **params)
    except TypeError as exc:
        raise ConfigError(f"{spec.name}: {exc}") from None
    if spec.collections:
        try:
            rule.collection_configurations = collection_configurations(spec.collections)
        except ConfigError as exc:
            raise ConfigError(f"{spec.name}: {exc}") from None
    return rule


def build_rule(name: str, trial: Any, params: Mapping[str, Any] | None = None, **kwargs: Any) -> Rule:
    """A rule by name (a catalog name or `package.module:ClassName`) with (string)
    parameters, SageMaker's defaults for the rest."""
    cls = rule_class(name)
    try:
        return cls(trial, **kwargs, **dict(params or {}))
    except TypeError as exc:
        raise ConfigError(f"{name}: {exc}") from None


def collection_configurations(entries: Iterable[Mapping[str, Any]]) -> list[Collection]:
    """Collections from smdebug's CollectionConfigurations entries (validated as the hooks
    validate them); pass them to a hook's `collections=` so a rule's tensors get saved."""
    return list(parse_hook_config({"CollectionConfigurations": list(entries)}).collections.values())


def from_config(cfg: Any, trial: Trial | None) -> Any:
    """A rule ready to run on `trial`, from any shape `rule_spec` reads. Every rule keeps
    SageMaker's defaults and semantics (no `preset`). Tensor rules come back as Rule objects
    whose `collection_configurations` lists the collections the configuration asks the
    hook to save. Unknown rules or parameters raise ConfigError naming them and listing
    the valid ones."""
    return build(rule_spec(cfg), trial)


def rules_from_config(cfg: Any, trial: Trial | None) -> list[Any]:
    """Like `from_config`, but a ProfilerReport entry (a bundle of every profiler rule, with
    `<rule>_<parameter>` overrides) expands to its rules, followed by the ProfilerReport
    rule that writes the job's report from their results."""
    spec = rule_spec(cfg)
    if not spec.is_report_bundle:
        return [build(spec, trial)]
    rules = profiler_report_rules(spec.parameters)
    if trial is not None:
        for rule in rules:
            rule.bind(trial)
    # ...and the report itself, from those rules' results (SageMaker's ProfilerReport output)
    return [*rules, rule_class("ProfilerReport")(trial, companions=rules)]


def from_rulesconfig(config: Any) -> JobRule:
    """A whole-job rule, not yet bound to a job, from a name, a smdebug_rulesconfig profiler
    rule object (`rule_name`, `rule_parameters`) or a dict (any shape `rule_spec` reads).
    For ProfilerReport use `profiler_report_rules`."""
    spec = rule_spec(config)
    if spec.is_report_bundle:
        raise ConfigError("rule_name: 'ProfilerReport' is a bundle of rules; use profiler_report_rules()")
    if rule_kind(spec.rule) == "tensor":
        raise ConfigError(f"rule_name: {spec.rule!r} is a tensor rule, not a whole-job rule ({', '.join(profiler_rules())})")
    rule = build(spec, None)
    if not isinstance(rule, JobRule):
        raise ConfigError(f"rule_name: {spec.rule!r} is not a whole-job rule")
    return rule


def profiler_report_rules(config: Any = None) -> list[JobRule]:
    """All the profiler rules, as SageMaker's ProfilerReport ran them, with its overrides:
    parameters named `<rule>_<parameter>` (rule name in any case), from a ProfilerReport
    object, a rulesconfig dict, or a plain dict of those parameters."""
    bundled = system_rules()
    parameters: Mapping[str, Any] = {}
    if config is not None:
        looks_like_rule = hasattr(config, "rule_parameters") or (
            isinstance(config, Mapping) and ({"rule_name", "RuleParameters", "rule_to_invoke", "DebugRuleConfiguration"} & set(config))
        )
        parameters = rule_spec(config).parameters if looks_like_rule else config
    by_lower = {name.lower(): name for name in bundled}
    overrides: dict[str, dict[str, Any]] = {name: {} for name in bundled}
    for key, value in parameters.items():
        rule, _, parameter = str(key).partition("_")
        if rule.lower() not in by_lower or not parameter:
            raise ConfigError(f"{key}: not <rule>_<parameter> with rule one of {', '.join(bundled)}")
        overrides[by_lower[rule.lower()]][parameter.lower()] = value
    rules = [cls(None, **overrides[name]) for name, cls in bundled.items()]
    return [rule for rule in rules if isinstance(rule, JobRule)]


def _param_names(cls: type[Rule]) -> set[str]:
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


__all__ = [
    "RuleSpec", "rule_spec", "parse_rule_spec", "build", "build_rule", "from_config", "rules_from_config", "from_rulesconfig",
    "profiler_report_rules", "collection_configurations", "load_rules_config",
]
