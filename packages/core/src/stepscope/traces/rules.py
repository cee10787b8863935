"""Deprecated alias of stepscope.rules.traces (the trace rules moved there); kept for one
release."""

import warnings

from ..rules.traces import TRACE_RULES, HighLaunchLatency, ManySyncsPerStep, MemcpyBoundStep, SmallKernelsDominating, TraceRule

warnings.warn("stepscope.traces.rules is deprecated; import from stepscope.rules.traces", DeprecationWarning, stacklevel=2)

__all__ = ["TRACE_RULES", "TraceRule", "HighLaunchLatency", "ManySyncsPerStep", "MemcpyBoundStep", "SmallKernelsDominating"]
