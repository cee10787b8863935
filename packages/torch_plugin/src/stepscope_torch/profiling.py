"""Detailed profiling for PyTorch: inside the windows of ProfilerConfig, torch.profiler
(Kineto: CPU ops with shapes, CUDA runtime calls, kernels, memcpy/memset, syncs, memory
events) writes one gzip Kineto trace per window per rank under
`profiler-output/framework/pytorch/detailed/`, with the `distributedInfo` HTA expects;
cProfile and data-loader timing run in their own windows. `create_profiling` returns
None when no window is configured, so a hook without windows pays nothing."""

from __future__ import annotations

import functools
import gzip
import os
import tempfile
import time
from collections.abc import Callable
from typing import Any

import torch

from stepscope import annotation
from stepscope.config import ProfilerConfig
from stepscope.profiler.detailed import WindowedProfilers, add_distributed_info, detailed_dir
from stepscope.store import Store

TRACE_SUFFIX = ".pt.trace.json.gz"


def _record_function(name: str) -> Any:
    return torch.autograd.profiler.record_function(name)


class KinetoBackend:
    """torch.profiler over one window; each step is marked `ProfilerStep#<global step>`
    (what torch.profiler's own schedule writes, with our step numbers)."""

    def __init__(self, config: ProfilerConfig, rank: int, world_size: int):
        self.config = config
        self.rank = rank
        self.world_size = world_size
        self._profile: Any = None
        self._step_marker: Any = None

    def start(self, step: int) -> None:
        activities = [torch.profiler.ProfilerActivity.CPU]
        if torch.cuda.is_available():
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        self._profile = torch.profiler.profile(
            activities=activities,
            record_shapes=self.config.record_shapes,
            profile_memory=self.config.profile_memory,
            with_stack=self.config.with_stack,
        )
        self._profile.__enter__()
        annotation.set_backend(_record_function, True)

    def step_start(self, step: int) -> None:
        self._step_marker = _record_function(f"ProfilerStep#{step}")
        self._step_marker.__enter__()

    def step_end(self, step: int) -> None:
        marker, self._step_marker = self._step_marker, None
        if marker is not None:
            if torch.cuda.is_available():
                torch.cuda.synchronize()  # the step's kernels belong inside its window
            marker.__exit__(None, None, None)

    def stop(self) -> list[tuple[str, str, bytes]]:
        annotation.set_backend(_record_function, False)
        if self._step_marker is not None:
            self.step_end(-1)
        profile, self._profile = self._profile, None
        if profile is None:
            return []
        profile.__exit__(None, None, None)
        with tempfile.TemporaryDirectory(prefix="stepscope-kineto-") as folder:
            path = os.path.join(folder, "trace.json")
            profile.export_chrome_trace(path)
            with open(path, "rb") as handle:
                trace = handle.read()
        backend = torch.distributed.get_backend() if torch.distributed.is_available() and torch.distributed.is_initialized() else "nccl" if torch.cuda.is_available() else "gloo"
        trace = add_distributed_info(trace, backend, self.rank, self.world_size)
        return [(detailed_dir("pytorch"), TRACE_SUFFIX, gzip.compress(trace, compresslevel=3))]


class DataLoaderTimingBackend:
    """Times every `next()` on a DataLoader iterator inside the window and records it on
    the step timeline as a "dataloader" span (patched on the iterator classes for the
    window only)."""

    def __init__(self, record: Callable[[str, int, int], None]):
        self.record = record
        self._originals: list[tuple[type, Any]] = []

    def start(self, step: int) -> None:
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

    def stop(self) -> list[tuple[str, str, bytes]]:
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
