"""Detailed profiling windows on the training side: a scheduler that starts and stops a
profiler backend at window boundaries (pure decisions from ProfilerConfig's windows, a
warm-up before each step window) and hands what the backend recorded to a background
publisher (export, compression and the store's write happen off the training thread),
plus the framework-free backends (cProfile). The framework backends (torch.profiler,
tf.profiler) live in the plugins and follow the same small protocol. The window's own time
on the training thread is measured and published under stepscope-cost/profiler-windows/.
Nothing here runs, or costs anything, outside a window."""

from __future__ import annotations

import cProfile
import json
import logging
import os
import pstats
import queue
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from typing import Any, Protocol, Union

from ..config import ProfilingWindow, active_window
from ..layout import COST_WINDOWS_DIR, PYTHON_PROFILE_DIR
from ..layout import detailed_dir as detailed_dir  # the plugins name their traces folder with it
from ..store import Store
from .deadline import Deadline
from .safety import WarnOnce

logger = logging.getLogger("stepscope.profiler")

def output_key(folder: str, rank: int, first_step: int, pid: int, suffix: str) -> str:
    """`<folder>/rank<r>/<first step:012d>_pid<pid><suffix>`: one file per window per rank."""
    return f"{folder}/rank{rank}/{first_step:012d}_pid{pid}{suffix}"


# What a backend hands over at a window's end: the bytes, or a function making them, which
# the publisher calls on its own thread (torch's trace export and gzip run there).
Payload = Union[bytes, Callable[[], bytes]]
PUBLISH_WAIT_S = 300.0  # at close, how long the publisher may still take with a window's files


class ProfilerBackend(Protocol):
    """What a scheduler drives. `start(step, warmup_steps)`: the first `warmup_steps` steps
    are recorded and thrown away (the profiler's start-up lands there). `stop()` returns the
    files to publish: (folder, suffix, bytes or a function making them off the training
    thread)."""

    def start(self, step: int, warmup_steps: int = 0) -> None: ...

    def step_start(self, step: int) -> None: ...

    def step_end(self, step: int) -> None: ...

    def stop(self) -> list[tuple[str, str, Payload]]: ...


class StepMarker:
    """The open step's span in a framework profiler (torch's `record_function`, TF's
    `Trace`): a context entered when the step starts and left when it ends, or at stop."""

    __slots__ = ("_open",)

    def __init__(self) -> None:
        self._open: Any = None

    def enter(self, marker: Any) -> None:
        self._open = marker
        marker.__enter__()

    def exit(self) -> None:
        """Leave the open step's span, if any (no device synchronisation: a kernel belongs
        to the step whose runtime call launched it, so the step may end while it runs)."""
        marker, self._open = self._open, None
        if marker is not None:
            marker.__exit__(None, None, None)


@dataclass
class WindowCost:
    """One window's cost: seconds on the training thread (start, the per-step calls, stop)
    and on the publisher's (export, compression, write), and the bytes published."""

    first_step: int
    warmup_steps: int
    steps: int = 0
    start_s: float = 0.0
    steps_s: float = 0.0
    stop_s: float = 0.0
    publish_s: float = 0.0
    bytes: int = 0

    @property
    def training_thread_s(self) -> float:
        return self.start_s + self.steps_s + self.stop_s


class Publisher:
    """One background thread that makes and writes a window's files (the training thread
    only queues them), then the windows' cost file. A daemon thread, as the hook's other
    close-time work: `close()` waits for it within the hook's close deadline, and what is
    not written by then is lost (said once) rather than holding the process."""

    def __init__(self, store: Store, name: str, rank: int):
        self.store = store
        self.name = name
        self.rank = rank
        self.published: list[str] = []
        self.costs: list[WindowCost] = []
        self._queue: queue.Queue[Any] = queue.Queue()
        self._thread: threading.Thread | None = None
        self._warn = WarnOnce()

    def submit(self, files: list[tuple[str, str]], payloads: list[Payload], cost: WindowCost) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name=f"stepscope-{self.name.replace(' ', '-')}-publish", daemon=True)
            self._thread.start()
        self._queue.put((files, payloads, cost))

    def wait(self, timeout: float = PUBLISH_WAIT_S) -> bool:
        """Block until everything queued is published; False when `timeout` ran out."""
        thread, self._thread = self._thread, None
        if thread is None:
            return True
        self._queue.put(None)
        thread.join(timeout)
        if thread.is_alive():
            self._warn("deadline", f"stepscope {self.name}: a window's trace was not published before the close deadline ({timeout:.0f} s); it is lost if the process ends first")
            return False
        return True

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            files, payloads, cost = item
            started = time.perf_counter()
            for key, payload in zip((k for k, _ in files), payloads):
                try:
                    data = payload() if callable(payload) else payload
                    self.store.write(key, data)
                    cost.bytes += len(data)
                    self.published.append(key)
                except Exception as exc:  # a failed export or write loses the window, never training
                    self._warn(key, f"stepscope {self.name}: could not publish {key} ({exc!r})")
                    logger.debug("stepscope %s publish failure", self.name, exc_info=exc)
            cost.publish_s = time.perf_counter() - started
            self.costs.append(cost)
            self._write_costs()

    def _write_costs(self) -> None:
        key = f"{COST_WINDOWS_DIR}/{self.name.replace(' ', '-')}_rank{self.rank}_pid{os.getpid()}.json"
        rows = [{**asdict(c), "training_thread_s": c.training_thread_s} for c in self.costs]
        try:
            self.store.write(key, json.dumps({"profiler": self.name, "rank": self.rank, "windows": rows}, indent=1).encode())
        except Exception as exc:
            logger.debug("stepscope %s: cost file not written (%r)", self.name, exc)


def warmed_windows(windows: tuple[ProfilingWindow, ...], warmup_steps: int) -> tuple[tuple[ProfilingWindow, ...], tuple[int, ...]]:
    """The windows as the scheduler runs them: each step window starts `warmup_steps` steps
    earlier (fewer when it starts before step `warmup_steps`), and how many warm-up steps
    each has. A time window's warm-up is its first steps (its start cannot be anticipated)."""
    out, warmups = [], []
    for window in windows:
        if window.by_step and window.start_step is not None and window.num_steps is not None:
            early = min(warmup_steps, window.start_step)
            out.append(replace(window, start_step=window.start_step - early, num_steps=window.num_steps + early))
            warmups.append(early)
        else:
            out.append(window)
            warmups.append(warmup_steps)
    return tuple(out), tuple(warmups)


class WindowScheduler:
    """Starts `backend` when a step begins inside one of `windows` (`warmup_steps` earlier
    for step windows), stops it when the window is over (after the last step of a step
    window; at the first step start past a time window; at close) and hands its files to the
    background publisher. Each window runs once. Never raises: a failing backend is
    reported once and the scheduler turns itself off."""

    def __init__(
        self,
        windows: tuple[ProfilingWindow, ...],
        backend: ProfilerBackend,
        store: Store,
        *,
        rank: int = 0,
        clock: Callable[[], float] = time.time,
        name: str = "profiler",
        warmup_steps: int = 0,
    ):
        self.windows, self._warmups = warmed_windows(windows, warmup_steps)
        self.backend = backend
        self.store = store
        self.rank = rank
        self.clock = clock
        self.name = name
        self.publisher = Publisher(store, name, rank)
        self._cost: WindowCost | None = None
        self._done: set[int] = set()
        self._running: int | None = None
        self._first_step = 0
        self._enabled = bool(windows)
        self._warn = WarnOnce()

    @property
    def running(self) -> bool:
        return self._running is not None

    @property
    def published(self) -> list[str]:
        """Keys published so far (the publisher's; complete after close())."""
        return self.publisher.published

    @property
    def costs(self) -> list[WindowCost]:
        return self.publisher.costs

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
                    started = time.perf_counter()
                    self.publisher.wait()  # the previous window's export first: one at a time
                    self.backend.start(step, self._warmups[index])
                    self._running, self._first_step = index, step
                    self._cost = WindowCost(step, self._warmups[index], start_s=time.perf_counter() - started)
            if self._running is not None:
                started = time.perf_counter()
                self.backend.step_start(step)
                if self._cost is not None:
                    self._cost.steps += 1
                    self._cost.steps_s += time.perf_counter() - started
        except Exception as exc:
            self._fail(exc)

    def step_ended(self, step: int) -> None:
        if self._running is None:
            return
        try:
            started = time.perf_counter()
            self.backend.step_end(step)
            if self._cost is not None:
                self._cost.steps_s += time.perf_counter() - started
            window = self.windows[self._running]
            if window.by_step and window.is_over(step + 1, self.clock()):
                self._stop()
        except Exception as exc:
            self._fail(exc)

    def flush(self, timeout: float | None = None) -> None:
        """Wait for the publisher to write the files of the windows that have ended (a
        window still open goes on); within `timeout` seconds (default PUBLISH_WAIT_S)."""
        self.publisher.wait(PUBLISH_WAIT_S if timeout is None else timeout)

    def close(self, deadline: Deadline | None = None) -> None:
        """Stop a window still open and wait for the publisher (within `deadline`: the hook's
        close deadline; the backend itself stops on this thread, as the framework needs)."""
        if self._running is not None:
            try:
                self._stop()
            except Exception as exc:
                self._fail(exc)
        self._enabled = False
        self.publisher.wait(deadline.left() if deadline is not None else PUBLISH_WAIT_S)

    def _stop(self) -> None:
        index, self._running = self._running, None
        if index is not None:
            self._done.add(index)
        started = time.perf_counter()
        files = self.backend.stop()
        cost, self._cost = self._cost or WindowCost(self._first_step, 0), None
        # The published file is named after the window's first recorded step.
        first = self._first_step + cost.warmup_steps
        keys = [(output_key(folder, self.rank, first, os.getpid(), suffix), suffix) for folder, suffix, _ in files]
        cost.stop_s = time.perf_counter() - started
        self.publisher.submit(keys, [payload for _, _, payload in files], cost)

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

    def start(self, step: int, warmup_steps: int = 0) -> None:
        self._profile = cProfile.Profile()
        self._profile.enable()

    def step_start(self, step: int) -> None:
        pass

    def step_end(self, step: int) -> None:
        pass

    def stop(self) -> list[tuple[str, str, Payload]]:
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
            schedulers.append(WindowScheduler(config.detailed_windows, trace_backend(), store, rank=rank, name="detailed profiler", warmup_steps=config.warmup_steps))
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

    def flush(self, timeout: float | None = None) -> None:
        """The files of every window that has ended, written (a hook's flush: what a stage
        recorded is readable when it returns)."""
        for scheduler in self.schedulers:
            scheduler.flush(timeout)

    def close(self, deadline: Deadline | None = None) -> None:
        for scheduler in reversed(self.schedulers):
            scheduler.close(deadline)

    @property
    def published(self) -> list[str]:
        return [key for scheduler in self.schedulers for key in scheduler.published]
