"""What a running hook holds beyond its steps: the job's store, the claim on its worker,
the writer, the outputs (cost file, TensorBoard, report), the stop poller, the system
monitor and the step timeline (its clock, phase log and writer); how they start, flush
and close within one deadline. The step driver and the tensor saver never open, flush or
close any of these: they only hand steps to the writer and records to the phase log."""

from __future__ import annotations

import atexit
import logging
import threading
from collections.abc import Callable
from typing import Any

from ..exceptions import ConfigError
from ..modes import ModeKeys
from ..store import Store, open_store
from . import annotation
from .control import StopPoller
from .deadline import CLOSE_TIMEOUT_ENV, Deadline, close_timeout_from_env, finish_within, start_within
from .evidence import TOO_LITTLE_DATA, SavedEvidence
from .held_steps import HeldSteps
from .hook_outputs import HookOutputs, instrument
from .job_claim import WriterClaim
from .phases import Clock, StepTimer
from .safety import write_status
from .writer import Writer

logger = logging.getLogger("stepscope")

_AFTER_WRITER_S = 2.0  # of close()'s deadline, the most kept for the cost file (written after the writer)


class HookRuntime:
    """The background parts of one hook (`hook` gives its identity, options, fail-safes,
    counters and the plugin's clock and windowed profilers). Every part is None until
    `start` made it; a hook that never starts (STEPSCOPE_DISABLE) holds none."""

    def __init__(self, hook: Any):
        self._hook = hook
        self.store: Store | None = None
        self.writer: Writer | None = None
        self.held: HeldSteps | None = None  # scalar-only steps on their way to the writer
        self.claim: WriterClaim | None = None
        self.outputs: HookOutputs | None = None
        self.stop_poller: StopPoller | None = None
        self.monitor: Any = None
        self.timeline: Any = None
        # The step timeline: the training thread appends a clock reading per boundary to the
        # step driver's phase log; the flush thread turns the log into spans (drain_timeline).
        self.timer: StepTimer | None = None
        self._drain_lock = threading.Lock()
        self.saved: SavedEvidence | None = None

    def start(self, saved: SavedEvidence, control_poll_s: float) -> None:
        """Open the store and start every part the options ask for (the hook's atexit
        handler is registered: it is moved behind the writer's)."""
        hook = self._hook
        self.saved = saved
        self.store = store = open_store(hook.options.out_dir)  # raises ConfigError when out_dir is a file
        hook.failsafe.set_on_failure(lambda status: write_status(store, hook.worker, status))
        hook.profiler_failsafe.set_on_failure(lambda status: write_status(store, f"{hook.worker}_profiler", status))
        if hook.writes_tensors:
            self.claim = self._claim_worker(store)
            self.writer = Writer(store, hook.worker)
            self.held = HeldSteps(self.writer, note=saved.note)
            # atexit runs the last registered first: the hook's close (which writes the end
            # marker through the writer) must come before the writer's own exit handler,
            # which closes the writer without one.
            atexit.unregister(hook._at_exit)
            atexit.register(hook._at_exit)
            self.write_collections()
        # Live TensorBoard, the report at close, and stepscope's own cost (hook_outputs).
        opts = hook.options
        self.outputs = HookOutputs(hook.worker, tensorboard_dir=opts.tensorboard_dir, report=opts.report, several_workers=hook.num_workers > 1, chief=hook.rank == 0)
        hook.failsafe.call(self.outputs.attach, self.writer)
        instrument(hook, self.outputs)
        self.stop_poller = hook._stop.start(store, control_poll_s)
        hook.profiler_failsafe.call(self._start_profiler)

    def _claim_worker(self, store: Store) -> WriterClaim | None:
        """One writer per worker of a job folder (job_claim.py): a live holder is refused
        here, with the hook left closed; a claim that cannot be written only warns."""
        hook = self._hook
        try:
            return WriterClaim.claim(store, hook.worker)
        except ConfigError:
            hook._counters.closed = True
            atexit.unregister(hook._at_exit)
            raise
        except Exception as exc:  # noqa: BLE001 - the claim is a safeguard; saving can go on without it
            logger.warning("stepscope: could not record this run's claim on %s: %s", store.describe(), exc)
            return None

    # --- the writer -------------------------------------------------------------------

    def release_held(self) -> None:
        if self.held is not None:
            self.held.release()

    def close_held(self) -> None:
        if self.held is not None:
            self.held.close()

    def write_collections(self) -> None:
        if self.writer is not None:
            hook = self._hook
            self.writer.write_collections(hook._saver.collections_file(hook.num_workers))

    # --- the step timeline and the monitor ----------------------------------------------

    def _start_profiler(self) -> None:
        from .monitor import SystemMonitor, default_node_id
        from .step_timeline import TimelineWriter

        hook, store = self._hook, self.store
        assert store is not None
        node = default_node_id()
        config = hook.profiler_config
        if config.system_monitor and SystemMonitor.should_run(hook.rank, hook.local_rank, config.monitor_every_rank):
            node_id = default_node_id(hook.rank) if config.monitor_every_rank else node
            # In a sampler process of its own: the training thread's hold on the GIL cannot
            # delay a sample there.
            self.monitor = SystemMonitor(store, interval_ms=config.monitor_interval_ms, node_id=node_id, process=True)
            self.monitor.start()
        if config.step_timeline:
            self.timeline = TimelineWriter(store, node_id=node, rank=hook.rank, framework=hook.framework)
            self.timer = StepTimer(hook._make_clock())
            hook._use_log(self.timer.clock)
            hook._counters.now = self.timer.clock.now
            self.timeline.add_source(self.drain_timeline)
            # stepscope.annotate() outside profiling windows: a span of the open step.
            annotation.set_sink(self.annotation_span)
        hook._counters.detailed = hook._make_detailed_profilers()

    def annotation_span(self, name: str, start_ns: int, end_ns: int) -> None:
        self._hook.add_timeline(name, start_ns, end_ns, phase="annotation")

    def set_clock(self, clock: Clock) -> None:
        """Use `clock` for the step timeline from now on (before the first step)."""
        if self.timer is not None:
            log = self._hook._log
            if log is not None and log.flat != getattr(clock, "int_tokens", False):
                self.publish_timeline(True)  # (empty before the first step)
                self._hook._use_log(clock)
            self.timer.clock = clock
            self._hook._counters.now = clock.now

    def drain_timeline(self, wait: bool = False) -> list[tuple[int, ModeKeys, list[tuple[str, int, int]]]]:
        """The steps logged since the last drain whose times the clock knows (all of them
        with `wait`), in wall-clock ns. Runs on the timeline's flush thread, and at flush()
        and close(): the training thread only appends to the log."""
        timer, log = self.timer, self._hook._log
        if timer is None or log is None:
            return []
        with self._drain_lock:
            offset = getattr(timer.clock, "offset", None)
            if log.flat and isinstance(offset, int):  # CPU clock: known at once, one pass
                return log.drain_wall(offset)
            for step, mode, spans in log.drain():
                timer.add_step(step, mode, spans)
            return list(timer.ready_steps(wait))

    def publish_timeline(self, wait: bool) -> None:
        if self.timeline is None:
            return
        for step, mode, spans in self.drain_timeline(wait):
            self.timeline.add_spans(spans, step=step, mode=mode)

    # --- flush and close --------------------------------------------------------------

    def flush(self, timeout: float | None) -> None:
        hook = self._hook
        if self.writer is not None and hook.failsafe.enabled:
            hook.failsafe.call(self.release_held)
            hook.failsafe.call(self.write_collections)
            if not self.writer.flush(timeout) and self.writer.in_outage:
                return  # the store is not answering: the timeline and monitor retry on their own threads
        if self.timeline is not None and hook.profiler_failsafe.enabled:
            hook.profiler_failsafe.call(self.publish_timeline, True)
            hook.profiler_failsafe.call(self.timeline.flush)
        if self.monitor is not None and hook.profiler_failsafe.enabled:
            hook.profiler_failsafe.call(self.monitor.flush)
        detailed = hook._counters.detailed
        if detailed is not None and hook.profiler_failsafe.enabled:
            # The traces of the windows that have ended (their export runs on the windows'
            # publisher thread): after fit / validate / test, the stage's traces are there.
            hook.profiler_failsafe.call(detailed.flush, timeout)

    def close_timeout_s(self) -> float:
        if self.writer is not None:
            return self.writer.close_timeout_s
        try:
            return close_timeout_from_env()
        except Exception:  # noqa: BLE001 - closing never raises; the hook's start said what was wrong
            return 60.0

    def _part_closer(self, part: Any, deadline: Deadline) -> Callable[[], None]:
        """What closes one of the background parts (the monitor has only stop())."""
        failsafe = self._hook.profiler_failsafe

        def close() -> None:
            method = getattr(part, "close", None)
            if method is not None:
                failsafe.call(method)
            else:
                failsafe.call(part.stop, timeout_s=deadline.left() / 2)

        return close

    def close(self, deadline: Deadline) -> None:
        """Everything after the open step ended: the parts that need nothing from the writer
        close on threads of their own while the writer closes; then the claim, the windowed
        profilers, the evidence note and the outputs, all within `deadline`."""
        hook = self._hook
        counters = hook._counters
        parts: dict[str, Any] = {}
        hook.profiler_failsafe.call(self.publish_timeline, True)
        for name, part in (("step timeline", self.timeline), ("system monitor", self.monitor), ("stop poller", self.stop_poller)):
            if part is not None:
                parts[name] = start_within(self._part_closer(part, deadline), name)
        if self.writer is not None:
            # The held steps (losses and metrics of up to HOLD_STEPS ended steps) were saved
            # before whatever turned the hook off: they go to the writer even after a
            # failure, as do the collections that name them (a failed writer drops them).
            for name, part in (("hand over its held steps", self.close_held), ("write its collections", self.write_collections)):
                try:
                    part()
                except Exception as exc:  # noqa: BLE001 - closing never raises; the failure is already recorded
                    logger.warning("stepscope: could not %s: %s", name, exc)
            # Only rank 0 marks the job finished; other workers just flush.
            self.writer.close(end_marker=hook.rank == 0, deadline=deadline.earlier(min(_AFTER_WRITER_S, deadline.seconds / 10)))
        if self.claim is not None:  # (also after a failure: the worker is free again)
            parts["run claim"] = start_within(self.claim.release, "run claim")
        if counters.detailed is not None:
            hook.profiler_failsafe.call(counters.detailed.close, deadline)
        annotation.clear_sink(self.annotation_span)
        if self.writer is not None and hook.rank == 0:
            # (Its failure to reach the store is a warning, not the hook's failure.)
            note = parts["evidence note"] = start_within(self._say_if_too_little_saved, "evidence note")
            finish_within(note, deadline)  # before the report, which reads it
        if self.outputs is not None:
            outputs, store, writer, step = self.outputs, self.store, self.writer, int(counters.global_step)
            # After the end marker: the report reads the whole job.
            parts["cost file"] = start_within(lambda: outputs.close(store, writer, step), "cost file")
        unfinished = [name for name, thread in parts.items() if not finish_within(thread, deadline)]
        if unfinished:
            logger.error(
                "stepscope: close() reached its %g s deadline (%s) with the %s not finished: what they still held is lost",
                deadline.seconds, CLOSE_TIMEOUT_ENV, ", ".join(unfinished),
            )

    def _say_if_too_little_saved(self) -> None:
        """One line, and the worker's status file, when the job saved less than the default
        rules need to judge it (stepscope.capture.evidence)."""
        hook = self._hook
        if self.saved is None or self.store is None:
            return
        shortfall = self.saved.shortfall(gradients="gradients" in hook._saver.included_names)
        if shortfall is None:
            return
        logger.warning("stepscope: %s", shortfall)
        # Its own status file: the worker's (a failure, if any) must stay as it is.
        write_status(self.store, f"{hook.worker}_evidence", {"state": TOO_LITTLE_DATA, "message": shortfall, **self.saved.to_json()})


__all__ = ["HookRuntime"]
