"""The trace engine: Kineto / Chrome-trace JSON and TensorFlow XSpace read in one streaming
pass into columnar tables per rank, persisted as Parquet next to the job, and the analyses
over them (kernels, launches, memory copies, syncs, GPU idle time, steps, ranks) as
DataFrames. Core only: nothing here imports a framework. See docs/traces.md."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._lazy import lazy_getattr

if TYPE_CHECKING:
    from .analysis import TraceAnalysis

_LAZY = {
    "TraceAnalysis": "analysis",
    "parse_steps": "analysis",
    "read_trace": "reader",
    "RawTrace": "reader",
    "SynthSpec": "synth",
    "GroundTruth": "synth",
    "write_trace": "synth",
    # The merged Perfetto trace moved to stepscope.export.perfetto; the name stays importable
    # here (lazy_getattr prefixes one dot: ".export.perfetto" is stepscope.export.perfetto).
    "write_timeline": ".export.perfetto",
    "KINDS": "schema",
    "EVENT_SCHEMA": "schema",
}


__getattr__ = lazy_getattr(__name__, _LAZY)


__all__ = list(_LAZY)


def open(path: str, *, persist: bool = True) -> TraceAnalysis:  # noqa: A001 - stepscope.traces.open(path), like open()
    """The analyses of a job's traces, a folder of Kineto / XSpace traces (nested: e.g.
    torch.profiler.tensorboard_trace_handler's output, HTA's rank folders) or one trace file
    (.json, .json.gz, .pt.trace.json, .xplane.pb), local or s3:// (docs/traces.md)."""
    from .analysis import TraceAnalysis

    return TraceAnalysis(path, persist=persist)
