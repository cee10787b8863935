"""Deprecated: moved to `stepscope.capture.job_claim` (the training side's package); this
name is kept for one release."""

from ._moved import moved

__getattr__ = moved(__name__, "stepscope.capture.job_claim")
