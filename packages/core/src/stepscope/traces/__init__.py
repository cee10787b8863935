"""The trace engine: Kineto / Chrome-trace JSON and TensorFlow XSpace read in one streaming
pass into columnar tables per rank, persisted as Parquet next to the job, and the analyses
over them (kernels, launches, memory copies, syncs, GPU idle time, steps, ranks) as
DataFrames. Core only: nothing here imports a framework. See docs/traces.md."""

from __future__ import annotations

import importlib
from typing import Any

_LAZY = {
    "TraceAnalysis": "analysis",
    "parse_steps": "analysis",
    "read_trace": "reader",
    "RawTrace": "reader",
    "SynthSpec": "synth",
    "GroundTruth": "synth",
    "write_trace": "synth",
    "write_timeline": "timeline",
    "KINDS": "schema",
    "EVENT_SCHEMA": "schema",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f".{module}", __name__), name)


__all__ = list(_LAZY)
