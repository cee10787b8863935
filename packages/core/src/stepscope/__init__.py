"""stepscope: debugger and profiler for deep-learning training."""

from ._lazy import lazy_getattr
from .capture.annotation import annotate
from .capture.hook_options import HookOptions
from .capture.hook_outputs import register_output as _register_output
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

__version__ = "0.1.0"

# The hook outputs the analysis side provides, by name: the training side (stepscope.capture)
# imports neither the TensorBoard export nor the report; a hook imports one only when its
# options ask for it.
_register_output("tensorboard", "stepscope.export.live:live_tensorboard")
_register_output("report", "stepscope.report.at_close:report_at_close")


_LAZY = {"Trial": "trial", "create_trial": "trial", "HookBase": "capture.hook", "StopTrainingRequested": "capture.hook", "create_profiler_trial": "profiler", "Scope": "capture.scopes"}


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
