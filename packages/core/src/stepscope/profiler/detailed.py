"""Detailed profiling windows on the training side: a scheduler that starts and stops a
profiler backend at window boundaries (pure decisions from ProfilerConfig's windows) and
publishes what the backend recorded into the job, plus the framework-free backends
(cProfile). The framework backends (torch.profiler, tf.profiler) live in the plugins and
follow the same small protocol. Nothing here runs, or costs anything, outside a window."""

from __future__ import annotations

import cProfile
import logging
import os
import pstats
import tempfile
import time
from collections.abc import Callable
from typing import Any, Protocol

from ..config import ProfilingWindow, active_window
from ..deadline import Deadline, run_within
from ..layout import FRAMEWORK_DIR
from ..safety import WarnOnce
from ..store import Store

logger = logging.getLogger("stepscope.profiler")

PYTHON_PROFILE_DIR = f"{FRAMEWORK_DIR}/python"


def detailed_dir(framework: str) -> str:
    return f"{FRAMEWORK_DIR}/{framework}/detailed"


def output_key(folder: str, rank: int, first_step: int, pid: int, suffix: str) -> str:
    """`<folder>/rank<r>/<first step:012d>_pid<pid><suffix>`: one file per window per rank."""
    return f"{folder}/rank{rank}/{first_step:012d}_pid{pid}{suffix}"


class ProfilerBackend(Protocol):
    """What a scheduler drives. `stop()` returns the files to publish: (folder, suffix, bytes)."""

    def start(self, step: int) -> None: ...

    def step_start(self, step: int) -> None: ...

    def step_end(self, step: int) -> None: ...

    def stop(self) -> list[tuple[str, str, bytes]]: ...


class WindowScheduler:
    """Starts `backend` when a step begins inside one of `windows`, stops it and publishes
    its files when the window is over (after the last step of a step window; at the first
    step start past a time window; at close). Each window runs once. Never raises: a
    failing backend is reported once and the scheduler turns itself off."""

    def __init__(
        self,
        windows: tuple[ProfilingWindow, ...],
        backend: ProfilerBackend,
        store: Store,
        *,
        rank: int = 0,
        clock: Callable[[], float] = time.time,
        name: str = "profiler",
    ):
        self.windows = windows
        self.backend = backend
        self.store = store
        self.rank = rank
        self.clock = clock
        self.name = name
        self.published: list[str] = []
        self._done: set[int] = set()
        self._running: int | None = None
        self._first_step = 0
        self._enabled = bool(windows)
        self._warn = WarnOnce()

    @property
    def running(self) -> bool:
        return self._running is not None

    def step_started(self, step: int) -> None:
        if not self._enabled:
            return
        try:
            now = self.clock()
            if self._running is not None and self.windows[self._running].is_over(step, now):
                self._stop()
            if self._running is None:
                index = active_window(self.windows, step, now)
                if index is not None and index not in self._done:
                    self.backend.start(step)
                    self._running, self._first_step = index, step
            if self._running is not None:
                self.backend.step_start(step)
        except Exception as exc:
            self._fail(exc)

    def step_ended(self, step: int) -> None:
        if self._running is None:
            return
        try:
            self.backend.step_end(step)
            window = self.windows[self._running]
            if window.by_step and window.is_over(step + 1, self.clock()):
                self._stop()
        except Exception as exc:
            self._fail(exc)

    def close(self, deadline: Deadline | None = None) -> None:
        """Stop a window still open, publishing its outputs (within `deadline`: the hook's
        close deadline; the backend itself stops on this thread, as the framework needs)."""
        if self._running is not None:
            try:
                self._stop(deadline)
            except Exception as exc:
                self._fail(exc)
        self._enabled = False

    def _stop(self, deadline: Deadline | None = None) -> None:
        index, self._running = self._running, None
        if index is not None:
            self._done.add(index)
        for folder, suffix, data in self.backend.stop():
            key = output_key(folder, self.rank, self._first_step, os.getpid(), suffix)
            if deadline is None:
                self.store.write(key, data)
                self.published.append(key)
            elif not run_within(self._publisher(key, data), deadline, f"{self.name} output"):
                self._warn("deadline", f"stepscope {self.name}: {self.store.describe(key)} was not published before the close deadline; it is lost")

    def _publisher(self, key: str, data: bytes) -> Callable[[], None]:
        def publish() -> None:
            self.store.write(key, data)
            self.published.append(key)

        return publish

    def _fail(self, exc: Exception) -> None:
        self._enabled = False
        self._running = None
        self._warn("fail", f"stepscope {self.name}: turned off after an error ({exc!r}); training goes on")
        logger.debug("stepscope %s failure", self.name, exc_info=exc)


class PythonProfileBackend:
    """cProfile over the window; publishes pstats' binary format (`.prof`, readable with
    `pstats.Stats`, snakeviz, or `stepscope.profiler.detailed.python_stats`)."""

    def __init__(self) -> None:
        self._profile: cProfile.Profile | None = None

    def start(self, step: int) -> None:
        self._profile = cProfile.Profile()
        self._profile.enable()

    def step_start(self, step: int) -> None:
        pass

    def step_end(self, step: int) -> None:
        pass

    def stop(self) -> list[tuple[str, str, bytes]]:
        profile, self._profile = self._profile, None
        if profile is None:
            return []
        profile.disable()
        with tempfile.TemporaryDirectory(prefix="stepscope-pstats-") as folder:
            path = os.path.join(folder, "profile.prof")
            profile.dump_stats(path)
            with open(path, "rb") as handle:
                return [(PYTHON_PROFILE_DIR, ".prof", handle.read())]


def python_stats(data: bytes, top: int = 30) -> list[dict[str, Any]]:
    """The `top` functions of a published `.prof` file by cumulative time."""
    with tempfile.TemporaryDirectory(prefix="stepscope-pstats-") as folder:
        path = os.path.join(folder, "profile.prof")
        with open(path, "wb") as handle:
            handle.write(data)
        stats = pstats.Stats(path)
    rows: list[dict[str, Any]] = []
    for (filename, line, function), (calls, primitive, total, cumulative, _callers) in stats.stats.items():  # type: ignore[attr-defined]
        rows.append({"function": function, "file": filename, "line": line, "calls": calls, "primitive_calls": primitive, "self_s": total, "cumulative_s": cumulative})
    rows.sort(key=lambda r: -float(r["cumulative_s"]))
    return rows[:top]


def add_distributed_info(trace: bytes, backend: str, rank: int, world_size: int) -> bytes:
    """Kineto writes `distributedInfo` only under torch.distributed; HTA needs it (and finds
    the rank with the regex `"rank":\\s+(\\d+)`, hence the space after the colon)."""
    head = trace[:65536]
    if b'"distributedInfo"' in head:
        return trace
    brace = trace.find(b"{")
    if brace < 0:
        return trace
    info = f'\n  "distributedInfo": {{"backend": "{backend}", "rank": {int(rank)}, "world_size": {int(world_size)}}},'.encode()
    return trace[: brace + 1] + info + trace[brace + 1 :]


class WindowedProfilers:
    """The windowed profilers of one hook (detailed trace, cProfile, data-loader timing),
    driven together from its step start and end. Built by the plugins with their backends."""

    def __init__(self, schedulers: list[WindowScheduler]):
        self.schedulers = schedulers

    @classmethod
    def build(
        cls,
        config: Any,
        store: Store,
        *,
        rank: int,
        trace_backend: Callable[[], ProfilerBackend] | None,
        dataloader_backend: Callable[[], ProfilerBackend] | None = None,
    ) -> WindowedProfilers | None:
        """None when `config` (a ProfilerConfig) has no window: nothing then runs at all."""
        if not config.detailed:
            return None
        schedulers = []
        if config.detailed_windows and trace_backend is not None:
            schedulers.append(WindowScheduler(config.detailed_windows, trace_backend(), store, rank=rank, name="detailed profiler"))
        if config.python_window is not None:
            schedulers.append(WindowScheduler((config.python_window,), PythonProfileBackend(), store, rank=rank, name="cProfile"))
        if config.dataloader_window is not None and dataloader_backend is not None:
            schedulers.append(WindowScheduler((config.dataloader_window,), dataloader_backend(), store, rank=rank, name="data-loader timing"))
        return cls(schedulers)

    def step_started(self, step: int) -> None:
        for scheduler in self.schedulers:
            scheduler.step_started(step)

    def step_ended(self, step: int) -> None:
        for scheduler in reversed(self.schedulers):
            scheduler.step_ended(step)

    def close(self, deadline: Deadline | None = None) -> None:
        for scheduler in reversed(self.schedulers):
            scheduler.close(deadline)

    @property
    def published(self) -> list[str]:
        return [key for scheduler in self.schedulers for key in scheduler.published]
