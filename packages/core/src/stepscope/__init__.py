"""stepscope: debugger and profiler for deep-learning training."""

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
from .modes import ModeKeys
from .trial import Trial, create_trial

__version__ = "0.1.0"

__all__ = [
    "Collection",
    "CollectionName",
    "ConfigError",
    "CorruptRecord",
    "ModeKeys",
    "NoMoreData",
    "ReductionConfig",
    "SaveConfig",
    "SaveConfigMode",
    "StepNotYetAvailable",
    "StepUnavailable",
    "StepscopeError",
    "TensorUnavailable",
    "TensorUnavailableForStep",
    "Trial",
    "create_trial",
]
