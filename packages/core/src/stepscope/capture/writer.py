"""Background writer of one worker's steps: the training thread only enqueues; a thread
frames records, writes each step's event file, then its index file (published last).

A store that stops answering (StoreUnavailable: timeouts, resets, 5xx, throttling) is
waited out however long it takes: the write is tried again with capped exponential
back-off while the queue holds new steps up to its byte bound; a step that finds the queue
full during such an outage is dropped rather than holding training, and is listed by step
in the status file. When the store answers again, saving resumes where it stopped.

`close()` and process exit wait a bounded time (`close_timeout_s`, default 60 s, or the
STEPSCOPE_CLOSE_TIMEOUT_S variable; one deadline shared with the hook's other parts, see
deadline.py); what is still unpublished then is logged and named in the worker's status
file, and the process goes on."""

from __future__ import annotations

import atexit
import functools
import json
import logging
import os
import queue
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from .. import layout
from ..closing import ClosedOnExit
from ..exceptions import ConfigError, StoreUnavailable
from ..modes import ModeKeys
from ..store import Store, open_store
from ..store.direct_io import DIRECT_FROM, set_backlogged
from .deadline import CLOSE_TIMEOUT_ENV, DEFAULT_CLOSE_TIMEOUT_S, Deadline, close_timeout_from_env, exit_deadline
from .safety import FailSafe, write_status
from .step_framing import FramedHeld, StepFramer, StepTables, as_array, index_json
from .writer_health import WriterHealth, printable

logger = logging.getLogger("stepscope")

# "smdebug" writes smdebug's constant instead of real payload CRCs, for jobs that must also
# open in smdebug's own reader; the default "crc32c" lets readers detect corruption.
PAYLOAD_CRC_ENV = "STEPSCOPE_PAYLOAD_CRC"
DEFAULT_MAX_QUEUE_BYTES = 512 * 1024 * 1024
_STATUS_WAIT_S = 5.0  # the most of close()'s bound kept for writing the status file
# Back-off between tries of a write the store did not take: doubling from the first, capped
# so that saving resumes within a few seconds of the store answering again.
RETRY_FIRST_S = 0.25
RETRY_MAX_S = 4.0
# Bytes handed over and waiting behind a large job above which the writer counts as
# behind (saves at every step of a small model wait 1-2 MB behind each other; a burst of
# large saves waits hundreds of MB).
BACKLOG_BYTES = 32 << 20
# A held batch of at least this many steps publishes a held table and its last step's index
# file (Writer._publish_held) instead of an index file per step: two small files instead of
# a hundred, each of which costs the publishing thread 25 us of CPU here (ext4).
HELD_TABLE_FROM = 3
_JOIN_BATCH_BELOW = 1 << 20  # bytes: a batch's event file up to this is written as one buffer

__all__ = ["Writer", "Deferred", "PendingValue", "CLOSE_TIMEOUT_ENV", "DEFAULT_CLOSE_TIMEOUT_S", "close_timeout_from_env"]


class PendingValue(Protocol):
    """A value whose host copy is still in flight (e.g. a non-blocking CUDA copy)."""

    nbytes: int

    def resolve(self) -> np.ndarray: ...


@dataclass
class Deferred:
    """Wraps a zero-argument function that returns the value, run on the writer thread."""

    fn: Callable[[], Any]
    nbytes: int = 0

    def resolve(self) -> np.ndarray:
        return np.asarray(self.fn())


@dataclass
class _StepJob:
    step: int
    mode: ModeKeys
    mode_step: int
    tensors: Mapping[str, Any]
    shapes: Mapping[str, Sequence[int]]
    nbytes: int


def _nbytes(tensors: Mapping[str, Any]) -> int:
    """The bytes of a step's values (what counts against the queue's bound)."""
    return sum(int(getattr(v, "nbytes", 0) or 0) for v in tensors.values())


@dataclass
class _StepBatch:
    """Small steps handed over together (a hook's scalar-only steps): framed into one event
    file, each step still with its own index file (what smdebug's reader lists). `held`:
    steps as HeldSteps holds them, made into `steps` on the writer's thread (`jobs()`)."""

    steps: list[_StepJob] | None
    nbytes: int
    held: list[tuple[int, ModeKeys, int, Mapping[str, Any], Mapping[str, Sequence[int]]]] | None = None

    def jobs(self) -> list[_StepJob]:
        if self.steps is None:
            self.steps = [
                _StepJob(step, mode, mode_step, tensors, shapes, _nbytes(tensors))
                for step, mode, mode_step, tensors, shapes in self.held or ()
            ]
            self.held = None
        return self.steps

    def step_numbers(self) -> list[int]:
        return [j.step for j in self.steps] if self.steps is not None else [held[0] for held in self.held or ()]


@dataclass
class _FileJob:
    key: str
    data: Any
    nbytes: int


def _at_risk(job: Any) -> tuple[list[int], list[str]]:
    """The steps and files a queued job would lose if never published (the status file's
    lost steps and files); barriers and finish jobs put nothing at risk."""
    if isinstance(job, _StepJob):
        return [job.step], []
    if isinstance(job, _StepBatch):
        return job.step_numbers(), []
    if isinstance(job, _FileJob):
        return [], [job.key]
    return [], []


@dataclass
class _Barrier:
    done: threading.Event


@dataclass
class _FinishJob:
    """Publishes the last step table and (optionally) the end marker, in order."""

    end_marker: bool
    nbytes: int = 0


_as_array = as_array  # (its old name here)


class Writer(ClosedOnExit):
    """Writes steps of one worker to a store.

    `write_step` hands over a whole step (every tensor of it, raw values and reductions
    alike); values may be numpy arrays or `PendingValue`s resolved on the writer thread.
    The queue holds at most `max_queue_bytes`; a producer that would exceed it waits (back
    pressure rather than silently dropping data), except while the store is not answering:
    then the step is dropped and listed in the status file (`lost_steps`). A write the
    store did not take is tried again until it does (module docstring). Any other failure
    to write is logged once, recorded in `stepscope-status/<worker>.json`, and the writer
    stops accepting work; it never raises into the training thread."""

    def __init__(
        self,
        out_dir: str | Store,
        worker: str = "worker_0",
        *,
        max_queue_bytes: int = DEFAULT_MAX_QUEUE_BYTES,
        payload_crc: str | None = None,
        close_timeout_s: float | None = None,
    ):
        self.store = open_store(out_dir)
        self.worker = worker
        self.max_queue_bytes = int(max_queue_bytes)
        if close_timeout_s is None:
            close_timeout_s = close_timeout_from_env()
        if isinstance(close_timeout_s, bool) or not isinstance(close_timeout_s, (int, float)) or not 0 < close_timeout_s < float("inf"):
            raise ConfigError(f"Writer.close_timeout_s must be a positive number of seconds, got {close_timeout_s!r}")
        self.close_timeout_s = float(close_timeout_s)
        self.payload_crc = payload_crc or os.environ.get(PAYLOAD_CRC_ENV, "crc32c")
        if self.payload_crc not in ("crc32c", "smdebug"):
            raise ConfigError(f"payload_crc must be 'crc32c' or 'smdebug', got {self.payload_crc!r} (from {PAYLOAD_CRC_ENV}?)")
        self._failsafe = FailSafe(f"writer ({worker})", on_failure=lambda status: write_status(self.store, worker, status))
        self._queue: deque[Any] = deque()
        self._queued_bytes = 0
        self._cond = threading.Condition()
        self._closed = False
        self._published: set[int] = set()
        self._framer = StepFramer(worker, self._drop_tensor, placeholder_crc=self.payload_crc == "smdebug")
        self._tables = StepTables(worker)
        self._unpublished: set[int] = set()  # steps handed over and not yet published
        self._unpublished_files: set[str] = set()
        self._abandoned = False  # close() gave up waiting: the threads drop what is left
        # The store's outages (StoreUnavailable) and what they cost: steps and files that
        # found the queue full while the store was not answering.
        self.health = WriterHealth(worker, self._cond)
        self._waited_s = 0.0  # publisher time spent waiting out outages (not work: kept out of busy_s)
        self._wake = threading.Event()  # ends a retry's back-off early: close() gave up
        self._was_behind = False  # the publisher's last large job found the writer behind
        # Two stages: this thread encodes and checksums, the publisher writes files, so that
        # when steps queue up, framing step N+1 overlaps writing N.
        self._framed: queue.Queue[Any] = queue.Queue(maxsize=2)
        # Jobs handed to the publisher and not yet published (counted under _publishing,
        # which is held while a job is published). With none, and nothing waiting to be
        # framed, there is nothing to overlap: the writer thread publishes the job itself
        # (_run). A hand-over wakes a second thread, which on a machine whose cores all
        # train takes a core from training once more per save (bench/ab_writer_parts.py
        # handoff: 0.25-0.79 ms of training time per 3.2 MB save in 5 of 6 runs here, near
        # that script's resolution of about 0.45 ms a save).
        self._publishing = threading.Lock()
        self._handed = 0
        self._publish_inline = True  # (False: always hand over; for that bench)
        # stepscope's own cost, measured here for the report: seconds the two threads spent
        # working (not waiting) and bytes published.
        self.busy_s = 0.0
        self.bytes_written = 0
        # Called on the writer thread with (step, mode, mode_step, {name: array}) after a step
        # is framed (the live TensorBoard writer); a failing listener is dropped, not fatal.
        self.step_listeners: list[Any] = []
        self._publisher = threading.Thread(target=self._publish_loop, name=f"stepscope-publisher-{worker}", daemon=True)
        self._publisher.start()
        self._thread = threading.Thread(target=self._run, name=f"stepscope-writer-{worker}", daemon=True)
        self._thread.start()
        # The threads are daemons (a stalled store must not keep the process alive); at
        # exit, flush what is queued, within the same bound as close().
        self._atexit = functools.partial(_close_at_exit, weakref.ref(self))
        atexit.register(self._atexit)
        self._clean_stale_temporaries()

    def _clean_stale_temporaries(self) -> None:
        # A killed run leaves ".NAME.PID.N.tmp" files of its own worker behind: harmless to
        # readers (never listed), but they hold disk space. Removed in the background.
        if self.store.local_path() is None:
            return  # only a local folder holds temporaries (an S3 object is PUT whole)
        remove = self.store.remove_stale_temporaries

        def run() -> None:
            try:
                removed = remove(f"_{self.worker}.")
                if removed:
                    logger.info("stepscope: removed %d stale temporary file(s) of %s", removed, self.worker)
            except Exception as exc:  # best effort
                logger.debug("stepscope: could not clean stale temporary files: %s", exc)

        threading.Thread(target=run, name=f"stepscope-cleanup-{self.worker}", daemon=True).start()

    # --- producer side (training thread) ---------------------------------------------

    @property
    def failed(self) -> bool:
        return self._failsafe.error is not None

    @property
    def error(self) -> BaseException | None:
        return self._failsafe.error

    @property
    def accepting(self) -> bool:
        return not self._closed and self._failsafe.enabled

    def write_step(self, step: int, mode: ModeKeys, mode_step: int, tensors: Mapping[str, Any], shapes: Mapping[str, Sequence[int]] | None = None) -> bool:
        """Enqueue one step; returns False (and drops it) once the writer is closed or failed."""
        nbytes = _nbytes(tensors)
        return self._put(_StepJob(int(step), ModeKeys.parse(mode), int(mode_step), dict(tensors), dict(shapes or {}), nbytes), nbytes)

    def write_steps(self, steps: Sequence[tuple[int, ModeKeys, int, Mapping[str, Any], Mapping[str, Sequence[int]]]]) -> bool:
        """Enqueue several small steps, each (step, mode, mode_step, tensors, shapes), as one
        job: their records go into one event file (named by the first step), published
        before the steps' own index files, which point into it. For steps of a few scalars,
        where a file per step would cost more than the step's bytes."""
        jobs = [
            _StepJob(int(step), ModeKeys.parse(mode), int(mode_step), dict(tensors), dict(shapes or {}), _nbytes(tensors))
            for step, mode, mode_step, tensors, shapes in steps
        ]
        if not jobs:
            return True
        nbytes = sum(j.nbytes for j in jobs)
        return self._put(_StepBatch(jobs, nbytes), nbytes)

    def write_held_steps(self, steps: list[tuple[int, ModeKeys, int, Mapping[str, Any], Mapping[str, Sequence[int]]]]) -> bool:
        """`write_steps` for HeldSteps' steps, which it hands over whole: ended steps (nothing
        changes them any more) of a few small values. Taken as they are (no copies, no
        checks) and made into jobs on the writer's thread: the training thread, which hands
        them over, pays only for their bytes' count."""
        if not steps:
            return True
        try:  # (numpy values all: one comprehension, a third of the general count's time)
            nbytes = sum([value.nbytes for _step, _mode, _mode_step, tensors, _shapes in steps for value in tensors.values()])
        except AttributeError:
            nbytes = sum(_nbytes(tensors) for _step, _mode, _mode_step, tensors, _shapes in steps)
        return self._put(_StepBatch(None, nbytes, steps), nbytes)

    def write_file(self, key: str, data: bytes) -> bool:
        """Enqueue a whole file (collections JSON, a control or report object)."""
        return self._put(_FileJob(key, data, len(data)), len(data))

    @property
    def unpublished_steps(self) -> list[int]:
        """Steps handed over and not published (yet, or ever after an abandoned close)."""
        with self._cond:
            return sorted(self._unpublished)

    def write_collections(self, collections_json: bytes) -> bool:
        """Publish this worker's collections file, recording how payloads are checksummed
        (the reader accepts smdebug's placeholder only where the file says so)."""
        body = json.loads(collections_json)
        body.setdefault("_meta", {})["payload_crc"] = self.payload_crc
        return self.write_file(layout.collections_key(self.worker), json.dumps(body, indent=1, sort_keys=True).encode())

    def _put(self, job: Any, nbytes: int) -> bool:
        if not self.accepting:
            return False
        with self._cond:
            # Back pressure: wait for room, but always admit a job into an empty queue.
            while self._queued_bytes and self._queued_bytes + nbytes > self.max_queue_bytes and self.accepting:
                if self.health.since is not None:
                    # The store is not answering and the bound is reached: waiting would hold
                    # training for an outage of unknown length. Dropped, and listed by step.
                    self._lose(job)
                    return False
                self._cond.wait(0.5)
            if not self.accepting:
                return False
            self._queue.append(job)
            self._queued_bytes += nbytes
            steps, files = _at_risk(job)
            self._unpublished.update(steps)
            self._unpublished_files.update(files)
            self._cond.notify_all()
        return True

    @property
    def in_outage(self) -> bool:
        """Whether the store is not answering now (the writer holds its queue and retries)."""
        return self.health.since is not None

    @property
    def lost_steps(self) -> list[int]:
        """Steps dropped because the queue was full while the store was not answering."""
        with self._cond:
            return sorted(self.health.lost_steps)

    # The outages' counts and the tensors that could not be encoded (writer_health.py).
    outages = property(lambda self: self.health.outages)
    retries = property(lambda self: self.health.retries)
    longest_outage_s = property(lambda self: self.health.longest_s)
    dropped_tensors = property(lambda self: self.health.dropped_tensors)

    def _lose(self, job: Any) -> None:
        """(Under the lock.) `job` found the queue full during an outage: dropped."""
        steps, files = _at_risk(job)
        what = f"file {files[0]}" if files else f"step {steps[0]}" if len(steps) == 1 else f"steps {steps[0]}-{steps[-1]}"
        held = f"{self._queued_bytes:,} bytes held, max_queue_bytes {self.max_queue_bytes:,}"
        self.health.lose(steps, files, what, held)

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until everything enqueued so far is published (or dropped on failure).
        Returns False, without waiting on, while the store is not answering: the writer
        keeps what it holds and goes on trying; training is not held for an outage."""
        if not self._thread.is_alive():
            return True
        barrier = _Barrier(threading.Event())
        with self._cond:
            self._queue.append(barrier)
            self._cond.notify_all()
        end = None if timeout is None else time.monotonic() + max(0.0, timeout)
        while True:
            wait = 0.25 if end is None else min(0.25, max(0.0, end - time.monotonic()))
            if barrier.done.wait(wait):
                return True
            if self.health.since is not None or (end is not None and time.monotonic() >= end):
                return False

    def close(self, timeout: float | None = None, *, end_marker: bool = True, deadline: Deadline | None = None) -> bool:
        """Flush, publish the last step table and training_job_end.ts (unless told not to),
        stop the threads. Waits at most `timeout` seconds (default `close_timeout_s`), or
        until `deadline` (the hook's one deadline for its whole close); if the store has
        not taken everything by then, the rest is reported lost (log and status file) and
        close returns False. Never raises."""
        if self._closed:
            return not self._abandoned
        atexit.unregister(self._atexit)
        if deadline is None:
            deadline = Deadline(self.close_timeout_s if timeout is None else max(0.0, float(timeout)))
        # Keep part of the bound for the status file, which goes to the same store.
        reserve = min(_STATUS_WAIT_S, deadline.seconds / 4)
        barrier = _Barrier(threading.Event())
        with self._cond:
            if self._thread.is_alive():
                self._queue.append(_FinishJob(end_marker))
                self._queue.append(barrier)
            else:
                barrier.done.set()

            self._closed = True
            self._cond.notify_all()
        if not barrier.done.wait(max(0.0, deadline.left() - reserve)):
            self._abandon(deadline)
            return False
        self._thread.join(deadline.left())
        self._publisher.join(deadline.left())
        return True

    def _abandon(self, deadline: Deadline) -> None:
        with self._cond:
            self._abandoned = True
            self._wake.set()
            steps = sorted(self._unpublished | self.health.lost_steps)
            files = sorted(self._unpublished_files | self.health.lost_files)
            self._queue.clear()
            self._cond.notify_all()
        shown = ", ".join(map(str, steps[:20])) + (", ..." if len(steps) > 20 else "")
        reason = f"the store did not take everything within {deadline.seconds:g} s ({CLOSE_TIMEOUT_ENV})"
        logger.error("stepscope: writer (%s) gave up at close: %s; %d step(s) lost: %s%s", self.worker, reason, len(steps), shown or "none", f"; files lost: {', '.join(files)}" if files else "")
        status = {**self._status_body(), "state": "incomplete", "error": f"close timed out: {reason}", "lost_steps": steps, "lost_files": files}
        try:
            write_status(self.store, self.worker, status, timeout_s=deadline.left())
        except Exception as exc:
            logger.error("stepscope: could not record the lost steps in the status file either: %s", exc)

    def __del__(self) -> None:
        try:
            atexit.unregister(self._atexit)
        except Exception:
            pass

    # --- consumer side (writer thread) ------------------------------------------------

    def _run(self) -> None:
        """First stage: frame each step's records, hand them to the publisher in order, or
        publish them here when the publisher has nothing and no job waits to be framed."""
        while True:
            with self._cond:
                while not self._queue and not self._closed:
                    self._cond.wait()
                job = self._queue.popleft() if self._queue else None
            if job is None:
                # Outside the lock: the publisher takes it to count what it published.
                self._framed.put(None)  # tells the publisher to stop
                return
            framed: Any = None
            started = time.perf_counter()
            if isinstance(job, _StepJob) and self._failsafe.enabled and not self._abandoned:
                framed = self._failsafe.call(self._frame_step, job)
            elif isinstance(job, _StepBatch) and self._failsafe.enabled and not self._abandoned:
                framed = self._failsafe.call(self._frame_batch, job)
            self.busy_s += time.perf_counter() - started
            with self._publishing:
                inline = self._publish_inline and not self._handed and not self._queue
                if inline:
                    self._publish_item(job, framed)
                else:
                    self._handed += 1
            if not inline:
                self._framed.put((job, framed))

    def _publish_loop(self) -> None:
        """Second stage: publish files in the order jobs were handed over."""
        while True:
            item = self._framed.get()
            if item is None:
                return
            with self._publishing:
                self._publish_item(*item)
                self._handed -= 1

    def _publish_item(self, job: Any, framed: Any) -> None:
        """Publish one handed-over job (framed by the first stage), then count it done."""
        if isinstance(job, _Barrier):
            job.done.set()
            return
        started, waited = time.perf_counter(), self._waited_s
        if job.nbytes >= DIRECT_FROM:
            # The writer is behind when BACKLOG_BYTES (or another job like this one) wait
            # behind this job; then a local store takes the page cache's throughput over
            # direct writes' CPU (store/direct_io.py), for this job and the next (a burst's
            # last job finds little behind it).
            behind = self._queued_bytes - job.nbytes >= max(BACKLOG_BYTES, job.nbytes)
            set_backlogged(behind or self._was_behind)
            self._was_behind = behind
        if self._failsafe.enabled and not self._abandoned:
            if isinstance(job, _FileJob):
                if self._failsafe.call(self._write, job.key, job.data):
                    self.bytes_written += len(job.data)
            elif isinstance(job, _FinishJob):
                self._failsafe.call(self._publish_step_table)
                if self.health.dropped_tensors or self.health.status_due:
                    self._failsafe.call(self._publish_status)
                if job.end_marker and self._failsafe.enabled:
                    self._failsafe.call(self._write, layout.END_MARKER, b"")
            elif isinstance(job, _StepBatch):
                if isinstance(framed, FramedHeld):
                    self._failsafe.call(self._publish_held, framed)
                elif framed is not None:
                    self._failsafe.call(self._publish_batch, *framed)
            elif framed is not None:
                self._failsafe.call(self._publish_step, job, *framed)
            if self.health.status_due and self.health.since is None and self._failsafe.enabled:
                self._failsafe.call(self._publish_status)  # the store answers again: say what the outage cost
        self.busy_s += time.perf_counter() - started - (self._waited_s - waited)
        with self._cond:
            self._queued_bytes -= job.nbytes
            if self._failsafe.enabled and not self._abandoned:
                # Published (or dropped as a duplicate): no longer at risk.
                steps, files = _at_risk(job)
                self._unpublished.difference_update(steps)
                self._unpublished_files.difference_update(files)
            self._cond.notify_all()

    def _frame_step(self, job: _StepJob, parts: list[Any] | None = None, event_key: str | None = None, offset: int = 0) -> tuple[list[Any], dict[str, Any]] | None:
        """(the event file's buffers, the step's index); with `parts` (`offset` bytes), the
        step's records are appended to those of event file `event_key` (a batch)."""
        if job.step in self._published:
            logger.warning("stepscope: step %d of %s was handed over twice; the second one is dropped", job.step, self.worker)
            return None
        self._published.add(job.step)
        arrays: dict[str, np.ndarray] | None = {} if self.step_listeners else None
        finite: dict[str, bool] | None = {} if self.step_listeners else None
        parts, index = self._framer.frame(job.step, job.mode, job.mode_step, job.tensors, job.shapes, arrays, parts=parts, event_key=event_key,
                                          offset=offset, finite=finite, align=self.store.data_alignment())  # fmt: skip
        if arrays is not None:
            self._tell_listeners(lambda listener: _tell_step(listener, job, arrays, finite))
        return parts, index

    def _frame_batch(self, batch: _StepBatch) -> FramedHeld | tuple[list[Any], list[tuple[_StepJob, dict[str, Any]]]] | None:
        """One event file for the batch's steps (named by the first), one index per step."""
        if batch.held is not None:
            held = self._frame_held(batch.held)
            if held is not None:
                return held
        parts: list[Any] | None = None
        event_key = None
        offset = 0
        indexed = []
        for job in batch.jobs():
            before = len(parts) if parts is not None else 0
            framed = self._frame_step(job, parts, event_key, offset)
            if framed is not None:
                parts, index = framed
                offset = (offset if before else 0) + sum(memoryview(p).nbytes for p in parts[before:])
                event_key = index["meta"]["event_file_name"]
                indexed.append((job, index))
        if parts is None:
            return None
        if offset <= _JOIN_BATCH_BELOW:
            # A batch of scalar steps is hundreds of records of a few dozen bytes: one
            # buffer (a copy of a few KB) makes the file one plain write, not a gathered
            # write of as many buffers.
            parts = [b"".join(parts)]
        return parts, indexed

    def _frame_held(self, held: list[tuple[int, ModeKeys, int, Mapping[str, Any], Mapping[str, Sequence[int]]]]) -> FramedHeld | None:
        """A held batch framed at once in C (StepFramer.frame_held), or None: the batch is
        framed step by step (what C does not frame; a step handed over before)."""
        numbers = [step[0] for step in held]
        unique = set(numbers)
        if len(unique) != len(numbers) or not self._published.isdisjoint(unique):
            return None  # (the step-by-step path drops the repeated step, with a warning)
        framed = self._framer.frame_held(held)
        if framed is None:
            return None
        self._published |= unique
        self._tell_listeners(lambda listener: _tell_held(listener, held))
        return framed

    def _tell_listeners(self, tell: Callable[[Any], None]) -> None:
        """`tell(listener)` for each step listener; one that fails is turned off."""
        for listener in list(self.step_listeners):
            try:
                tell(listener)
            except Exception as exc:  # an optional output must not stop the tensors being saved
                logger.warning("stepscope: %r failed and is turned off: %s", listener, exc)
                self.step_listeners.remove(listener)

    def _write(self, key: str, data: Any) -> bool:
        """Publish one object, waiting out an outage of the store however long it lasts
        (tries with capped exponential back-off). False when close() gave up first; other
        errors raise (the fail-safe turns the writer off)."""
        return self._write_many([(key, data)]) == 1

    def _write_many(self, files: list[tuple[str, Any]]) -> int:
        """Publish `files` in order as `_write` does each (an outage waited out, resuming at
        the first file not yet published); returns how many were published: all of them,
        or fewer when close() gave up first."""
        done = 0

        def published(_item: int) -> None:
            nonlocal done
            done += 1

        delay = RETRY_FIRST_S
        while not self._abandoned:
            try:
                self.store.write_many(files[done:], published)
            except StoreUnavailable as exc:
                began = time.perf_counter()
                self.health.outage_begins(exc, self.max_queue_bytes)
                self._wake.wait(delay)
                delay = min(2 * delay, RETRY_MAX_S)
                self._waited_s += time.perf_counter() - began
                continue
            if self.health.since is not None:
                self.health.outage_ends()
            return done
        return done

    def _status_body(self) -> dict[str, Any]:
        return self.health.status_body()

    def _publish_status(self) -> None:
        self.health.status_due = False
        body = json.dumps(self._status_body(), indent=1).encode()
        if self._write(layout.status_key(self.worker), body):
            self.bytes_written += len(body)

    def _drop_tensor(self, step: int, name: str, exc: BaseException) -> None:
        self.health.drop_tensor(step, name, exc)

    def _publish_step(self, job: _StepJob, parts: list[Any], index: dict[str, Any]) -> None:
        if not index["tensor_payload"] and not index["shape_payload"] and job.tensors:
            return  # every tensor of the step was dropped: nothing to publish
        index_bytes = index_json(index)
        # The event file, then the index file that points into it (published second: a
        # reader that finds an index finds its records), in one call of the store.
        published = self._write_many([(index["meta"]["event_file_name"], parts), (layout.index_file_key(job.step, self.worker), index_bytes)])
        if published:
            self.bytes_written += sum(memoryview(p).nbytes for p in parts)
        if published < 2:
            return
        self.bytes_written += len(index_bytes)
        self._add_to_step_table(job.step, index)

    def _publish_batch(self, parts: list[Any], indexed: list[tuple[_StepJob, dict[str, Any]]]) -> None:
        """The batch's event file, then each step's index file (published last: a reader
        that finds an index finds its records)."""
        kept = [(job, index) for job, index in indexed if index["tensor_payload"] or index["shape_payload"] or not job.tensors]
        if not kept or not self._write(kept[0][1]["meta"]["event_file_name"], parts):
            return
        self.bytes_written += sum(memoryview(p).nbytes for p in parts)
        # The index files in one go: most share a folder, which the store then walks once.
        files = [(layout.index_file_key(job.step, self.worker), index_json(index)) for job, index in kept]
        published = self._write_many(files)
        for (job, index), (_key, body) in zip(kept[:published], files):
            self.bytes_written += len(body)
            self._add_to_step_table(job.step, index)

    def _publish_held(self, framed: FramedHeld) -> None:
        """A held batch framed at once: its event file, then its steps' index entries, as a
        held table and the last step's index file naming it (`_held_index`), or where a
        reader needs every step's index file (smdebug's, which reads only jobs written with
        its placeholder CRC) or the batch is too short to gain, each step's index file."""
        if not self._write(framed.event_key, framed.data):
            return
        self.bytes_written += len(framed.data)
        worker = self.worker
        table = None
        if self.payload_crc == "crc32c" and len(framed.entries) >= HELD_TABLE_FROM:
            table = self._tables.held_table(framed.entries)
            last = _held_index(framed.bodies[-1], table[0])
            if last is not None:
                files = [table, (layout.index_file_key(framed.entries[-1][0], worker), last)]
            else:
                table = None
        if table is None:
            files = [(layout.index_file_key(entry[0], worker), body) for entry, body in zip(framed.entries, framed.bodies)]
        published = self._write_many(files)
        self.bytes_written += sum(len(body) for _key, body in files[:published])
        if table is not None:
            entries = framed.entries if published else []  # (the held table holds them all)
        else:
            entries = framed.entries[:published]
        for done in self._tables.add_entries(entries):
            self._write_table(done)

    def _add_to_step_table(self, step: int, index: dict[str, Any]) -> None:
        done = self._tables.add(step, index)
        if done is not None:
            self._write_table(done)

    def _publish_step_table(self) -> None:
        done = self._tables.take()
        if done is not None:
            self._write_table(done)

    def _write_table(self, table: tuple[str, bytes]) -> None:
        """A step table (stepscope-index/), counted in bytes_written as every file is."""
        key, data = table
        if self._write(key, data):
            self.bytes_written += len(data)


def _held_index(body: bytes, table_key: str) -> bytes | None:
    """The index file `body` (as frame_held writes it: the meta first) with the held table
    `table_key` named in its meta (`meta.step_table`, which smdebug's reader ignores);
    None for a body of another shape (each step's index file is then published)."""
    at = body.find(b'}, "tensor_payload"')
    if not body.startswith(b'{"meta": {') or at < 0:
        return None
    return body[:at] + b', "step_table": ' + json.dumps(table_key).encode() + body[at:]


def _tell_step(listener: Any, job: _StepJob, arrays: dict[str, np.ndarray], finite: dict[str, bool] | None) -> None:
    """A framed step to a step listener, with what framing found out about its large float
    arrays (`finite`, StepFramer.frame's) where the listener asks it (`checked_step`: the
    black box's, which then need not read those arrays again)."""
    take_checked = getattr(listener, "checked_step", None)
    if take_checked is not None and finite:
        take_checked(job.step, job.mode, job.mode_step, arrays, finite)
    else:
        listener(job.step, job.mode, job.mode_step, arrays)


def _tell_held(listener: Any, held: list[tuple[int, ModeKeys, int, Mapping[str, Any], Mapping[str, Sequence[int]]]]) -> None:
    """A held batch to a step listener: at once where it takes a batch (`held_steps`: the
    black box's), else step by step as `_tell_step` tells it."""
    take_many = getattr(listener, "held_steps", None)
    if take_many is not None:
        take_many(held)
        return
    for step, mode, mode_step, tensors, _shapes in held:
        listener(step, mode, mode_step, {name: as_array(value) for name, value in tensors.items()})


_printable = printable  # (its old name here)


def _close_at_exit(ref: weakref.ReferenceType[Writer]) -> None:
    writer = ref()
    if writer is not None and not writer._closed:
        # No end marker: only the hook knows whether the job ended (and rank 0 writes it).
        writer.close(end_marker=False, deadline=exit_deadline().within(writer.close_timeout_s))
