"""The step driver: opens and closes steps, counts them per mode, says which collections are
due, times their phases into the phase log, and hands a closed step to the writer.

It owns the per-step state (`StepCounters`) and the phase-record format (`PhaseLog`'s
records): the only part a compiled plugin mirrors (stepscope_torch's `_fastpath` does the
routine case of `_open_step`, `phase_event` and `finish_step_timing` itself and hands every
other case to these methods). So it is the hook's base class rather than an object the
hook calls: its hot path must stay one frame of plain attribute reads on the hook, which
is most of what a step where nothing is due costs (bench/bench_torch_hook.py)."""

from __future__ import annotations

import contextlib
import time
import types
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from ..config import ROUTINE_COLLECTIONS, Collection
from ..exceptions import ConfigError
from ..modes import ModeKeys
from .phases import EVENT_CODES, EVENT_OF_CODE, EVENTS, OTHER, PHASE_CODES, PHASES, Clock, PhaseLog
from .step_counters import StepCounters

_NOTHING_DUE: frozenset[str] = frozenset()
_NOTHING_RECORDED: Mapping[str, Any] = types.MappingProxyType({})  # what a step with nothing due holds
_perf_counter = time.perf_counter
_event_code = EVENT_CODES.get  # one call, where `EVENT_CODES.get(...)` is a lookup and a call
_TRAIN = ModeKeys.TRAIN
_OTHER_CODE = PHASE_CODES[OTHER]
# Collections of scalars (losses, metrics, and the default collection, which holds nothing
# at most steps): due at every step under the capture defaults. A step where only these are
# due is routine (config.ROUTINE_COLLECTIONS, as held_steps.py holds it): the cost meter
# samples it like a step where nothing is due instead of timing each one, as the compiled
# paths of the plugins do.
_SCALARS = ROUTINE_COLLECTIONS


# At most this many distinct sets of due collections keep one names object (_due_at).
_INTERNED_NAMES = 256


class _DueRun:
    """The same collections due at every mode step in [first, until) of one mode (losses
    and metrics under the capture defaults): `_due_at` answers from it without asking
    each collection's schedule."""

    __slots__ = ("first", "until", "due", "names")

    def __init__(self, first: int, until: float, due: tuple[Collection, ...], names: frozenset[str]) -> None:
        self.first, self.until, self.due, self.names = first, until, due, names


class StepState:
    """The open step: its numbers and the collections due at it, and what was recorded.
    (A slotted class: one is made per step, on the training thread. A step where nothing
    is due shares empty read-only tables; `make_due` gives it its own.)"""

    __slots__ = ("global_step", "mode", "mode_step", "due", "due_names", "tensors", "shapes")

    def __init__(self, global_step: int, mode: ModeKeys, mode_step: int, due: tuple[Collection, ...] = (), due_names: frozenset[str] = _NOTHING_DUE):
        self.global_step = global_step
        self.mode = mode
        self.mode_step = mode_step
        self.due = due
        self.due_names = due_names
        self.tensors: dict[str, Any] = {} if due else _NOTHING_RECORDED  # type: ignore[assignment]
        self.shapes: dict[str, Sequence[int]] = {} if due else _NOTHING_RECORDED  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"StepState(global_step={self.global_step}, mode={self.mode.name}, mode_step={self.mode_step}, due={sorted(self.due_names)})"


class IdleStep(StepState):
    """The open step when nothing is due at it: one object shared by all such steps, whose
    numbers are read from the counters (the open step is the last one begun), so that a
    step where nothing is due makes no object and writes no number into one."""

    __slots__ = ("_counters",)

    def __init__(self, counters: StepCounters) -> None:
        self._counters = counters
        self.due, self.due_names = (), _NOTHING_DUE
        self.tensors = self.shapes = _NOTHING_RECORDED  # type: ignore[assignment]

    @property
    def global_step(self) -> int:  # type: ignore[override]
        return int(self._counters.global_step) - 1

    @property
    def mode(self) -> ModeKeys:  # type: ignore[override]
        return self._counters.mode

    @property
    def mode_step(self) -> int:  # type: ignore[override]
        counters = self._counters
        return int(counters.begun[counters.mode]) - 1


class _PhaseScope:
    """What `phase` returns: the phase has started; leaving a `with` block over it moves
    the step to "other"."""

    def __init__(self, driver: StepDriver):
        self._driver = driver

    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        self._driver._enter_phase(OTHER)


class StepDriver:
    """The steps of a hook. What it reads of the hook: `failsafe` and `profiler_failsafe`,
    `enabled`, `writes_tensors`, `_meter` (the cost meter, or None), `_off_mode`, `_stop`
    (whose poller runs once the hook started), and the plugin's
    `_on_step_begin` / `_on_step_end` / `_on_phase_event`; `_collections_for(mode)` (the
    collections a step of `mode` may save) and `_hand_over(step)` (a closed step's tensors
    to the writer). `_counters` and `_log` are its own."""

    # (`_counters` is read every step, so a slot: CPython reads one faster than a __dict__ entry.)
    __slots__ = ("__dict__", "__weakref__", "_counters")
    _counters: StepCounters
    _log: PhaseLog | None
    _stop: Any  # the hook's StopCoordinator
    _meter: Any
    _off_mode: ModeKeys | None
    failsafe: Any
    profiler_failsafe: Any
    writes_tensors: bool
    # The phase events (`phases.EVENT_CODES`) the plugin's `_on_phase_event` acts on; None:
    # all. An event that opens a step is passed on only when it is one of them.
    _plugin_events: frozenset[int] | None = None

    def _on_step_begin(self, due: bool) -> None: ...

    def _on_step_end(self) -> None: ...

    def _on_phase_event(self, event: str) -> None: ...

    def _collections_for(self, mode: ModeKeys) -> tuple[Collection, ...]:
        raise NotImplementedError

    def _hand_over(self, step: StepState) -> None:
        raise NotImplementedError

    def _decide_stop(self, n: int) -> bool:
        raise NotImplementedError

    def _raise_stop(self) -> None:
        raise NotImplementedError

    # --- the phase log ------------------------------------------------------------------

    def _use_log(self, clock: Clock) -> PhaseLog:
        """A new phase log for `clock`'s tokens (flat ints for a CPU clock), the one the hot
        paths append to from now on."""
        counters = self._counters
        flat = getattr(clock, "int_tokens", False)
        log = self._log = PhaseLog(flat=flat, words=counters.log_words() if flat else None)
        counters.log_append = log.append  # (what a compiled hot path appends with)
        return log

    # --- state --------------------------------------------------------------------------

    @property
    def global_step(self) -> int:
        """The global step (all modes counted together) of the open step; between steps,
        the number the next step will get. The first step is 0."""
        counters = self._counters
        step = counters.step
        return int(step.global_step if step is not None else counters.global_step)

    @property
    def mode(self) -> ModeKeys:
        """The mode of the open step, else of the last one."""
        return self._counters.mode

    def mode_step(self, mode: ModeKeys | str) -> int:
        """How many steps of `mode` were opened so far."""
        return int(self._counters.begun[ModeKeys.parse(mode)])

    @property
    def current_step(self) -> StepState | None:
        """The open step (None between steps). Steps where nothing is due share one state
        object, renumbered at each of them: read it, do not keep it."""
        return self._counters.step

    @property
    def due(self) -> bool:
        """Whether some collection is due at the open step."""
        step = self._counters.step
        return step is not None and bool(step.due)

    def is_due(self, collection: str) -> bool:
        step = self._counters.step
        return step is not None and collection in step.due_names

    # --- opening and closing steps ------------------------------------------------------

    def begin_step(self, mode: ModeKeys | str | None = None, event: str | None = None, *, phase: str = OTHER) -> bool:
        """Open the next step in `mode` (default: the current mode), closing the open one.
        On the timeline the wait since the previous step ended is this step's "data"
        phase, and its own work starts now: with `event`, in the phase that event starts
        (as `phase_event(event)` would, one call less on every step), else in `phase`
        ("other" unless said; `hook.phase(...)` moves it on). Returns True when some
        collection is due at it."""
        if mode is None:
            mode = self._counters.mode
        elif mode.__class__ is not ModeKeys:
            mode = ModeKeys.parse(mode)
        code = None
        if event is not None:
            code = _event_code(event)
            if code is None:
                raise ConfigError(f"unknown phase event {event!r}; events: {', '.join(EVENTS)}")
        phase_code = PHASE_CODES.get(phase)
        if phase_code is None:
            raise ConfigError(f"begin_step: unknown phase {phase!r}; phases: {', '.join(PHASES)}")
        return self._open_step(mode, code, phase_code)

    def _open_step(self, mode: ModeKeys, code: int | None, phase_code: int = _OTHER_CODE) -> bool:
        """begin_step with its arguments checked: `code` is the event's code in
        `phases.EVENT_CODES`, or None (then the step's work starts in the phase of
        `phase_code`). A plugin whose hot path opens steps calls this directly (one check
        and one lookup less a step)."""
        # This runs every step: on a step where nothing is due it is most of the step's
        # cost in core (bench/bench_torch_hook.py), so it is one frame of plain attribute
        # reads, and what only steps that save need stays off its path.
        c = self._counters
        if c.closed or not self.failsafe.enabled:  # (a writer failure turns the fail-safe off)
            if not c.closed and self._stop.poller is not None:
                # Off after a failure: end_step still counts TRAIN steps for the ranks' agreement.
                self._off_mode = mode
            return False
        # The cost meter times only the steps that begin a block of steps (every
        # BLOCK_STEPS steps, and the steps around one that saves): it counts the others
        # at the block's end with the cost measured at its first (cost.py).
        meter = self._meter
        timed = slow = False  # (`started` is set where `timed` is)
        try:  # what FailSafe.call does, without its frame: nothing escapes into training
            clock_now, now = c.now, None
            if clock_now is not None:
                try:
                    now = clock_now()
                except Exception as exc:
                    self._timeline_failed(exc)
            previous = c.step
            if previous is not None:
                if previous is not c.idle and (previous.due or previous.tensors or previous.shapes):
                    # (A step that saved only scalars is routine: timed when a block begins.)
                    if meter is not None and not previous.due_names <= _SCALARS:
                        slow = True
                        started, timed = _perf_counter(), True
                        meter.depth = 1
                    self._end_step()
                else:  # what _end_step does for a step that saved nothing, without its frame
                    if c.notify:
                        self._on_step_end()
                    if c.timing:
                        self.finish_step_timing()
            c.mode = mode
            begun = c.begun
            mode_step = begun[mode]
            begun[mode] = mode_step + 1
            global_step = c.global_step
            c.global_step = global_step + 1
            if global_step >= c.meter_at and meter is not None and not timed:
                started, timed = _perf_counter(), True
                meter.depth = 1
            next_due = c.next_due[mode]
            # Most steps save nothing: compare with the next due step instead of asking every
            # collection's schedule.
            if next_due is not None and mode_step >= next_due and self.writes_tensors and (run := self._due_at(mode, mode_step)) is not None:
                due, names = run
                if meter is not None and not names <= _SCALARS:
                    # Never an idle step, also where a block begins here (timed already):
                    # its begin would stand for every untimed step after it.
                    slow = True
                    if not timed:
                        started, timed = _perf_counter(), True
                        meter.depth = 1
                step = c.step = StepState(global_step, mode, mode_step, due, names)
            else:
                due = ()
                # Steps where nothing is due share one state object, numbered by the
                # counters (making an object costs a quarter of such a step).
                step = c.step = c.idle
            if now is not None and self.profiler_failsafe.enabled:
                # A step's time starts where the previous one's work ended: the wait for data
                # in between is this step's "data" phase.
                last_end = c.last_end
                begin = now if last_end is None else last_end
                log = self._log
                try:
                    if code is None:
                        log.begin(global_step, mode, begin)  # type: ignore[union-attr]
                        log.enter(phase_code, now)  # type: ignore[union-attr] # the batch is here: "data" ends
                    else:  # one record for both
                        log.begin(global_step, mode, begin, code, now)  # type: ignore[union-attr]
                    c.timing = True
                except Exception as exc:
                    self._timeline_failed(exc)
            if c.detailed is not None:
                self.profiler_failsafe.call(c.detailed.step_started, global_step)
            if not due:
                if c.notify:
                    self._on_step_begin(False)
                return False
            self._on_step_begin(True)
            if code is not None and c.step is step and (self._plugin_events is None or code in self._plugin_events):
                self.failsafe.call(self._on_phase_event, EVENT_OF_CODE[code])
            return True
        except Exception as exc:
            self.failsafe.fail(exc)
            return False
        finally:
            if timed:
                meter.depth = 0
                self._meter_block(c.global_step - 1, started, _perf_counter() - started, not slow)

    def _meter_block(self, step: int, started: float, elapsed: float, idle: bool) -> None:
        """The cost meter's account at a step it timed (`started`, `elapsed`: perf_counter
        seconds of its begin; `idle`: nothing was due and nothing ended), and when it times
        the next one. (A compiled plugin calls this at the steps it times itself.)"""
        self._counters.meter_at = step + self._meter.steps_begin(step, started, elapsed, idle)
        if self._log is not None:
            self._log.bound()  # (a log nothing drains must not grow without end)

    def _due_at(self, mode: ModeKeys, mode_step: int) -> tuple[tuple[Collection, ...], frozenset[str]] | None:
        """(The collections due at `mode_step` of `mode`, their names), None when none is;
        sets when the next one is due."""
        runs: dict[ModeKeys, _DueRun] = self.__dict__.setdefault("_due_runs", {})
        run = runs.get(mode)
        if run is not None and run.first <= mode_step < run.until:
            self._counters.next_due[mode] = mode_step + 1
            return run.due, run.names
        candidates = self._collections_for(mode)
        # with_defaults gave every included collection a save_config.
        configs = [c.save_config.for_mode(mode) for c in candidates]  # type: ignore[union-attr]
        due = tuple(c for c, config in zip(candidates, configs) if config.should_save(mode_step))
        first = mode_step + 1
        nexts = [config.next_save_step(first) for config in configs]
        upcoming = [n for n in nexts if n is not None]
        self._counters.next_due[mode] = min(upcoming) if upcoming else None
        # From the next step on, the collections saved at every step (interval 1) are due
        # alone until another one is due or one of them ends.
        every = [
            config.save_interval == 1 and config.start_step <= first and (config.end_step is None or config.end_step > first)
            for config in configs
        ]
        if any(every):
            bounds = [config.end_step if each else n for config, n, each in zip(configs, nexts, every)]
            until = min([float("inf"), *(n for n in bounds if n is not None)])
            running = tuple(c for c, each in zip(candidates, every) if each)
            runs[mode] = _DueRun(first, until, running, self._names_of(running))
        else:
            runs.pop(mode, None)
        return (due, self._names_of(due)) if due else None

    def _names_of(self, due: tuple[Collection, ...]) -> frozenset[str]:
        """The names of `due`, as one object per set of names: what is learned at a step is
        keyed by it (a loss's plan, the compiled scalar steps of stepscope_torch), so the next
        step due the same collections (the next save step; the loss alone again, after
        one) finds it rather than learning it again."""
        names = frozenset(c.name for c in due)
        interned: dict[frozenset[str], frozenset[str]] = self.__dict__.setdefault("_due_names", {})
        known = interned.get(names)
        if known is None:
            known = names
            if len(interned) < _INTERNED_NAMES:
                interned[names] = names
        return known

    def end_step(self, *, raise_on_stop: bool = True) -> None:
        """Close the open step: its timeline ends now and what it saved goes to the writer.
        After a rule asked to stop, raises StopTrainingRequested once at the end of a TRAIN
        step (unless `raise_on_stop` is False: callbacks stop through their framework)."""
        counters = self._counters
        step = counters.step
        mode = self._off_mode or (step.mode if step is not None else None)
        self._off_mode = None
        if self.enabled:  # type: ignore[attr-defined]
            try:  # what FailSafe.call does, without its frame (this runs every step)
                self._end_step()
            except Exception as exc:
                self.failsafe.fail(exc)
        if raise_on_stop and mode is _TRAIN:
            n = counters.train_ends + 1  # train_step_ended(), inlined: this runs every step
            counters.train_ends = n
            if n >= counters.stop_check_at and self._decide_stop(n):
                self._raise_stop()

    def train_step_ended(self) -> bool:
        """Count one ended TRAIN step and say whether training stops now. Plugins call it
        at every TRAIN step end on every rank, also when the hook is disabled (the ranks'
        counts must stay equal). Costs an integer comparison except at decision steps."""
        counters = self._counters
        n = counters.train_ends + 1
        counters.train_ends = n
        return n >= counters.stop_check_at and self._decide_stop(n)

    @contextlib.contextmanager
    def step(self, mode: ModeKeys | str = ModeKeys.TRAIN) -> Iterator[Any]:
        """`with hook.step("train"):` around one step of a hand-written loop."""
        self.begin_step(mode)
        try:
            yield self
        finally:
            self.end_step()

    def _end_step(self) -> None:
        c = self._counters
        step = c.step
        if step is None:
            return
        self._on_step_end()
        if c.detailed is not None:
            self.profiler_failsafe.call(c.detailed.step_ended, step.global_step)
        if c.timing:
            self.finish_step_timing()
        c.step = None
        if step.tensors or step.shapes:
            self._hand_over(step)

    def make_due(self, *collections: str) -> None:
        """Make `collections` due at the open step whatever their schedule (e.g. metrics a
        framework reduces at the end of an evaluation loop, saved in its last step)."""
        counters = self._counters
        step = counters.step
        if step is None:
            return
        extra = tuple(c for c in self._collections_for(ModeKeys.TRAIN) if c.name in collections and c.name not in step.due_names)
        if extra:
            if step is counters.idle:  # the shared state of steps where nothing is due
                step = counters.step = StepState(step.global_step, step.mode, step.mode_step)
            if not step.due:
                step.tensors, step.shapes = {}, {}
            step.due = step.due + extra
            step.due_names = step.due_names | {c.name for c in extra}

    # --- phases -------------------------------------------------------------------------

    def phase(self, name: str) -> _PhaseScope:
        """Start phase `name` ("data", "forward", "backward", "optimizer", "compute",
        "other") of the open step now; as `with hook.phase("forward"):` the step moves to
        "other" when the block ends. The phases of a step tile it on the timeline."""
        if name not in PHASES:
            raise ConfigError(f"phase: unknown phase {name!r}; phases: {', '.join(PHASES)}")
        self._enter_phase(name)
        return _PhaseScope(self)

    def phase_event(self, event: str) -> None:
        """A framework event (see `stepscope.capture.phases.EVENTS`) moves the step to the
        phase that `phases.TRANSITIONS` gives; on a step where something is due the plugin
        also saves what the event makes available (gradients before the update)."""
        # The hot path of every step: plain attribute reads, no wrappers on steps where
        # nothing is due (a phase event is a clock reading and a record; the table is
        # applied when the log is drained, off the training thread).
        c = self._counters
        step = c.step
        if step is None or not self.failsafe.enabled:
            return
        if c.timing:
            code = _event_code(event)
            if code is None:
                raise ConfigError(f"unknown phase event {event!r}; events: {', '.join(EVENTS)}")
            self._log_event(code)
        if step.due:
            self.failsafe.call(self._on_phase_event, event)

    def finish_step_timing(self) -> None:
        """The open step's work is over (e.g. the optimizer stepped): its timeline ends
        now, though values may still be saved into it until `end_step`."""
        c = self._counters
        if c.timing:
            try:
                token = c.now()
                self._log.end(token)  # type: ignore[union-attr]
            except Exception as exc:
                self._timeline_failed(exc)
                return
            c.last_end = token
            c.timing = False

    def _enter_phase(self, name: str) -> None:
        c = self._counters
        if c.timing and self.enabled:  # type: ignore[attr-defined]
            try:
                self._log.enter(name, c.now())  # type: ignore[union-attr]
            except Exception as exc:
                self._timeline_failed(exc)

    def _log_event(self, code: int) -> None:
        """(event code, now) to the open step's timeline (`code`: phases.EVENT_CODES)."""
        c = self._counters
        try:
            self._log.event(code, c.now())  # type: ignore[union-attr]
        except Exception as exc:
            self._timeline_failed(exc)

    def _timeline_failed(self, exc: Exception) -> None:
        """The step timeline's clock or log failed: the profiler side turns itself off (its
        fail-safe logs why and records it in stepscope-status/), tensors go on. (Every
        hot path's append is guarded so: a clock is framework code, a GPU's may fail.)"""
        c = self._counters
        c.timing = False
        c.now = None  # no more readings: the timeline stops here
        self.profiler_failsafe.fail(exc)

    # --- checkpoints ----------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """The step counters, for a framework checkpoint: a run resumed from it continues
        the numbering instead of writing over the earlier run's steps."""
        counters = self._counters
        return {"global_step": int(counters.global_step), "mode_steps": {m.name: int(counters.begun[m]) for m in ModeKeys}}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue the step numbering saved by `state_dict` (between steps)."""
        try:
            global_step = int(state["global_step"])
            mode_steps = {ModeKeys.parse(m): int(n) for m, n in dict(state.get("mode_steps") or {}).items()}
        except (KeyError, TypeError, ValueError) as exc:
            raise ConfigError(f"load_state_dict: not a stepscope hook state ({exc!r}): {state!r}") from None
        if global_step < 0 or any(n < 0 for n in mode_steps.values()):
            raise ConfigError(f"load_state_dict: step counters must be >= 0, got {state!r}")
        counters = self._counters
        if counters.step is not None:
            self._end_step()
        self._resumed()
        counters.global_step = global_step
        for mode in ModeKeys:
            counters.begun[mode] = mode_steps.get(mode, counters.begun[mode])
            counters.next_due[mode] = 0 if self.writes_tensors else None  # (asked again at the next step)

    def _resumed(self) -> None:
        """This run continues an earlier run's numbering (load_state_dict)."""


__all__ = ["IdleStep", "StepDriver", "StepState"]
