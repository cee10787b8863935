"""stepscope for TensorFlow/Keras 3: `StepscopeCallback` for fit/evaluate/predict (with
gradients captured inside `fit`) and `Hook` for custom training loops."""

from stepscope.capture import public
from stepscope.capture.public import *  # noqa: F403 - the core names every plugin re-exports

from .callback import StepscopeCallback
from .hook import Hook

__version__ = "0.1.0"

__all__ = [*public.__all__, "Hook", "StepscopeCallback"]
