"""Profiling: the system monitor, the framework step timeline, their reader and the profiler rules.

The training side (SystemMonitor, TimelineWriter) imports no pandas; the reader and the rules
load on first use."""

from __future__ import annotations

from .._lazy import lazy_getattr
from .monitor import VALID_INTERVALS_MS, MonitorConfig, MonitorStats, SystemMonitor, default_node_id
from .timeline import PHASES, STEP_PHASES, TimelineWriter

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
    *_LAZY,
]
