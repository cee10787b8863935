"""stepscope for TensorFlow/Keras 3: `StepscopeCallback` for fit/evaluate/predict (with
gradients captured inside `fit`) and `Hook` for custom training loops."""

from stepscope.capture.hook import StopTrainingRequested
from stepscope.capture.hook_options import HookOptions
from stepscope.config import Collection, CollectionName, ProfilerConfig, ReductionConfig, SaveConfig, SaveConfigMode
from stepscope.exceptions import ConfigError
from stepscope.modes import ModeKeys

from .callback import StepscopeCallback
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
]
