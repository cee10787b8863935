"""stepscope for PyTorch: `Hook` for hand-written training loops, `StepscopeCallback` for
Lightning (imported on first use, so this package works without Lightning installed)."""

from __future__ import annotations

from typing import Any

from stepscope.capture.hook import StopTrainingRequested
from stepscope.capture.hook_options import HookOptions
from stepscope.config import Collection, CollectionName, ProfilerConfig, ReductionConfig, SaveConfig, SaveConfigMode
from stepscope.exceptions import ConfigError
from stepscope.modes import ModeKeys

from .blackbox import black_box
from .hook import Hook

__version__ = "0.1.0"

__all__ = [
    "Collection",
    "CollectionName",
    "ConfigError",
    "Hook",
    "HookOptions",
    "ModeKeys",
    "ProfilerConfig",
    "ReductionConfig",
    "SaveConfig",
    "SaveConfigMode",
    "StepscopeCallback",
    "StopTrainingRequested",
    "black_box",
]


def __getattr__(name: str) -> Any:
    if name == "StepscopeCallback":
        from .lightning import StepscopeCallback

        return StepscopeCallback
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
