"""Scopes: which parameters belong to one network (or one optimizer's parameter groups).

A hook declares a scope per registered model and per optimizer; the collections file's
`_meta.scopes` carries them, and rules compare a layer only with the layers of its own
scope (a GAN's generator is never judged against its discriminator). Used by both sides:
the hook validates and writes, the trial parses the same shape as untrusted input.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..exceptions import ConfigError

SCOPE_KINDS = ("model", "optimizer")
MAX_SCOPES = 256
MAX_SCOPE_PARAMETERS = 200_000
MAX_NAME_LENGTH = 1024
WHOLE_JOB = "job"  # the one scope of a job that declared none

# A tensor saved for parameter P: P itself, its gradient, and their reductions.
_REDUCTION_PREFIX = re.compile(r"^smdebug/reductions/(?:abs_)?[a-z0-9_]+/")
_GRADIENT_PREFIXES = ("gradient/", "gradients/")  # torch's, TensorFlow's


@dataclass(frozen=True)
class Scope:
    """One network or one optimizer's parameters. `parameters` are the tensor names as the
    weights/biases collections save them (the gradient of P is saved as `gradient/P`)."""

    name: str
    kind: str
    parameters: tuple[str, ...]

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name.strip() or len(self.name) > MAX_NAME_LENGTH:
            raise ConfigError(f"scope name must be a non-empty string of at most {MAX_NAME_LENGTH} characters, got {self.name!r:.80}")
        if self.kind not in SCOPE_KINDS:
            raise ConfigError(f"scope {self.name!r}: kind must be one of {', '.join(SCOPE_KINDS)}, got {self.kind!r:.80}")
        if len(self.parameters) > MAX_SCOPE_PARAMETERS:
            raise ConfigError(f"scope {self.name!r}: {len(self.parameters)} parameters, at most {MAX_SCOPE_PARAMETERS}")
        for p in self.parameters:
            if not isinstance(p, str) or not p or len(p) > MAX_NAME_LENGTH:
                raise ConfigError(f"scope {self.name!r}: a parameter name must be a non-empty string of at most {MAX_NAME_LENGTH} characters, got {p!r:.80}")

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "kind": self.kind, "parameters": list(self.parameters)}


def make_scope(name: Any, parameters: Any, kind: Any = "model") -> Scope:
    """A checked Scope from caller input; ConfigError names what was wrong."""
    if isinstance(parameters, (str, bytes)) or not isinstance(parameters, Iterable):
        raise ConfigError(f"scope {name!r:.80}: parameters must be an iterable of tensor names, got {type(parameters).__name__}")
    names: list[str] = []
    for p in parameters:
        if len(names) >= MAX_SCOPE_PARAMETERS:
            raise ConfigError(f"scope {name!r:.80}: more than {MAX_SCOPE_PARAMETERS} parameters")
        names.append(p)
    return Scope(name, kind, tuple(dict.fromkeys(names)))


def merge_scope(existing: Scope | None, new: Scope) -> Scope:
    """A scope declared again (another parameter group, a model registered twice) keeps
    the union of its parameters; a different kind is an error."""
    if existing is None:
        return new
    if existing.kind != new.kind:
        raise ConfigError(f"scope {new.name!r} was declared as {existing.kind!r} and now as {new.kind!r}")
    return Scope(new.name, new.kind, tuple(dict.fromkeys(existing.parameters + new.parameters)))


def parse_scopes(raw: Any, where: str) -> list[Scope]:
    """`_meta.scopes` of a collections file, read as untrusted input. A bad entry is
    skipped (the others stay usable); a wrong container is an error naming the file."""
    if raw is None:
        return []
    if not isinstance(raw, list):
        raise ConfigError(f"{where}: _meta.scopes must be a JSON list, got {type(raw).__name__}")
    if len(raw) > MAX_SCOPES:
        raise ConfigError(f"{where}: _meta.scopes has {len(raw)} entries, at most {MAX_SCOPES}")
    scopes: list[Scope] = []
    for i, entry in enumerate(raw):
        if not isinstance(entry, Mapping):
            raise ConfigError(f"{where}: _meta.scopes[{i}] must be a JSON object, got {type(entry).__name__}")
        params = entry.get("parameters", [])
        if not isinstance(params, list):
            raise ConfigError(f"{where}: _meta.scopes[{i}].parameters must be a JSON list, got {type(params).__name__}")
        try:
            scopes.append(Scope(entry.get("name", ""), entry.get("kind", "model"), tuple(params)))
        except ConfigError as exc:
            raise ConfigError(f"{where}: _meta.scopes[{i}]: {exc}") from None
    return scopes


def parameter_of(tensor_name: str) -> str:
    """The parameter a saved tensor is about: `gradient/P` (torch) or `gradients/P`
    (TensorFlow) -> P, reductions stripped."""
    name = _REDUCTION_PREFIX.sub("", tensor_name, count=1)
    for prefix in _GRADIENT_PREFIXES:
        if name.startswith(prefix):
            return name[len(prefix) :]
    return name


class ScopeMap:
    """Maps tensor names to the scopes that hold them. A job without scopes is one scope
    (WHOLE_JOB). `group_of` is what rules compare within: the tensor's model scope, else
    its optimizer scope, else WHOLE_JOB (parameters no scope lists)."""

    def __init__(self, scopes: Sequence[Scope] = ()):
        self.scopes: tuple[Scope, ...] = tuple(scopes)
        self._of: dict[str, list[Scope]] = {}
        for scope in self.scopes:
            for p in scope.parameters:
                self._of.setdefault(p, []).append(scope)

    def scopes_of(self, tensor_name: str) -> tuple[Scope, ...]:
        return tuple(self._of.get(parameter_of(tensor_name), ()))

    def group_of(self, tensor_name: str) -> str:
        found = self.scopes_of(tensor_name)
        for kind in SCOPE_KINDS:
            for scope in found:
                if scope.kind == kind:
                    return scope.name
        return WHOLE_JOB

    def __bool__(self) -> bool:
        return bool(self.scopes)


__all__ = ["Scope", "ScopeMap", "make_scope", "merge_scope", "parse_scopes", "parameter_of", "SCOPE_KINDS", "WHOLE_JOB"]
