"""stepscope: debugger and profiler for deep-learning training."""

from .annotation import annotate
from .config import Collection, CollectionName, ReductionConfig, SaveConfig, SaveConfigMode
from .exceptions import (
    ConfigError,
    CorruptRecord,
    NoMoreData,
    StepNotYetAvailable,
    StepscopeError,
    StepUnavailable,
    TensorUnavailable,
    TensorUnavailableForStep,
)
from .hook_options import HookOptions
from .modes import ModeKeys

__version__ = "0.1.0"


_LAZY = {"Trial": "trial", "create_trial": "trial", "HookBase": "hook", "StopTrainingRequested": "hook", "create_profiler_trial": "profiler"}


def __getattr__(name: str):
    # The read side (trial, profiler reader: pandas) loads on first use, so that the
    # training side, and the monitor's sampler process, do not pay for it.
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'stepscope' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(f".{module}", __name__), name)


__all__ = [
    "annotate",
    "Collection",
    "CollectionName",
    "ConfigError",
    "CorruptRecord",
    "HookBase",
    "HookOptions",
    "ModeKeys",
    "NoMoreData",
    "ReductionConfig",
    "SaveConfig",
    "SaveConfigMode",
    "StepNotYetAvailable",
    "StepUnavailable",
    "StepscopeError",
    "StopTrainingRequested",
    "TensorUnavailable",
    "TensorUnavailableForStep",
    "Trial",
    "create_trial",
    "create_profiler_trial",
]
