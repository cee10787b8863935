"""Package attributes loaded on first use (PEP 562): importing a package does not import
pandas, pyarrow or matplotlib until a name that needs them is asked for."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any


def lazy_getattr(package: str, modules: Mapping[str, str]) -> Callable[[str], Any]:
    """A module `__getattr__` for `package`: `modules` maps each lazy name to the submodule
    (relative to the package) that defines it."""

    def __getattr__(name: str) -> Any:
        module = modules.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return getattr(importlib.import_module(f".{module}", package), name)

    return __getattr__
