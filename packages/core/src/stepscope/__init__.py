"""stepscope: debugger and profiler for deep-learning training."""

from .annotations import annotate
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


def __getattr__(name: str):
    # The profiler reader needs pandas; import it only when asked for, so the training
    # side (hooks import stepscope) does not pay for it.
    if name == "create_profiler_trial":
        from .profiler import create_profiler_trial

        return create_profiler_trial
    raise AttributeError(f"module 'stepscope' has no attribute {name!r}")


__all__ = [
    "annotate",
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
    "create_profiler_trial",
]
