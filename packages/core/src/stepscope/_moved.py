"""Deprecated import paths: the modules that moved into `stepscope.capture` (the training
side) keep their old names for one release. Importing an old name warns once
(DeprecationWarning) and forwards every attribute, private ones included, to the new
module, so code written against the old path keeps working unchanged until then."""

from __future__ import annotations

import importlib
import warnings
from collections.abc import Callable, Mapping
from typing import Any


def moved(old: str, new: str, elsewhere: Mapping[str, str] | None = None) -> Callable[[str], Any]:
    """The `__getattr__` of alias module `old`: its names now live in module `new` (or, for
    the names in `elsewhere`, in the module it gives for each). Warns now, at import."""
    warnings.warn(f"{old} moved to {new}; the old name goes away in the next release", DeprecationWarning, stacklevel=3)
    others = dict(elsewhere or {})

    def __getattr__(name: str) -> Any:
        module = importlib.import_module(others.get(name, new))
        try:
            return getattr(module, name)
        except AttributeError:
            raise AttributeError(f"module {old!r} (now {new!r}) has no attribute {name!r}") from None

    return __getattr__
