"""stepscope for PyTorch: `Hook` for hand-written training loops, `StepscopeCallback` for
Lightning (imported on first use, so this package works without Lightning installed)."""

from __future__ import annotations

from typing import Any

from stepscope.capture import public
from stepscope.capture.public import *  # noqa: F403 - the core names every plugin re-exports

from .blackbox import black_box
from .hook import Hook

__version__ = "0.1.0"

__all__ = [*public.__all__, "Hook", "StepscopeCallback", "black_box"]  # noqa: F405 - StepscopeCallback: __getattr__ below


def __getattr__(name: str) -> Any:
    if name == "StepscopeCallback":
        from .lightning import StepscopeCallback

        return StepscopeCallback
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
