"""stepscope: debugger and profiler for deep-learning training."""

from ._lazy import lazy_getattr
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


_LAZY = {"Trial": "trial", "create_trial": "trial", "HookBase": "hook", "StopTrainingRequested": "hook", "create_profiler_trial": "profiler", "Scope": "scopes"}


__getattr__ = lazy_getattr(__name__, _LAZY)


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
    "Scope",
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
