"""Deprecated: moved to `stepscope.capture.hook_config` (the training side's package); this
name is kept for one release."""

from ._moved import moved

__getattr__ = moved(__name__, "stepscope.capture.hook_config")
