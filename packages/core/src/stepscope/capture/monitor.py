"""The system monitor: host and GPU metrics sampled on a fixed schedule, written as
SageMaker-layout JSON lines, one file per node per minute.

It samples on a daemon thread, either in the training process or (`process=True`, what
the hooks use) in a small sampler process of its own, as SageMaker's agent did: there the
training thread's hold on the GIL cannot delay a sample (see bench/bench_monitor.py).

Layout (docs/profiler.md lists every dimension):
`profiler-output/system/incremental/<YYYYMMDDHH>/<epoch s of the minute>.<node>.json`."""

from __future__ import annotations

import collections
import json
import logging
import math
import os
import queue
import re
import socket
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import psutil

from ..exceptions import ConfigError, StoreUnavailable
from ..layout import SYSTEM_METRICS_DIR
from ..store import Store, open_store
from .nvml import NvmlSampler
from .safety import WarnOnce

logger = logging.getLogger("stepscope.profiler")

VALID_INTERVALS_MS = (100, 200, 500, 1000, 5000, 60000)
ROTATION_S = 60  # one file per node per minute, as SageMaker wrote them

# Counting child processes walks every process of the host, so it runs this often at most.
_CHILD_COUNT_PERIOD_S = 30.0
_MAX_JITTER_SAMPLES = 100_000

_SYSTEM_KEY_RE = re.compile(r"^(\d+)\.(.+)\.json$")


# --- keys -------------------------------------------------------------------------------


def system_metrics_key(minute_start: int, node_id: str) -> str:
    """The key of one node's file for the minute starting at `minute_start` (epoch seconds)."""
    hour = time.strftime("%Y%m%d%H", time.gmtime(minute_start))
    return f"{SYSTEM_METRICS_DIR}/{hour}/{minute_start}.{node_id}.json"


def parse_system_metrics_key(key: str) -> tuple[int, str] | None:
    """(minute start, node) of a system-metrics key, with or without the hour folder
    (older SageMaker jobs had none); None for anything else."""
    match = _SYSTEM_KEY_RE.match(key.rsplit("/", 1)[-1])
    if not match:
        return None
    return int(match.group(1)), match.group(2)


def default_node_id(rank: int | None = None) -> str:
    """SageMaker's host name where there is one (SM_CURRENT_HOST, e.g. "algo-1"), else the
    host name; with `rank`, a suffix so that several monitors on one host (every_rank) do not
    write the same files."""
    node = os.environ.get("SM_CURRENT_HOST") or socket.gethostname() or "localhost"
    node = re.sub(r"[^A-Za-z0-9._-]", "-", node.split(".")[0] if "." in node else node)
    return f"{node}-rank{rank}" if rank is not None else node


# --- configuration ----------------------------------------------------------------------


@dataclass(frozen=True)
class MonitorConfig:
    interval_ms: int = 500
    node_id: str = field(default_factory=default_node_id)

    def __post_init__(self) -> None:
        interval = self.interval_ms
        if isinstance(interval, str) and interval.strip().isdigit():
            interval = int(interval.strip())
        if isinstance(interval, bool) or interval not in VALID_INTERVALS_MS:
            allowed = ", ".join(str(v) for v in VALID_INTERVALS_MS)
            raise ConfigError(f"interval_ms: {self.interval_ms!r} is not one of {allowed}")
        object.__setattr__(self, "interval_ms", int(interval))
        if not isinstance(self.node_id, str) or not re.fullmatch(r"[A-Za-z0-9._-]+", self.node_id):
            raise ConfigError(f"node_id: {self.node_id!r} must be non-empty letters, digits, '.', '_' or '-'")


@dataclass
class MonitorStats:
    """What the monitor cost and how well it kept its schedule (read by bench/)."""

    samples: int = 0
    missed_ticks: int = 0
    sampling_cpu_s: float = 0.0
    publishing_cpu_s: float = 0.0
    files_published: int = 0
    publish_errors: int = 0
    jitter_s: collections.deque = field(default_factory=lambda: collections.deque(maxlen=_MAX_JITTER_SAMPLES))

    def jitter_ms(self, percentile: float) -> float:
        """The given percentile (0-100) of |actual - scheduled| sample time, in ms."""
        if not self.jitter_s:
            return math.nan
        ordered = sorted(self.jitter_s)
        rank = min(len(ordered) - 1, max(0, math.ceil(percentile / 100 * len(ordered)) - 1))
        return ordered[rank] * 1000.0


# --- sampling ---------------------------------------------------------------------------

Metric = tuple[str, str, str, float]  # (Type, Name, Dimension, Value)


_FIRST_READING_S = 0.025  # the least time between priming and a reading that has CPU rates


class _HostSampler:
    """psutil readings turned into rates and percentages between consecutive samples."""

    def __init__(self, interval_s: float, warn: Callable[[str, str], None], pid: int | None = None):
        self._warn = warn
        self._process = psutil.Process(pid or os.getpid())
        self._children_every = max(1, round(_CHILD_COUNT_PERIOD_S / interval_s))
        self._tick = 0
        self._disabled: set[str] = set()
        self._last_time = 0.0
        self._last_cpu: list[Any] | None = None
        self._last_proc_cpu = 0.0
        self._cpu_bound = 100.0 * (psutil.cpu_count() or 1)  # a process's CPU % is at most 100 a core
        self._last_disk: tuple[int, int] | None = None
        self._last_net: tuple[int, int] | None = None

    def prime(self) -> None:
        """Take the first counter readings, so that the first sample already has rates."""
        self._last_time = time.monotonic()
        self._guard("cpu", lambda: self._cpu(prime=True))
        self._guard("process", lambda: self._process_metrics(0.0, prime=True))
        self._guard("disk", lambda: self._disk(0.0, prime=True))
        self._guard("network", lambda: self._network(0.0, prime=True))

    def sample(self) -> list[Metric]:
        now = time.monotonic()
        elapsed = max(now - self._last_time, 1e-6)
        self._last_time = now
        self._tick += 1
        out: list[Metric] = []
        for source, read in (
            ("cpu", lambda: self._cpu()),
            ("memory", self._memory),
            ("process", lambda: self._process_metrics(elapsed)),
            ("disk", lambda: self._disk(elapsed)),
            ("network", lambda: self._network(elapsed)),
        ):
            out.extend(self._guard(source, read))
        return out

    def _guard(self, source: str, read: Callable[[], list[Metric] | None]) -> list[Metric]:
        # One failing source (no /proc/diskstats in a container, say) is turned off alone.
        if source in self._disabled:
            return []
        try:
            return read() or []
        except Exception as exc:
            self._disabled.add(source)
            self._warn(f"source:{source}", f"system monitor: {source} metrics unavailable ({exc!r}); no longer sampled")
            return []

    def _cpu(self, prime: bool = False) -> list[Metric]:
        # One read of /proc/stat gives utilisation and IO wait for every core and the total.
        times = psutil.cpu_times(percpu=True)
        last, self._last_cpu = self._last_cpu, times
        if prime or last is None or len(last) != len(times):  # first reading, or CPU hotplug
            return []
        out: list[Metric] = []
        sum_total = sum_busy = sum_iowait = 0.0
        for index, (before, after) in enumerate(zip(last, times)):
            total, busy, iowait = _cpu_delta(before, after)
            sum_total += total
            sum_busy += busy
            sum_iowait += iowait
            if total > 0:
                out.append(("cpu", f"cpu{index}", "CPUUtilization", _percent(busy, total)))
                out.append(("cpu", f"cpu{index}", "I/OWaitPercentage", _percent(iowait, total)))
        if sum_total > 0:
            out.append(("cpu", "total", "CPUUtilization", _percent(sum_busy, sum_total)))
            out.append(("cpu", "total", "I/OWaitPercentage", _percent(sum_iowait, sum_total)))
        return out

    def _memory(self) -> list[Metric]:
        memory = psutil.virtual_memory()
        return [
            ("memory", "system", "MemoryUsedPercent", float(memory.percent)),
            ("memory", "system", "MemoryUsedBytes", float(memory.used)),
            ("memory", "system", "MemoryTotalBytes", float(memory.total)),
        ]

    def _process_metrics(self, elapsed: float, prime: bool = False) -> list[Metric]:
        with self._process.oneshot():
            cpu = self._process.cpu_times()
            rss = self._process.memory_info().rss
        cpu_s = cpu.user + cpu.system
        last, self._last_proc_cpu = self._last_proc_cpu, cpu_s
        if prime:
            return []
        # The kernel counts a process's CPU in 10 ms ticks, so over a short interval one tick
        # more or less is a large error; a share above what the cores allow is such an error.
        share = min(self._cpu_bound, max(0.0, 100.0 * (cpu_s - last) / elapsed))
        out: list[Metric] = [
            ("process", "main", "ProcessCPUUtilization", share),
            ("process", "main", "ProcessMemoryRSSBytes", float(rss)),
        ]
        if self._tick % self._children_every == 1 or self._children_every == 1:
            # The training process's children (its data loader's workers), not this sampler:
            # sampling in a process of its own, it is one of them.
            me = os.getpid()
            children = sum(1 for child in self._process.children(recursive=True) if child.pid != me)
            out.append(("process", "main", "ChildProcessCount", float(children)))
        return out

    def _disk(self, elapsed: float, prime: bool = False) -> list[Metric]:
        counters = psutil.disk_io_counters(perdisk=False)
        if counters is None:  # no block devices visible (some containers)
            raise OSError("no disk counters on this host")
        return self._rates("_last_disk", "disk", ("DiskReadBytesPerSecond", "DiskWriteBytesPerSecond"), (counters.read_bytes, counters.write_bytes), elapsed, prime)

    def _network(self, elapsed: float, prime: bool = False) -> list[Metric]:
        received = sent = 0
        for nic, counters in psutil.net_io_counters(pernic=True).items():
            if nic == "lo" or nic.startswith("lo"):  # loopback is not network traffic
                continue
            received += counters.bytes_recv
            sent += counters.bytes_sent
        return self._rates("_last_net", "network", ("NetworkReceiveBytesPerSecond", "NetworkTransmitBytesPerSecond"), (received, sent), elapsed, prime)

    def _rates(self, last_attribute: str, kind: str, names: tuple[str, ...], now: tuple[int, ...], elapsed: float, prime: bool) -> list[Metric]:
        """Per-second rates of counters `now` since the reading kept in `last_attribute`
        (kept now in its place); none at the priming reading or the first."""
        last = getattr(self, last_attribute)
        setattr(self, last_attribute, now)
        if prime or last is None:
            return []
        return [(kind, "total", name, _rate(current, previous, elapsed)) for name, current, previous in zip(names, now, last)]


def _cpu_delta(before: Any, after: Any) -> tuple[float, float, float]:
    """(total, busy, iowait) seconds between two per-core readings. Guest time is already
    counted in user time on Linux, so it is left out of the total; idle and IO wait are
    not busy (as psutil.cpu_percent counts them)."""
    def total(t: Any) -> float:
        return sum(t) - getattr(t, "guest", 0.0) - getattr(t, "guest_nice", 0.0)

    d_total = total(after) - total(before)
    d_idle = after.idle - before.idle
    d_iowait = getattr(after, "iowait", 0.0) - getattr(before, "iowait", 0.0)
    if d_total <= 0:
        return 0.0, 0.0, 0.0
    return d_total, max(0.0, d_total - d_idle - d_iowait), max(0.0, d_iowait)


def _percent(part: float, whole: float) -> float:
    return min(100.0, max(0.0, 100.0 * part / whole))


def _rate(now: int, last: int, elapsed: float) -> float:
    # Counters reset when a NIC or disk goes away; a negative delta is no traffic, not a
    # huge negative rate.
    return max(0.0, (now - last) / elapsed)


# --- serialisation and rotation --------------------------------------------------------


class _LineFormatter:
    """Builds the JSON lines by hand from cached prefixes: a sample is a few dozen lines
    every interval, and json.dumps per line would be most of the monitor's cost."""

    def __init__(self, node_id: str):
        self._node = json.dumps(node_id)
        self._prefixes: dict[tuple[str, str, str], str] = {}

    def format(self, timestamp: float, metrics: Iterable[Metric]) -> str:
        suffix = f', "NodeId": {self._node}, "Timestamp": {timestamp:.6f}}}\n'
        parts = []
        for type_, name, dimension, value in metrics:
            if not math.isfinite(value):  # NaN/inf are not JSON
                continue
            prefix = self._prefixes.get((type_, name, dimension))
            if prefix is None:
                prefix = (
                    f'{{"Type": {json.dumps(type_)}, "Name": {json.dumps(name)}, '
                    f'"Dimension": {json.dumps(dimension)}, "Value": '
                )
                self._prefixes[(type_, name, dimension)] = prefix
            parts.append(prefix + _format_value(value) + suffix)
        return "".join(parts)


def _format_value(value: float) -> str:
    if value == int(value) and abs(value) < 1e15:
        return str(int(value))
    return repr(round(value, 4))


class _MinuteBuffer:
    """Serialised lines grouped by the minute they belong to; a minute is complete (and its
    file can be published) as soon as a sample of a later minute arrives."""

    def __init__(self) -> None:
        self._minute: int | None = None
        self._chunks: list[str] = []

    def add(self, timestamp: float, chunk: str) -> tuple[int, bytes] | None:
        minute = int(timestamp // ROTATION_S) * ROTATION_S
        done = None
        if self._minute is not None and minute != self._minute:
            done = self.drain()
        self._minute = minute
        if chunk:
            self._chunks.append(chunk)
        return done

    def drain(self) -> tuple[int, bytes] | None:
        minute, chunks = self._minute, self._chunks
        self._minute, self._chunks = None, []
        if minute is None or not chunks:
            return None
        return minute, "".join(chunks).encode()


class _Publisher:
    """Writes finished files on its own thread, so a slow store (an S3 PUT) never delays a
    sample. A store that is not answering (StoreUnavailable) is waited out with capped
    back-off, the minute files held meanwhile (one per minute: small); stop() waits for
    them only within its bound."""

    RETRY_FIRST_S = 0.25
    RETRY_MAX_S = 4.0

    def __init__(self, store: Store, stats: MonitorStats, warn: Callable[[str, str], None]):
        self._store, self._stats, self._warn = store, stats, warn
        self._closing = threading.Event()
        self._queue: queue.Queue[tuple[str, bytes] | None] = queue.Queue()
        self._thread = threading.Thread(target=self._run, name="stepscope-monitor-publish", daemon=True)
        self._thread.start()

    def submit(self, key: str, data: bytes) -> None:
        self._queue.put((key, data))

    def wait(self, timeout_s: float) -> None:
        """Until every file submitted so far is written (or `timeout_s` passed)."""
        deadline = time.monotonic() + timeout_s
        while self._queue.unfinished_tasks and time.monotonic() < deadline:
            time.sleep(0.005)

    def close(self, timeout_s: float) -> None:
        self._queue.put(None)
        self._thread.join(timeout_s)
        self._closing.set()  # a retry still waiting gives up: the monitor has stopped

    def _run(self) -> None:
        start = time.thread_time()
        while True:
            item = self._queue.get()
            if item is None:
                self._queue.task_done()
                break
            self._publish(*item)
            self._queue.task_done()
            self._stats.publishing_cpu_s = time.thread_time() - start

    def _publish(self, key: str, data: bytes) -> None:
        delay = self.RETRY_FIRST_S
        while True:
            try:
                self._publish_once(key, data)
                return
            except StoreUnavailable as exc:
                if self._closing.is_set():
                    self._lost(key, exc)
                    return
                self._warn("unavailable", f"system monitor: the store is not answering ({exc}); samples are kept and sent when it answers")
                self._closing.wait(delay)
                delay = min(2 * delay, self.RETRY_MAX_S)
            except Exception as exc:
                self._lost(key, exc)
                return

    def _publish_once(self, key: str, data: bytes) -> None:
        # A monitor stopped and started again within one minute finds its own earlier
        # file: keep both parts rather than overwrite the first.
        if self._store.exists(key):
            previous = self._store.read(key)
            data = previous + (b"" if previous.endswith(b"\n") or not previous else b"\n") + data
        self._store.write(key, data)
        self._stats.files_published += 1

    def _lost(self, key: str, exc: Exception) -> None:
        self._stats.publish_errors += 1
        self._warn("publish", f"system monitor: could not publish {self._store.describe(key)} ({exc!r}); those samples are lost")


# --- the monitor ------------------------------------------------------------------------


class SystemMonitor:
    """Samples host (psutil) and GPU (NVML) metrics every `interval_ms` on a daemon thread.

    One per node: see `should_run`. `stop()` publishes the open minute's file; neither
    `start()` nor `stop()` ever raises into training (failures are logged once)."""

    VALID_INTERVALS_MS = VALID_INTERVALS_MS

    def __init__(
        self,
        out_dir: str | os.PathLike[str] | Store,
        interval_ms: int = 500,
        node_id: str | None = None,
        *,
        process: bool = False,
        pid: int | None = None,
    ):
        """`process=True` samples in a sampler process of its own (falling back to a thread
        when it cannot start); `pid` is the process whose CPU and memory are reported
        (default: this one)."""
        self.config = MonitorConfig(interval_ms=interval_ms, node_id=node_id or default_node_id())
        self._store = open_store(out_dir if isinstance(out_dir, Store) else os.fspath(out_dir))
        self._pid = pid
        self._sampler_process: Any = None
        self._wants_process = bool(process)
        self._buffer = _MinuteBuffer()
        self._buffer_lock = threading.Lock()
        self._stats = MonitorStats()
        self._stop_event = threading.Event()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._publisher: _Publisher | None = None
        self._warn_once = WarnOnce()
        self._stopped = False

    @staticmethod
    def should_run(rank: int | None, local_rank: int | None, every_rank: bool = False) -> bool:
        """Whether this process runs the node's monitor: local rank 0 of each host (or a
        process outside any distributed job), or every rank when asked."""
        return every_rank or not local_rank

    @property
    def interval_ms(self) -> int:
        return self.config.interval_ms

    @property
    def node_id(self) -> str:
        return self.config.node_id

    @property
    def running(self) -> bool:
        if self._sampler_process is not None:
            return self._sampler_process.running
        return self._thread is not None and self._thread.is_alive()

    @property
    def in_own_process(self) -> bool:
        """Whether samples are taken in a sampler process (not a thread of this one)."""
        return self._sampler_process is not None

    def stats(self) -> MonitorStats:
        return self._stats

    def start(self) -> None:
        """Start sampling; a second call, or a call after stop(), does nothing."""
        with self._lock:
            if self._thread is not None or self._sampler_process is not None or self._stopped:
                return
            if self._wants_process:
                from .sampler_process import SamplerProcess

                try:
                    self._sampler_process = SamplerProcess.start(self._store, self.config, self._stats)
                    return
                except Exception as exc:  # e.g. no way to start a process here: sample in a thread
                    self._warn_once("process", f"system monitor: sampler process could not start ({exc!r}); sampling in a thread")
            try:
                self._publisher = _Publisher(self._store, self._stats, self._warn_once)
                # The schedule is anchored here, not when the thread is ready: a slow start
                # (importing pynvml) makes the first sample late rather than missing.
                anchor = (time.monotonic(), time.time())
                self._thread = threading.Thread(target=self._run, args=anchor, name="stepscope-system-monitor", daemon=True)
                self._thread.start()
            except Exception as exc:
                self._warn_once("start", f"system monitor could not start ({exc!r}); no system metrics")

    def stop(self, timeout_s: float = 10.0) -> None:
        """Stop sampling and publish the open file. Idempotent; never raises."""
        try:
            with self._lock:
                if self._stopped:
                    return
                self._stopped = True
                self._stop_event.set()
                thread, publisher = self._thread, self._publisher
            if self._sampler_process is not None:
                self._sampler_process.stop(timeout_s)
            if thread is not None:
                thread.join(timeout_s)
            if publisher is not None:
                publisher.close(timeout_s)
        except Exception as exc:  # never into training
            self._warn_once("stop", f"system monitor: error while stopping ({exc!r})")

    def flush(self, timeout_s: float = 10.0) -> None:
        """Publish the samples of the open minute now (later ones of that minute are added
        to the same file), and wait for them to be written. Never raises."""
        try:
            if self._sampler_process is not None:
                self._sampler_process.flush(timeout_s)
                return
            with self._buffer_lock:
                done = self._buffer.drain()
            if done is not None and self._publisher is not None:
                self._submit(*done)
            if self._publisher is not None:
                self._publisher.wait(timeout_s)
        except Exception as exc:  # never into training
            self._warn_once("flush", f"system monitor: error while flushing ({exc!r})")

    def __enter__(self) -> SystemMonitor:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def _run(self, anchor_monotonic: float, anchor_wall: float) -> None:
        cpu_start = time.thread_time()
        interval_s = self.config.interval_ms / 1000.0
        buffer = self._buffer
        formatter = _LineFormatter(self.config.node_id)
        gpu: NvmlSampler | None = None
        try:
            host = _HostSampler(interval_s, self._warn_once, self._pid)
            gpu = NvmlSampler.open()
            host.prime()
            # Ticks sit on wall-clock multiples of the interval, so the nodes of a job sample
            # at the same instants; deadlines are then kept on the monotonic clock, each one
            # computed from the first, so that no drift accumulates.
            first = anchor_monotonic + (interval_s - anchor_wall % interval_s)
            # Jitter is the schedule's in steady state: ticks due before the start-up (imports,
            # NVML, the first readings; a new sampler process on a busy machine) was over are
            # sampled as soon as possible but not counted (they measured the start-up:
            # up to 183 ms in a sampler process started next to a GIL-bound loop).
            ready = time.monotonic()

            def sample() -> None:
                timestamp = time.time()
                metrics = host.sample()
                if gpu is not None:
                    metrics.extend(("gpu", name, dimension, value) for name, dimension, value in gpu.sample())
                with self._buffer_lock:
                    done = buffer.add(timestamp, formatter.format(timestamp, metrics))
                if done is not None:
                    self._submit(*done)
                self._stats.samples += 1

            # A first tick due within a counter tick of the priming would measure rounding
            # (10 ms of CPU over 1 ms reads as 1000 %): it is taken that much later, still
            # within its slot.
            first_reading = ready + _FIRST_READING_S
            tick = 0
            while True:
                deadline = first + tick * interval_s
                if tick == 0:
                    deadline = max(deadline, first_reading)
                if self._stop_event.wait(max(0.0, deadline - time.monotonic())):
                    # A job over before the first tick (shorter than the start-up of a
                    # sampler process on a busy machine) still gets its one reading, taken
                    # once the CPU counters (in 10 ms jiffies) have moved since priming.
                    if self._stats.samples == 0:
                        time.sleep(max(0.0, _FIRST_READING_S - (time.monotonic() - ready)))
                        sample()
                    break
                if tick and deadline - interval_s > ready:  # its previous sample ran after the start-up
                    self._stats.jitter_s.append(abs(time.monotonic() - deadline))
                sample()
                tick += 1
                # A sample that ran past the next deadline (a busy GIL) is followed at once
                # by the next one, still on the grid; after a longer stall (a suspended VM)
                # the missed ticks are skipped rather than sampled in a burst.
                late = time.monotonic() - (first + tick * interval_s)
                if late > interval_s:
                    skipped = int(late // interval_s)
                    tick += skipped
                    self._stats.missed_ticks += skipped
                self._stats.sampling_cpu_s = time.thread_time() - cpu_start
        except Exception as exc:
            self._warn_once("run", f"system monitor failed ({exc!r}); it stops, samples so far are kept")
        finally:
            with self._buffer_lock:
                done = buffer.drain()
            if done is not None:
                self._submit(*done)
            if gpu is not None:
                gpu.close()
            self._stats.sampling_cpu_s = time.thread_time() - cpu_start

    def _submit(self, minute: int, data: bytes) -> None:
        assert self._publisher is not None
        self._publisher.submit(system_metrics_key(minute, self.config.node_id), data)
