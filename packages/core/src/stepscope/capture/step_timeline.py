"""The step timeline's writer: the plugins' step and phase intervals, published as
Chrome-trace JSON files (one schema, documented in docs/profiler.md) from a thread of
its own. The parser, which also reads SageMaker's legacy `pythontimeline` files, is the
analysis side's (stepscope.profiler.timeline).

Each flush publishes a new immutable file:
`profiler-output/framework/steps/<YYYYMMDDHH>/<flush µs:016d>_<node>_rank<r>_pid<p>_<seq:06d>.steps.json`
(UTC hour of the flush), so keys sort by time and a reader follows a job by listing what is new.

Four things are called "timeline": the hook's phase records (capture/phases.py); the step
timeline files, written by capture/step_timeline.py, parsed by profiler/timeline.py and read
for a job by profiler/step_reader.py; the merged Perfetto trace of `stepscope timeline`
(export/perfetto.py); and the app's timeline view (ui/timeline.py). This module is the step timeline's writer."""

from __future__ import annotations

import json
import logging
import operator
import os
import re
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from ..closing import ClosedOnExit
from ..compiled import load_extension
from ..exceptions import ConfigError, StoreUnavailable
from ..layout import STEP_TIMELINE_DIR
from ..modes import ModeKeys
from ..store import Store, open_store
from .monitor import default_node_id
from .safety import WarnOnce

logger = logging.getLogger("stepscope.profiler")

SCHEMA = "stepscope.step_timeline"
SCHEMA_VERSION = 1

# Any plugin may write a timeline: its framework name is a lowercase identifier.
_FRAMEWORK_RE = re.compile(r"[a-z][a-z0-9_.-]{0,63}")

# Bounds memory when the store is unreachable for a long time; beyond it events are dropped.
_MAX_BUFFERED_EVENTS = 1_000_000
_PULL_INTERVAL_S = 1.0  # how often the flush thread pulls from sources between flushes
_OVERFLOW_TID = 100  # lanes for events that overlap without nesting: 100 * mode + k

# The name of a file `timeline_key` makes (the reader recognises our files by it).
TIMELINE_KEY_RE = re.compile(r"^(\d{16})_(.+)_rank(-?\d+)_pid(\d+)_(\d+)\.steps\.json$")


def timeline_key(flush_ns: int, node_id: str, rank: int, pid: int, sequence: int) -> str:
    hour = time.strftime("%Y%m%d%H", time.gmtime(flush_ns / 1e9))
    return f"{STEP_TIMELINE_DIR}/{hour}/{flush_ns // 1000:016d}_{node_id}_rank{rank}_pid{pid}_{sequence:06d}.steps.json"


# --- writing ----------------------------------------------------------------------------

# (name, start_ns, end_ns, step, mode, phase, args): a plain tuple keeps add() cheap. The
# hook's spans carry the mode as its number: a tuple of strings and ints only is untracked
# by the garbage collector, so the events held between flushes (five a step, for 10 s) do
# not count towards its full collections (a pass over every object of the training
# process, with the GIL held).
_Buffered = tuple[str, int, int, int, Any, str, "dict[str, Any] | None"]
_MODE_NUMBERS = {int(mode): mode for mode in ModeKeys}


@dataclass(frozen=True)
class TimelineConfig:
    node_id: str
    rank: int = 0
    framework: str = "pytorch"
    flush_interval_s: float = 10.0

    def __post_init__(self) -> None:
        if not isinstance(self.node_id, str) or not re.fullmatch(r"[A-Za-z0-9._-]+", self.node_id):
            raise ConfigError(f"node_id: {self.node_id!r} must be non-empty letters, digits, '.', '_' or '-'")
        if isinstance(self.rank, bool) or not isinstance(self.rank, int) or self.rank < 0:
            raise ConfigError(f"rank: {self.rank!r} must be an integer >= 0")
        if not isinstance(self.framework, str) or not _FRAMEWORK_RE.fullmatch(self.framework):
            raise ConfigError(f"framework: {self.framework!r} must be a lowercase name such as 'pytorch', 'tensorflow', 'jax'")
        if not isinstance(self.flush_interval_s, (int, float)) or not self.flush_interval_s > 0:
            raise ConfigError(f"flush_interval_s: {self.flush_interval_s!r} must be a number > 0")


class TimelineWriter(ClosedOnExit):
    """Collects step/phase intervals (`add` is a locked list append, no I/O) and publishes
    them as a new Chrome-trace file at every flush: from a background timer every
    `flush_interval_s`, on `flush()`, and at `close()`. Never raises into training."""

    def __init__(
        self,
        out_dir: str | os.PathLike[str] | Store,
        node_id: str | None = None,
        rank: int = 0,
        framework: str = "pytorch",
        flush_interval_s: float = 10.0,
    ):
        self.config = TimelineConfig(node_id or default_node_id(), rank, framework, flush_interval_s)
        self._store = open_store(out_dir if isinstance(out_dir, Store) else os.fspath(out_dir))
        self._start_ns = time.time_ns()
        self._pid = os.getpid()
        self._events: list[_Buffered] = []
        self._lock = threading.Lock()
        self._flush_lock = threading.RLock()
        self._sequence = 0
        self._closed = False
        self._warn_once = WarnOnce()
        self._sources: list[Callable[[], Iterable[tuple[int, ModeKeys, Sequence[tuple[str, int, int]]]]]] = []
        self._stop = threading.Event()
        self._timer = threading.Thread(target=self._flush_periodically, name="stepscope-timeline-flush", daemon=True)
        self._timer.start()

    def add(
        self,
        name: str,
        start_ns: int,
        end_ns: int,
        *,
        step: int,
        mode: ModeKeys,
        phase: str = "step",
        args: dict[str, Any] | None = None,
    ) -> None:
        """Record one interval; times are absolute `time.time_ns()` nanoseconds."""
        event = (name, start_ns, end_ns, step, int(mode) if type(mode) is ModeKeys else mode, phase, args)  # (see _Buffered)
        with self._lock:
            if self._closed or len(self._events) >= _MAX_BUFFERED_EVENTS:
                dropped = True
            else:
                self._events.append(event)
                dropped = False
        if dropped:
            self._warn_once("dropped", "step timeline: writer closed or buffer full; events dropped")

    def add_spans(self, spans: Sequence[tuple[str, int, int]], *, step: int, mode: ModeKeys) -> None:
        """Record several phases of one step at once, `(phase, start_ns, end_ns)` each (named
        after their phase): one lock and one call for a whole step."""
        number = int(mode)  # (see _Buffered)
        events = [(phase, start, end, step, number, phase, None) for phase, start, end in spans]
        with self._lock:
            if not self._closed and len(self._events) + len(events) <= _MAX_BUFFERED_EVENTS:
                self._events.extend(events)
                return
        self._warn_once("dropped", "step timeline: writer closed or buffer full; events dropped")

    def add_source(self, source: Callable[[], Iterable[tuple[int, ModeKeys, Sequence[tuple[str, int, int]]]]]) -> None:
        """Pull steps' spans, `(step, mode, [(phase, start_ns, end_ns), ...])`, from `source`
        on this writer's thread (every second) and before each flush: a hook then spends
        nothing per step on the timeline beyond logging its clock readings."""
        self._sources.append(source)

    def pull(self) -> None:
        """Take what the sources have now (never raises). Also after close() began, so that
        its last flush publishes what the sources still held."""
        with self._flush_lock:  # a flush in between would publish later steps before these
            for source in self._sources:
                try:
                    events = [(phase, start, end, step, int(mode), phase, None) for step, mode, spans in source() for phase, start, end in spans]
                except Exception as exc:
                    self._warn_once("source", f"step timeline: could not read the hook's step log ({exc!r}); steps are lost")
                    continue
                with self._lock:
                    if len(self._events) + len(events) <= _MAX_BUFFERED_EVENTS:
                        self._events.extend(events)
                        continue
                self._warn_once("dropped", "step timeline: buffer full; events dropped")

    def flush(self) -> str | None:
        """Publish what is buffered as a new file; returns its key (None when nothing was
        buffered or the write failed)."""
        with self._flush_lock:
            self.pull()
            with self._lock:
                events, self._events = self._events, []
            if not events:
                return None
            try:
                flush_ns = time.time_ns()
                key = timeline_key(flush_ns, self.config.node_id, self.config.rank, self._pid, self._sequence)
                self._sequence += 1
                data = encode_timeline(
                    events,
                    node_id=self.config.node_id,
                    rank=self.config.rank,
                    framework=self.config.framework,
                    pid=self._pid,
                    writer_start_ns=self._start_ns,
                    sequence=self._sequence - 1,
                )
                self._store.write(key, data)
                return key
            except StoreUnavailable as exc:
                # The store is not answering: keep the events (within the buffer's bound)
                # for the next flush, which comes every flush_interval_s and at close.
                with self._lock:
                    kept = len(self._events) + len(events) <= _MAX_BUFFERED_EVENTS
                    if kept:
                        self._events[:0] = events
                self._warn_once("unavailable", f"step timeline: the store is not answering ({exc}); {'events kept for the next flush' if kept else f'{len(events)} events lost (buffer full)'}")
                return None
            except Exception as exc:
                self._warn_once("flush", f"step timeline: could not publish {len(events)} events ({exc!r}); they are lost")
                return None

    def close(self) -> None:
        """Stop the timer and publish what is left. Idempotent; never raises."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        try:
            self._stop.set()
            if self._timer is not threading.current_thread():
                self._timer.join(timeout=30)
            self.flush()
        except Exception as exc:
            self._warn_once("close", f"step timeline: error while closing ({exc!r})")


    def _flush_periodically(self) -> None:
        interval = self.config.flush_interval_s
        tick = min(interval, _PULL_INTERVAL_S)
        next_flush = time.monotonic() + interval
        while not self._stop.wait(tick):
            if time.monotonic() >= next_flush:
                next_flush = time.monotonic() + interval
                self.flush()
            else:
                self.pull()


def encode_timeline(
    events: Sequence[_Buffered],
    *,
    node_id: str,
    rank: int,
    framework: str,
    pid: int,
    writer_start_ns: int,
    sequence: int = 0,
) -> bytes:
    """One Chrome-trace file for `events` (tuples as TimelineWriter buffers them): the
    events sorted by start (the longer first at equal starts: a step before the phase that
    opens it), each on its mode's track, or an overflow track where it overlaps another
    without nesting in it. Written by the C extension where it is built, else here: the
    same bytes."""
    made = _encoded_in_c(events, rank)
    if made is None:
        made = _encoded_in_python(_plain_slices(events), rank)
    text, tid_set, first_start_ns, last_end_ns = made
    lines = [json.dumps(_meta("process_name", rank, None, {"name": f"rank {rank} ({node_id}, {framework})"}))]
    lines.append(json.dumps(_meta("process_sort_index", rank, None, {"sort_index": rank})))
    for tid in sorted(tid_set):
        mode = ModeKeys(tid if tid < _OVERFLOW_TID else tid // _OVERFLOW_TID)
        label = mode.name if tid < _OVERFLOW_TID else f"{mode.name} (overlapping {tid % _OVERFLOW_TID})"
        lines.append(json.dumps(_meta("thread_name", rank, tid, {"name": label})))
        lines.append(json.dumps(_meta("thread_sort_index", rank, tid, {"sort_index": tid})))
    metadata = {
        "schema": SCHEMA,
        "schema_version": SCHEMA_VERSION,
        "node_id": node_id,
        "rank": rank,
        "framework": framework,
        "pid": pid,
        "writer_start_ns": writer_start_ns,
        "sequence": sequence,
        "first_start_ns": first_start_ns,
        "last_end_ns": last_end_ns,
    }
    head = '{"traceEvents": [\n' + ",\n".join(lines) + (",\n" if text else "")
    tail = f'\n],\n"displayTimeUnit": "ms",\n"metadata": {json.dumps(metadata)}}}\n'
    return b"".join((head.encode(), text, tail.encode()))


# The events' lines in C (_encode.c), or None: not built, or $STEPSCOPE_PURE_PYTHON.
_encode = load_extension(__package__, "_encode")
_QUOTED: dict[str, bytes] = {}  # names and phases as JSON text (they repeat from step to step)
_MODE_NAME_BYTES = tuple(_MODE_NUMBERS[i].name.encode() if i in _MODE_NUMBERS else None for i in range(max(_MODE_NUMBERS) + 1))
_Encoded = tuple[bytes, "set[int]", "int | None", "int | None"]  # lines, their tids, first start, last end


def _quote(text: str) -> bytes:
    if len(_QUOTED) >= 4096:  # (user-named events without end: a bound, not a cache of all)
        _QUOTED.clear()
    return json.dumps(text).encode()


def _encoded_in_c(events: Sequence[_Buffered], rank: int) -> _Encoded | None:
    """The events' lines by the C extension, or None where it is not there. The hook's own
    spans go to it as they are; when there are others (a user's span with args, a mode
    given by name) every event is made plain here first."""
    if _encode is None or type(rank) is not int:
        return None
    try:
        made = _encode.timeline_events(events if type(events) is list else list(events), rank, _QUOTED, _quote, _MODE_NAME_BYTES)
        if made is None:
            plain = [(name, start_ns, end_ns, step, mode, phase, _args_json(args, step, mode, phase) if args else None)
                     for start_ns, end_ns, name, step, mode, phase, args in _plain_slices(events)]  # fmt: skip
            made = _encode.timeline_events(plain, rank, _QUOTED, _quote, _MODE_NAME_BYTES)
    except Exception as exc:  # (out of memory, say): written in Python, which reports what it cannot write
        logger.debug("step timeline: events written in Python (%r)", exc)
        return None
    return made


def _plain_slices(events: Sequence[_Buffered]) -> list[tuple[int, int, str, int, int, str, Any]]:
    """(start_ns, end_ns, name, step, mode number, phase, args) of each event, converted
    where it needs it; an event that cannot be is left out, with a warning."""
    # Each slice holds its mode as a number, like the buffered events: a tuple of strings
    # and ints only is untracked at the garbage collector's first look, where one holding
    # a ModeKeys stays tracked, and tens of thousands of those, alive through the collections
    # that a flush's own allocations start, were promoted to the oldest generation: every
    # few flushes they set off a full collection, 40-150 ms holding the GIL against training.
    slices: list[tuple[int, int, str, int, int, str, Any]] = []
    append = slices.append
    for name, start_ns, end_ns, step, mode, phase, args in events:
        # The hook's own spans (nearly every event) have the right types already: only the
        # others are converted (what a user handed to `add`).
        if type(start_ns) is int and type(end_ns) is int and start_ns <= end_ns and type(step) is int and type(name) is str and type(phase) is str:
            known = mode if type(mode) is int and mode in _MODE_NUMBERS else int(mode) if type(mode) is ModeKeys else None
            if known is not None:
                append((start_ns, end_ns, name, step, known, phase, args))
                continue
        try:
            mode = int(ModeKeys.parse(mode))
            append((int(start_ns), max(int(end_ns), int(start_ns)), str(name), int(step), mode, str(phase), args))
        except (TypeError, ValueError) as exc:
            logger.warning("step timeline: event %r skipped (%s)", name, exc)
    return slices


def _args_json(args: dict[str, Any], step: int, mode: int, phase: str) -> str:
    """A span's args as its event gives them: the user's, with its step, mode and phase."""
    event_args = dict(args)
    event_args.update(step=step, mode=_MODE_NUMBERS[mode].name, phase=phase)
    return json.dumps(event_args, default=str)


def _encoded_in_python(slices: list[tuple[int, int, str, int, int, str, Any]], rank: int) -> _Encoded:
    """`_encoded_in_c`'s lines, made here."""
    # By start, the longer first at equal starts: two stable sorts with C keys cost less
    # than a Python key per event.
    slices.sort(key=_END, reverse=True)
    slices.sort(key=_START)
    tids = _assign_lanes(slices)
    # One %-template per (name, phase, mode, track): names repeat from step to step.
    lines = []
    templates: dict[tuple[str, str, int, int], str] = {}
    for (start_ns, end_ns, name, step, mode, phase, args), tid in zip(slices, tids):
        duration = end_ns - start_ns
        # ts/dur as exact decimal text: a float of epoch microseconds cannot hold nanoseconds.
        if args:
            lines.append(_event_template(name, phase, rank, tid, _args_json(args, step, mode, phase).replace("%", "%%")) % (start_ns // 1000, start_ns % 1000, duration // 1000, duration % 1000))
            continue
        key = (name, phase, mode, tid)
        template = templates.get(key)
        if template is None:
            args_json = f'{{"step": %d, "mode": "{_MODE_NUMBERS[mode].name}", "phase": {json.dumps(phase).replace("%", "%%")}}}'
            template = templates[key] = _event_template(name, phase, rank, tid, args_json)
        lines.append(template % (start_ns // 1000, start_ns % 1000, duration // 1000, duration % 1000, step))
    first_start = slices[0][0] if slices else None
    last_end = max((s[1] for s in slices), default=None)
    return ",\n".join(lines).encode(), set(tids), first_start, last_end


_START, _END = operator.itemgetter(0), operator.itemgetter(1)


def _event_template(name: str, phase: str, pid: int, tid: int, args_json: str) -> str:
    """A complete event with %-placeholders for ts, dur (and whatever `args_json` holds)."""
    q_name = json.dumps(name).replace("%", "%%")
    q_phase = json.dumps(phase).replace("%", "%%")
    return (
        f'{{"name": {q_name}, "cat": {q_phase}, "ph": "X", "ts": %d.%03d, "dur": %d.%03d, '
        f'"pid": {pid}, "tid": {tid}, "args": {args_json}}}'
    )


def _meta(name: str, pid: int, tid: int | None, args: dict[str, Any]) -> dict[str, Any]:
    event: dict[str, Any] = {"name": name, "ph": "M", "pid": pid}
    if tid is not None:
        event["tid"] = tid
    event["args"] = args
    return event


def _assign_lanes(slices: Sequence[tuple[int, int, str, int, int, str, Any]]) -> list[int]:
    """A track (tid) per mode, where steps contain their phases; an interval that overlaps
    another without nesting in it (a prefetch crossing a step boundary) goes to an overflow
    track, because Perfetto needs the slices of one track properly nested. `slices` must be
    sorted by (start, -end)."""
    # lanes[mode] is a list of stacks of open end times, one stack per track of that mode.
    lanes: dict[int, list[list[int]]] = {}
    tids: list[int] = []
    append = tids.append
    for start, end, _name, _step, mode, _phase, _args in slices:
        stacks = lanes.get(mode)
        if stacks is None:
            stacks = lanes[mode] = [[]]
        for index, stack in enumerate(stacks):
            while stack and stack[-1] <= start:
                stack.pop()
            if not stack or end <= stack[-1]:
                stack.append(end)
                append(int(mode) if index == 0 else int(mode) * _OVERFLOW_TID + index)
                break
        else:  # overlaps every track of its mode without nesting: a new one
            stacks.append([end])
            append(int(mode) * _OVERFLOW_TID + len(stacks) - 1)
    return tids
