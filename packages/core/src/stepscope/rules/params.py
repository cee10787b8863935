"""Typed rule parameters: one frozen dataclass per rule, built from keyword values or from
the strings SageMaker / smdebug_rulesconfig configurations carry ("0.1", "True", "a,b")."""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Union

from ..config import parse_bool
from ..exceptions import ConfigError
from ..modes import ModeKeys


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
            number = float(value)
            if math.isnan(number):
                raise ValueError
            return number
        if kind is str:
            if not isinstance(value, (str, int, float)):
                raise ValueError
            return str(value)
    except ConfigError:
        raise
    except (TypeError, ValueError, OverflowError):
        raise ConfigError(f"{owner}.{name} must be {getattr(kind, '__name__', kind)}, got {value!r}") from None
    return value


@dataclass(frozen=True)
class RuleParams:
    """Base of every rule's parameters. Subclasses are frozen dataclasses whose fields carry
    the defaults (SageMaker's, where the rule comes from SageMaker); `parse` converts
    strings, rejects unknown names, then `validate` checks ranges."""

    @classmethod
    def parse(cls, owner: str, values: Mapping[str, Any]) -> RuleParams:
        hints = typing.get_type_hints(cls)
        fields = {f.name: f for f in dataclasses.fields(cls)}
        unknown = sorted(set(values) - set(fields))
        if unknown:
            raise ConfigError(f"{owner}: unknown parameter(s) {', '.join(map(repr, unknown))}; valid: {', '.join(fields) or '(none)'}")
        converted = {name: _convert(owner, name, hints[name], value) for name, value in values.items()}
        params = cls(**converted)
        params._check_ranges(owner)
        params.validate(owner)
        return params

    def _check_ranges(self, owner: str) -> None:
        for f in dataclasses.fields(self):
            kind = f.metadata.get("range")
            value = getattr(self, f.name)
            if kind is None or value is None:
                continue
            if kind == "mode":
                normalize_mode(self, owner, f.name)
                continue
            ok, what = _RANGES[kind]
            if not (math.isfinite(value) and ok(value)):
                raise ConfigError(f"{owner}.{f.name} must be {what}, got {value!r}")

    @classmethod
    def defaults(cls) -> dict[str, Any]:
        return {f.name: f.default for f in dataclasses.fields(cls) if f.default is not dataclasses.MISSING}

    def validate(self, owner: str) -> None:
        """Check values together (ranges, required combinations); raise ConfigError."""

    def to_json(self) -> dict[str, Any]:
        return {k: list(v) if isinstance(v, tuple) else v for k, v in dataclasses.asdict(self).items()}


_RANGES = {
    "percent": (lambda v: 0 <= v <= 100, "a percentage in [0, 100]"),
    "fraction": (lambda v: 0 <= v <= 1, "a number in [0, 1]"),
    "positive": (lambda v: v > 0, "a number > 0"),
    "non_negative": (lambda v: v >= 0, "a number >= 0"),
    "count": (lambda v: v >= 0, "an integer >= 0"),
    "positive_int": (lambda v: v >= 1, "an integer >= 1"),
}


def ranged(default: Any, kind: str) -> Any:
    """A parameter field whose value must lie in a named range: "percent", "fraction",
    "positive", "non_negative", "count" (int >= 0), "positive_int" (int >= 1), or "mode"
    (a mode name, normalised to TRAIN/EVAL/PREDICT/GLOBAL)."""
    if kind != "mode" and kind not in _RANGES:
        raise ValueError(f"unknown range {kind!r}")
    return field(default=default, metadata={"range": kind})


def require(owner: str, name: str, value: Any, ok: bool, what: str) -> None:
    """Raise ConfigError "`owner.name` must be `what`, got `value`" unless `ok`."""
    if not ok:
        raise ConfigError(f"{owner}.{name} must be {what}, got {value!r}")


def require_percent(owner: str, name: str, value: float) -> None:
    require(owner, name, value, 0 <= value <= 100, "a percentage in [0, 100]")


def normalize_mode(params: RuleParams, owner: str, name: str = "mode") -> None:
    """Replace a mode parameter's text ("train", "ModeKeys.TRAIN", "1") by its name."""
    value = getattr(params, name)
    if value is None:
        return
    text = str(value).strip()
    text = text.split(".", 1)[1] if text.startswith("ModeKeys.") else text
    try:
        object.__setattr__(params, name, ModeKeys.parse(text).name)
    except ValueError:
        raise ConfigError(f"{owner}.{name} must be a mode (TRAIN, EVAL, PREDICT, GLOBAL), got {value!r}") from None


__all__ = ["RuleParams", "ranged", "require", "require_percent", "normalize_mode"]
