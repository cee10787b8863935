"""Profiling, read side: the reader of system metrics and the step timeline (the profiler
rules, in stepscope.rules.profiler, stay importable from here). The training side's parts
(SystemMonitor, TimelineWriter) live in stepscope.capture and are re-exported here.

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
    # The profiler rules live in stepscope.rules.profiler; these names stay importable here
    # (lazy_getattr prefixes one dot: ".rules.profiler" is stepscope.rules.profiler).
    "PROFILER_RULES": ".rules.profiler",
    "ProfilerRule": ".rules.profiler",
    "BatchSize": ".rules.profiler",
    "CPUBottleneck": ".rules.profiler",
    "Dataloader": ".rules.profiler",
    "GPUMemoryIncrease": ".rules.profiler",
    "IOBottleneck": ".rules.profiler",
    "LoadBalancing": ".rules.profiler",
    "LowGPUUtilization": ".rules.profiler",
    "MaxInitializationTime": ".rules.profiler",
    "OverallSystemUsage": ".rules.profiler",
    "StepOutlier": ".rules.profiler",
    "from_rulesconfig": ".rules.config",
    "profiler_report_rules": ".rules.config",
    "run_profiler_rules": ".rules.profiler",
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
