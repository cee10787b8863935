"""Detailed profiling for PyTorch: inside the windows of ProfilerConfig, torch.profiler
(Kineto: CPU ops with shapes, CUDA runtime calls, kernels, memcpy/memset, syncs, memory
events) writes one gzip Kineto trace per window per rank under
`profiler-output/framework/pytorch/detailed/`, with the `distributedInfo` HTA expects;
cProfile and data-loader timing run in their own windows. `create_profiling` returns
None when no window is configured, so a hook without windows pays nothing.

A window never synchronizes the device (kernels are given to their step by the runtime
call that launched them, not by waiting for them), starts with torch.profiler's own
warm-up (its schedule: the warm-up steps run the profiler and are thrown away), and
leaves the export and compression to the background publisher."""

from __future__ import annotations

import functools
import gzip
import os
import pickle
import tempfile
import time
from collections.abc import Callable
from typing import Any

import torch

from stepscope.capture import annotation
from stepscope.capture.detailed import Payload, StepMarker, WindowedProfilers, add_distributed_info, detailed_dir
from stepscope.config import ProfilerConfig
from stepscope.layout import MEMORY_SNAPSHOT_DIR
from stepscope.store import Store

TRACE_SUFFIX = ".pt.trace.json.gz"
SNAPSHOT_SUFFIX = ".pickle.gz"
MEMORY_DIR = MEMORY_SNAPSHOT_DIR  # allocator snapshots of the windows (memory_history)


def _record_function(name: str) -> Any:
    return torch.autograd.profiler.record_function(name)


def warmup_schedule(warmup_steps: int) -> Callable[[int], Any]:
    """torch.profiler's schedule for a window: warm-up for the first `warmup_steps` of its
    steps (counted by torch from 0), then record until the window is stopped."""
    action = torch.profiler.ProfilerAction

    def schedule(step: int) -> Any:
        return action.WARMUP if step < warmup_steps else action.RECORD

    return schedule


class KinetoBackend:
    """torch.profiler over one window; each step is marked `ProfilerStep#<global step>`
    (the name torch.profiler's own schedule writes, with our step numbers: its own
    markers, numbered from 0, are turned off)."""

    def __init__(self, config: ProfilerConfig, rank: int, world_size: int):
        self.config = config
        self.rank = rank
        self.world_size = world_size
        self._profile: Any = None
        self._step_marker = StepMarker()
        self._steps = 0
        self._history = False  # recording the CUDA allocator's history (memory_history)

    def start(self, step: int, warmup_steps: int = 0) -> None:
        activities = [torch.profiler.ProfilerActivity.CPU]
        if torch.cuda.is_available():
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        self._profile = torch.profiler.profile(
            activities=activities,
            schedule=warmup_schedule(warmup_steps),
            record_shapes=self.config.record_shapes,
            profile_memory=self.config.profile_memory,
            with_stack=self.config.with_stack,
        )
        self._profile.record_steps = False  # our ProfilerStep#<global step> markers instead of its #0, #1...
        self._steps = 0
        self._history = self.config.memory_history and torch.cuda.is_available()
        if self._history:  # the allocator's actions with stacks, until the window stops
            torch.cuda.memory._record_memory_history(max_entries=self.config.memory_history_entries)
        self._profile.__enter__()
        annotation.set_backend(_record_function, True)

    def step_start(self, step: int) -> None:
        if self._steps and self._profile is not None:
            self._profile.step()  # torch's schedule moves on (warm-up -> record) at the step boundary
        self._steps += 1
        self._step_marker.enter(_record_function(f"ProfilerStep#{step}"))

    def step_end(self, step: int) -> None:
        self._step_marker.exit()

    def stop(self) -> list[tuple[str, str, Payload]]:
        annotation.set_backend(_record_function, False)
        self._step_marker.exit()
        profile, self._profile = self._profile, None
        if profile is None:
            return []
        profile.__exit__(None, None, None)  # on this thread: Kineto stops and hands its events over
        backend = torch.distributed.get_backend() if torch.distributed.is_available() and torch.distributed.is_initialized() else "nccl" if torch.cuda.is_available() else "gloo"
        files: list[tuple[str, str, Payload]] = [(detailed_dir("pytorch"), TRACE_SUFFIX, functools.partial(_export, profile, backend, self.rank, self.world_size))]
        if self._history:
            self._history = False
            snapshot = torch.cuda.memory._snapshot()  # on this thread: the allocator's state now
            torch.cuda.memory._record_memory_history(enabled=None)
            files.append((MEMORY_DIR, SNAPSHOT_SUFFIX, functools.partial(_pickled, snapshot)))
        return files


def _pickled(snapshot: Any) -> bytes:
    """An allocator snapshot as `_dump_snapshot` writes it (a pickle), gzip-compressed (on
    the publisher's thread); stepscope.traces.snapshot reads it."""
    return gzip.compress(pickle.dumps(snapshot), compresslevel=3)


def _export(profile: Any, backend: str, rank: int, world_size: int) -> bytes:
    """The window's trace as gzip Kineto JSON (on the publisher's thread)."""
    with tempfile.TemporaryDirectory(prefix="stepscope-kineto-") as folder:
        path = os.path.join(folder, "trace.json")
        profile.export_chrome_trace(path)
        with open(path, "rb") as handle:
            trace = handle.read()
    trace = add_distributed_info(trace, backend, rank, world_size)
    return gzip.compress(trace, compresslevel=3)


class DataLoaderTimingBackend:
    """Times every `next()` on a DataLoader iterator inside the window and records it on
    the step timeline as a "dataloader" span (patched on the iterator classes for the
    window only)."""

    def __init__(self, record: Callable[[str, int, int], None]):
        self.record = record
        self._originals: list[tuple[type, Any]] = []

    def start(self, step: int, warmup_steps: int = 0) -> None:
        from torch.utils.data import dataloader

        for cls in (dataloader._SingleProcessDataLoaderIter, dataloader._MultiProcessingDataLoaderIter):
            original = cls.__next__
            self._originals.append((cls, original))
            cls.__next__ = self._timed(original)  # type: ignore[method-assign]

    def _timed(self, original: Any) -> Any:
        record = self.record

        @functools.wraps(original)
        def timed_next(iterator: Any) -> Any:
            start = time.time_ns()
            try:
                return original(iterator)
            finally:
                try:
                    record("dataloader", start, time.time_ns())
                except Exception:
                    pass

        return timed_next

    def step_start(self, step: int) -> None:
        pass

    def step_end(self, step: int) -> None:
        pass

    def stop(self) -> list[tuple[str, str, Payload]]:
        for cls, original in reversed(self._originals):
            cls.__next__ = original
        self._originals.clear()
        return []


def create_profiling(
    config: ProfilerConfig,
    store: Store,
    *,
    rank: int = 0,
    world_size: int = 1,
    record_span: Callable[[str, int, int], None] | None = None,
) -> WindowedProfilers | None:
    """The windowed profilers of a PyTorch hook, or None when `config` has no window."""
    return WindowedProfilers.build(
        config,
        store,
        rank=rank,
        trace_backend=lambda: KinetoBackend(config, rank, world_size),
        dataloader_backend=(lambda: DataLoaderTimingBackend(record_span)) if record_span is not None else None,
    )
