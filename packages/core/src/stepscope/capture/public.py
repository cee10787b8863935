"""The names every framework package re-exports from core (`from stepscope_torch import
SaveConfig` works as `from stepscope import SaveConfig` does): one list for all plugins."""

from __future__ import annotations

from ..config import Collection, CollectionName, ProfilerConfig, ReductionConfig, SaveConfig, SaveConfigMode
from ..exceptions import ConfigError
from ..modes import ModeKeys
from .hook_options import HookOptions
from .stop import StopTrainingRequested

__all__ = [
    "Collection",
    "CollectionName",
    "ConfigError",
    "HookOptions",
    "ModeKeys",
    "ProfilerConfig",
    "ReductionConfig",
    "SaveConfig",
    "SaveConfigMode",
    "StopTrainingRequested",
]
