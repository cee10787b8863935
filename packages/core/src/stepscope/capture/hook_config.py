"""Load smdebug's hook JSON (debughookconfig.json) into `HookOptions`, so SageMaker jobs'
existing configurations work unchanged. Every value there is a string (numbers and booleans
are accepted too); anything else gets a ConfigError naming the field."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..config import Collection, ReductionConfig, SaveConfig, SaveConfigMode, parse_bool
from ..exceptions import ConfigError
from ..modes import ModeKeys

_SAVE_KEYS = ("save_interval", "save_steps", "start_step", "end_step")
_MODE_PREFIXES = {"train": ModeKeys.TRAIN, "eval": ModeKeys.EVAL, "predict": ModeKeys.PREDICT, "global": ModeKeys.GLOBAL}
_HOOK_KEYS = {"save_all", "include_regex", "include_workers", "reductions", "save_raw_tensor", "save_shape", "export_tensorboard", "tensorboard_dir", "dry_run", "save_histogram", "include_collections"} | set(_SAVE_KEYS)
_COLLECTION_KEYS = {"include_regex", "reductions", "save_raw_tensor", "save_shape", "save_histogram"} | set(_SAVE_KEYS)

CONFIG_ENV_VAR = "STEPSCOPE_HOOK_CONFIG"


@dataclass
class HookConfig:
    """Everything a hook's constructor takes, as read from a JSON configuration."""

    out_dir: str | None = None
    save_all: bool = False
    include_regex: tuple[str, ...] = ()
    include_workers: str = "one"
    save_config: SaveConfig = field(default_factory=SaveConfig)
    reduction_config: ReductionConfig = field(default_factory=ReductionConfig)
    collections: dict[str, Collection] = field(default_factory=dict)

    @property
    def include_collections(self) -> list[str]:
        return list(self.collections)


def _scalar(where: str, value: Any) -> str | int | float | bool:
    """A configuration value: a string, number or boolean (what smdebug wrote), never a
    list or object."""
    if isinstance(value, (str, int, float, bool)):
        return value
    raise ConfigError(f"{where} must be a string, got {type(value).__name__} {_short(value)}")


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _params(where: str, value: Any) -> Mapping[str, Any]:
    """An object of parameters whose values are scalars (a list of names may also be a JSON
    list of strings, for include_regex)."""
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise ConfigError(f"{where} must be an object of parameters, got {type(value).__name__} {_short(value)}")
    for key, item in value.items():
        if not isinstance(key, str):
            raise ConfigError(f"{where}: parameter names must be strings, got {key!r}")
        if isinstance(item, (list, tuple)) and key.partition(".")[0] == "include_regex":
            for part in item:
                _scalar(f"{where}.{key}[]", part)
        else:
            _scalar(f"{where}.{key}", item)
    return value


def _mode_settings(where: str, params: Mapping[str, Any]) -> dict[ModeKeys, dict[str, Any]] | None:
    """The schedule settings of `params` for each mode (its general keys, then its
    `train.` / `eval.` / ... keys over them), or None where it gives none."""
    general = {k: params[k] for k in _SAVE_KEYS if k in params}
    per_mode: dict[ModeKeys, dict[str, Any]] = {}
    for key, value in params.items():
        prefix, _, rest = key.partition(".")
        if rest:
            if prefix not in _MODE_PREFIXES or rest not in _SAVE_KEYS:
                raise ConfigError(f"{where}: unknown key {key!r}; mode keys look like train.save_interval")
            per_mode.setdefault(_MODE_PREFIXES[prefix], {})[rest] = value
    if not general and not per_mode:
        return None
    return {mode: {**general, **per_mode.get(mode, {})} for mode in _MODE_PREFIXES.values()}


def _save_config(where: str, params: Mapping[str, Any], hook_params: Mapping[str, Any] | None = None) -> SaveConfig | None:
    """The schedule `params` give, or None where they give none. With `hook_params` (for a
    collection), a setting the collection does not give comes from the hook's, mode by
    mode and setting by setting, as smdebug's JSON configuration reads it: a collection
    given `train.save_interval` alone keeps the hook's schedule in the other modes."""
    own = _mode_settings(where, params)
    if own is None:
        return None
    inherited = _mode_settings("HookParameters", hook_params) if hook_params is not None else None
    try:
        return SaveConfig(mode_save_configs={mode: SaveConfigMode(**{**(inherited or {}).get(mode, {}), **settings}) for mode, settings in own.items()})
    except (ConfigError, TypeError) as exc:
        raise ConfigError(f"{where}: {exc}") from None


def _reduction_config(where: str, params: Mapping[str, Any]) -> ReductionConfig | None:
    if not any(k in params for k in ("reductions", "save_raw_tensor", "save_shape")):
        return None
    try:
        return ReductionConfig.from_smdebug_string(
            str(params.get("reductions", "")), params.get("save_raw_tensor", False), params.get("save_shape", False)
        )
    except ConfigError as exc:
        raise ConfigError(f"{where}: {exc}") from None


def _check_keys(where: str, params: Mapping[str, Any], allowed: set[str]) -> None:
    for key in params:
        base = key.partition(".")[2] if "." in key else key
        if base not in allowed:
            raise ConfigError(f"{where}: unknown parameter {key!r}; valid: {', '.join(sorted(allowed))}")


def _regex_list(value: Any) -> tuple[str, ...]:
    if isinstance(value, (list, tuple)):
        return tuple(str(v) for v in value)
    return tuple(part for part in str(value).split(",") if part)


def parse_hook_config(data: Mapping[str, Any]) -> HookConfig:
    if not isinstance(data, Mapping):
        raise ConfigError(f"hook configuration must be a JSON object, got {type(data).__name__}")
    hook_params = _params("HookParameters", data.get("HookParameters"))
    _check_keys("HookParameters", hook_params, _HOOK_KEYS)
    out_dir = data.get("LocalPath")
    if out_dir is not None and (not isinstance(out_dir, str) or not out_dir.strip()):
        raise ConfigError(f"LocalPath must be a non-empty path or s3:// URL, got {_short(out_dir)}")
    config = HookConfig(out_dir=out_dir)
    if "save_all" in hook_params:
        config.save_all = parse_bool("HookParameters.save_all", hook_params["save_all"])
    if "include_regex" in hook_params:
        config.include_regex = _regex_list(hook_params["include_regex"])
    if "include_workers" in hook_params:
        workers = str(hook_params["include_workers"]).strip().lower()
        if workers not in ("one", "all"):
            raise ConfigError(f"HookParameters.include_workers must be 'one' or 'all', got {hook_params['include_workers']!r}")
        config.include_workers = workers
    config.save_config = _save_config("HookParameters", hook_params) or SaveConfig()
    config.reduction_config = _reduction_config("HookParameters", hook_params) or ReductionConfig()

    entries = data.get("CollectionConfigurations") or []
    if not isinstance(entries, list):
        raise ConfigError(f"CollectionConfigurations must be a list of objects, got {_short(entries)}")
    for i, entry in enumerate(entries):
        if not isinstance(entry, Mapping):
            raise ConfigError(f"CollectionConfigurations[{i}] must be an object, got {_short(entry)}")
        name = entry.get("CollectionName")
        if not name:
            raise ConfigError(f"CollectionConfigurations[{i}].CollectionName is missing")
        if not isinstance(name, str):
            raise ConfigError(f"CollectionConfigurations[{i}].CollectionName must be a string, got {_short(name)}")
        where = f"CollectionConfigurations[{name}]"
        params = _params(f"{where}.CollectionParameters", entry.get("CollectionParameters"))
        _check_keys(where, params, _COLLECTION_KEYS)
        collection = Collection(
            name,
            include_regex=_regex_list(params["include_regex"]) if "include_regex" in params else (),
            save_config=_save_config(where, params, hook_params),
            reduction_config=_reduction_config(where, params),
            save_histogram=parse_bool(f"{where}.save_histogram", params.get("save_histogram", True)),
        )
        config.collections[name] = collection
    return config


def option_values(config: HookConfig, **overrides: Any) -> dict[str, Any]:
    """The HookOptions fields a parsed configuration gives (`HookOptions(**values)`);
    `overrides` replace fields (and give out_dir when the file has no LocalPath). Plain
    values, so this module does not import HookOptions: hook_options imports this one."""
    options: dict[str, Any] = {
        "save_config": config.save_config,
        "reduction_config": config.reduction_config,
        "collections": tuple(config.collections.values()),
        "include_regex": config.include_regex,
        "save_all": config.save_all,
        "include_workers": config.include_workers,
    }
    if config.out_dir:
        options["out_dir"] = config.out_dir
    options.update(overrides)
    if not options.get("out_dir"):
        raise ConfigError("out_dir: the hook configuration has no LocalPath; pass out_dir=...")
    return options


def load_hook_config(path: str | os.PathLike[str] | None = None) -> HookConfig:
    """Read a JSON hook configuration from `path` (or $STEPSCOPE_HOOK_CONFIG)."""
    path = path or os.environ.get(CONFIG_ENV_VAR)
    if not path:
        raise ConfigError(f"no hook configuration given (pass a path or set {CONFIG_ENV_VAR})")
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise ConfigError(f"cannot read hook configuration {path}: {exc.strerror or exc}") from None
    try:
        data = json.loads(text)
    except RecursionError:
        raise ConfigError(f"{path}: JSON nested too deeply") from None
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{path}: not valid JSON ({exc})") from None
    try:
        return parse_hook_config(data)
    except ConfigError as exc:
        raise ConfigError(f"{path}: {exc}") from None
