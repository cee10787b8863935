"""Profiling, read side: the reader of system metrics and the step timeline, and the
profiler rules (loaded on first use). The training side's parts (SystemMonitor,
TimelineWriter) live in stepscope.capture and are re-exported here.

`PHASES` are the parts of a step (stepscope.capture.phases, one definition);
`TIMELINE_PHASES` every phase name a span of the step timeline may carry."""

from __future__ import annotations

from .._lazy import lazy_getattr
from ..capture.monitor import VALID_INTERVALS_MS, MonitorConfig, MonitorStats, SystemMonitor, default_node_id
from ..capture.phases import PHASES, STEP_PHASES, TIMELINE_PHASES
from ..capture.step_timeline import TimelineWriter

_LAZY = {
    "ProfilerTrial": "reader",
    "create_profiler_trial": "reader",
    "PROFILER_RULES": "rules",
    "ProfilerRule": "rules",
    "BatchSize": "rules",
    "CPUBottleneck": "rules",
    "Dataloader": "rules",
    "GPUMemoryIncrease": "rules",
    "IOBottleneck": "rules",
    "LoadBalancing": "rules",
    "LowGPUUtilization": "rules",
    "MaxInitializationTime": "rules",
    "OverallSystemUsage": "rules",
    "StepOutlier": "rules",
    "from_rulesconfig": "rules",
    "profiler_report_rules": "rules",
    "run_profiler_rules": "rules",
}


__getattr__ = lazy_getattr(__name__, _LAZY)


__all__ = [
    "VALID_INTERVALS_MS",
    "MonitorConfig",
    "MonitorStats",
    "SystemMonitor",
    "default_node_id",
    "TimelineWriter",
    "PHASES",
    "STEP_PHASES",
    "TIMELINE_PHASES",
    *_LAZY,
]
