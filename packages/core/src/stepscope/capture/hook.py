"""`HookBase`: the one contract between core and a framework plugin.

It implements the whole public surface of a stepscope hook once: options, collections,
modes, steps and phases (`begin_step` / `end_step` / `phase`), `save_tensor` /
`save_scalar` / `save_loss`, `from_json`, `flush` / `close`, the context manager,
`enabled`, `global_step`, stop requests, the fail-safe, the system monitor and the step
timeline. A plugin subclasses it and fills in only what needs its framework:

- `framework` and `builtin_regexes` (class attributes): its name, and the regexes of the
  built-in collections over its tensor names;
- `_detect_rank()`: (rank, world size, local rank);
- `_capture(plan, value)`: copy one framework tensor (or its reductions) to host and
  `record` it; return False for values that are not its framework's (core saves those);
- `_on_step_begin(due)` / `_on_step_end()`: arm and read its captures around a step
  (with `notify_every_step = False`, only around steps where something is due);
- `_make_clock()`: a clock for the step timeline (a GPU plugin reads device events);
- `_make_counters()`: the object that holds the per-step state (`step_counters.py`; a
  plugin with a compiled hot path returns its compiled one, of the same fields);
- `_on_close()`: remove what it installed in the framework;
- `_can_agree_on_stop()` / `_agree_on_stop(local)`: for multi-rank jobs with collectives,
  make every rank stop at the same TRAIN step (default: each rank decides alone);
and calls the driver (`begin_step`, `phase_event`, `finish_step_timing`, `end_step`)
from its framework's events (`_open_step(mode, event code)`: begin_step without the
checks, for a hot path). Tensors the plugin discovers go through `plan` + `record`.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import threading
import time
import types
import weakref
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from .. import layout, reductions
from ..config import (
    ALWAYS_SAVED_COLLECTIONS,
    SCALARS_SAVE_CONFIG,
    TRAIN_ONLY_COLLECTIONS,
    Collection,
    CollectionName,
    ProfilerConfig,
    ReductionConfig,
    SaveConfig,
    default_save_config,
)
from ..exceptions import ConfigError, StepscopeError, UnsupportedValue
from ..modes import ModeKeys
from ..store import Store, open_store
from . import annotation
from .collection_manager import CollectionManager
from .control import StopPoller
from .deadline import CLOSE_TIMEOUT_ENV, Deadline, close_timeout_from_env, exit_deadline, finish_within, start_within
from .evidence import TOO_LITTLE_DATA, SavedEvidence
from .hook_options import HookOptions, name_tuple
from .hook_outputs import HookOutputs, instrument
from .job_claim import WriterClaim
from .phases import (
    EVENT_CODES,
    EVENT_OF_CODE,
    EVENTS,
    OTHER,
    PHASE_CODES,
    PHASE_ENTER_RECORD,
    PHASES,
    STEP_BEGIN_EVENT_RECORD,
    STEP_BEGIN_RECORD,
    STEP_END_RECORD,
    Clock,
    CpuClock,
    PhaseLog,
    StepTimer,
)
from .safety import FailSafe, write_status
from .scopes import Scope, make_scope, merge_scope
from .step_counters import NEVER, StepCounters
from .writer import Writer

logger = logging.getLogger("stepscope")

STOP_POLL_ENV = "STEPSCOPE_STOP_POLL_S"
STOP_AGREE_ENV = "STEPSCOPE_STOP_AGREE_STEPS"
_SAVEABLE_KINDS = frozenset("biuf")  # numpy dtype kinds the record format holds
_NOTHING_DUE: frozenset[str] = frozenset()
_NOTHING_RECORDED: Mapping[str, Any] = types.MappingProxyType({})  # what a step with nothing due holds
_perf_counter = time.perf_counter
_event_code = EVENT_CODES.get  # one call, where `EVENT_CODES.get(...)` is a lookup and a call
_TRAIN = ModeKeys.TRAIN
_AFTER_WRITER_S = 2.0  # of close()'s deadline, the most kept for the cost file (written after the writer)
# PhaseLog record kinds (appended directly: the log's methods would cost a call each).
_BEGIN, _ENTER, _END, _BEGIN_EVENT = STEP_BEGIN_RECORD, PHASE_ENTER_RECORD, STEP_END_RECORD, STEP_BEGIN_EVENT_RECORD
_OTHER_CODE = PHASE_CODES[OTHER]


class StopTrainingRequested(StepscopeError, RuntimeError):
    """Raised by a plain-loop hook at the end of a TRAIN step after a rule asked to stop
    (callbacks stop through their framework instead: `trainer.should_stop`,
    `model.stop_training`)."""


def _poll_interval_from_env() -> float:
    """How often hooks look for a stop request: $STEPSCOPE_STOP_POLL_S seconds, default 2
    (one stat or HEAD request per interval, off the training thread)."""
    raw = os.environ.get(STOP_POLL_ENV, "2.0")
    try:
        value = float(raw)
    except ValueError:
        raise ConfigError(f"{STOP_POLL_ENV} must be a number of seconds, got {raw!r}") from None
    if not value > 0:
        raise ConfigError(f"{STOP_POLL_ENV} must be > 0, got {raw!r}")
    return value


def _agree_steps_from_env() -> int:
    """Every how many TRAIN steps the ranks of a multi-rank job agree on stopping:
    $STEPSCOPE_STOP_AGREE_STEPS, default 8 (one one-integer all-reduce per interval)."""
    raw = os.environ.get(STOP_AGREE_ENV, "8")
    try:
        value = int(raw)
    except ValueError:
        raise ConfigError(f"{STOP_AGREE_ENV} must be a whole number of TRAIN steps, got {raw!r}") from None
    if value < 1:
        raise ConfigError(f"{STOP_AGREE_ENV} must be >= 1, got {raw!r}")
    return value


def env_rank() -> tuple[int, int, int]:
    """(rank, world size, local rank) from the RANK / WORLD_SIZE / LOCAL_RANK variables
    that torchrun, mpirun wrappers and SageMaker set."""
    try:
        return int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1)), int(os.environ.get("LOCAL_RANK", 0))
    except ValueError as exc:
        raise ConfigError(f"RANK / WORLD_SIZE / LOCAL_RANK must be integers: {exc}") from None


@dataclass(frozen=True)
class TensorPlan:
    """What to save of one tensor at the current step."""

    name: str
    save_raw: bool
    reductions: tuple[tuple[str, bool], ...]
    save_shape: bool


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


def _close_at_exit(ref: weakref.ref[HookBase]) -> None:
    hook = ref()
    if hook is not None:
        hook.close(deadline=exit_deadline().within(hook._close_timeout_s()))


class _PhaseScope:
    """What `HookBase.phase` returns: the phase has started; leaving a `with` block over it
    moves the step to "other"."""

    def __init__(self, hook: HookBase):
        self._hook = hook

    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        self._hook._enter_phase(OTHER)


class HookBase:
    """The public surface of every stepscope hook; see the module docstring for what a
    plugin adds. `HookBase(out_dir, save_config, ..., collections)` takes the options of
    `HookOptions` (by position or name) or one `HookOptions`."""

    framework: ClassVar[str] = "generic"
    builtin_regexes: ClassVar[Mapping[str, Sequence[str]]] = {}
    # Whether begin_step calls `_on_step_begin(False)` / `_on_step_end()` at steps where
    # nothing is due; a plugin with nothing to do there sets False (two calls less a step).
    notify_every_step: ClassVar[bool] = True
    # (Read every step, so a slot: CPython reads one faster than a __dict__ entry.)
    __slots__ = ("__dict__", "__weakref__", "_counters")

    def __init__(
        self,
        out_dir: str | os.PathLike[str] | HookOptions | None = None,
        *args: Any,
        rank: int | None = None,
        world_size: int | None = None,
        local_rank: int | None = None,
        control_poll_s: float | None = None,
        validate_only: bool = False,
        **options: Any,
    ):
        """`rank`/`world_size`/`local_rank` default to what the plugin detects;
        `control_poll_s` (default $STEPSCOPE_STOP_POLL_S, else 2) is how often stop requests
        are looked for. `validate_only` checks the options (out_dir included) and starts
        nothing: for callbacks that must fail at construction but start only once they know
        the rank."""
        self.options: HookOptions = HookOptions.of(out_dir, *args, **options)
        self.failsafe = FailSafe(f"{self.framework} hook")
        # The profiler side fails on its own: losing the timeline must not stop tensor saving.
        self.profiler_failsafe = FailSafe(f"{self.framework} profiler")
        opts = self.options
        # No save_config: the dense-then-sparse default, losses and metrics every step.
        self.save_config: SaveConfig = opts.save_config or default_save_config()
        self.reduction_config: ReductionConfig = opts.reduction_config or ReductionConfig()
        self.profiler_config: ProfilerConfig = opts.profiler_config or ProfilerConfig()
        detected = (0, 1, 0) if validate_only else self._detect_rank()
        self.rank = int(detected[0] if rank is None else rank)
        self.world_size = int(detected[1] if world_size is None else world_size)
        self.local_rank = int(detected[2] if local_rank is None else local_rank)
        self.worker = layout.worker_name(self.rank)
        self.writes_tensors = opts.include_workers == "all" or self.rank == 0
        self.num_workers = self.world_size if opts.include_workers == "all" else 1
        self.collections = self._collection_manager(opts)
        self.included: tuple[Collection, ...] = self._included(opts)
        self._included_names = frozenset(c.name for c in self.included)
        self._warned_collections: set[str] = set()
        self._matching_cache: dict[tuple[str, tuple[str, ...]], tuple[Collection, ...]] = {}
        self._model_names: set[str] = set()
        self._unsupported: dict[str, str] = {}  # tensor name -> why it is not saved (_drop_unsupported)
        self._module_classes: dict[str, str] = {}
        self._scopes: dict[str, Scope] = {}
        self._saved = SavedEvidence(self._included_collection_names("losses"), self._included_collection_names("gradients"))
        # What every step reads and changes: the open step, the step numbers, the timeline's
        # clock and log, the stop counters (step_counters.py; a plugin may compile it).
        counters = self._counters = self._make_counters()
        counters.idle = IdleStep(counters)
        self._stop_raised = False
        # Stop decisions: `train_ends` counts ended TRAIN steps; at `stop_check_at` the
        # hook decides (`_decide_stop`): alone, or with the other ranks every
        # `_stop_agree_steps` (`_stop_agree` is None until the first decision says which).
        self._stop_agree: bool | None = None
        self._stop_agreed = False
        self._stop_agree_next = 1  # the next agreement step (only the training thread sets it)
        self._off_mode: ModeKeys | None = None  # the mode of a step begun while the hook was off
        self._stop_agree_steps = 1 if validate_only else _agree_steps_from_env()
        if not self.writes_tensors:  # nothing is ever due
            for mode in ModeKeys:
                counters.next_due[mode] = None
        self.store: Store | None = None
        self.writer: Writer | None = None
        self.outputs: HookOutputs | None = None
        self.stop_poller: StopPoller | None = None
        self.monitor: Any = None
        self.timeline: Any = None
        # The step timeline on the training thread: a clock reading and a list extend per
        # boundary (`_log`, through counters.now / log_append); the flush thread turns the
        # log into spans (`_drain_timeline`).
        self._timer: StepTimer | None = None
        self._log: PhaseLog | None = None
        self._drain_lock = threading.Lock()
        self._meter: Any = None  # the cost meter begin_step feeds (hook_outputs.instrument; counters.meter_at)
        if validate_only:
            open_store(opts.out_dir)  # raises ConfigError when out_dir is a file; writes nothing
            counters.closed = True
            return
        # Close at interpreter exit if the user did not; the weak reference keeps atexit
        # from holding the hook (and the model it watches) alive.
        self._at_exit = lambda ref=weakref.ref(self): _close_at_exit(ref)
        atexit.register(self._at_exit)
        if not self.failsafe.enabled:  # STEPSCOPE_DISABLE
            return
        self.store = open_store(opts.out_dir)  # raises ConfigError when out_dir is a file
        store = self.store
        self.failsafe._on_failure = lambda status: write_status(store, self.worker, status)
        self.profiler_failsafe._on_failure = lambda status: write_status(store, f"{self.worker}_profiler", status)
        self._claim: WriterClaim | None = None
        if self.writes_tensors:
            self._claim = self._claim_worker(store)
            self.writer = Writer(store, self.worker)
            # atexit runs the last registered first: the hook's close (which writes the end
            # marker through the writer) must come before the writer's own exit handler,
            # which closes the writer without one.
            atexit.unregister(self._at_exit)
            atexit.register(self._at_exit)
            self._write_collections()
        # Live TensorBoard, the report at close, and stepscope's own cost (hook_outputs).
        self.outputs = HookOutputs(self.worker, tensorboard_dir=opts.tensorboard_dir, report=opts.report, several_workers=self.num_workers > 1, chief=self.rank == 0)
        self.failsafe.call(self.outputs.attach, self.writer)
        instrument(self, self.outputs)
        self.stop_poller = StopPoller(store, control_poll_s or _poll_interval_from_env(), on_request=self._on_stop_request)
        self.profiler_failsafe.call(self._start_profiler)

    def _claim_worker(self, store: Store) -> WriterClaim | None:
        """One writer per worker of a job folder (job_claim.py): a live holder is refused
        here, with the hook left closed; a claim that cannot be written only warns."""
        try:
            return WriterClaim.claim(store, self.worker)
        except ConfigError:
            self._counters.closed = True
            atexit.unregister(self._at_exit)
            raise
        except Exception as exc:  # noqa: BLE001 - the claim is a safeguard; saving can go on without it
            logger.warning("stepscope: could not record this run's claim on %s: %s", store.describe(), exc)
            return None

    # --- what a plugin supplies -------------------------------------------------------

    def _detect_rank(self) -> tuple[int, int, int]:
        return env_rank()

    def _capture(self, plan: TensorPlan, value: Any) -> bool:
        """Record `value` (a framework tensor) for `plan`; False: not a framework value."""
        return False

    def _is_framework_value(self, value: Any) -> bool:
        """Whether `value` is a tensor of this plugin's framework (checked by `_capture`)."""
        return False

    def _on_step_begin(self, due: bool) -> None:
        """The step `self.current_step` opened; `due`: some collection is due at it."""

    def _on_step_end(self) -> None:
        """The open step is about to be handed to the writer: record what is left."""

    def _on_phase_event(self, event: str) -> None:
        """A phase event on a step where something is due (see `phase_event`)."""

    def _make_detailed_profilers(self) -> Any:
        """The framework's windowed profilers (stepscope.profiler.detailed.WindowedProfilers)
        for `profiler_config`'s windows, or None (no windows, or no framework profiler)."""
        return None

    def _make_clock(self) -> Clock:
        return CpuClock()

    def _make_counters(self) -> StepCounters:
        """The object that holds the per-step state (step_counters.py): a plugin with a
        compiled hot path returns its compiled counters, of the same fields."""
        return StepCounters(self.failsafe, self.profiler_failsafe, self.notify_every_step)

    def _on_close(self) -> None:
        """Remove what the plugin installed in the framework."""

    def _can_agree_on_stop(self) -> bool:
        """Whether this rank's peers can agree on stopping through a collective (asked once,
        at the end of the first TRAIN step; the answer must be the same on every rank)."""
        return False

    def _agree_on_stop(self, local: bool) -> bool:
        """Whether the job stops now, given this rank's own view `local`: True on every rank
        when any rank saw a stop request. Runs on every rank at the same TRAIN steps (every
        `$STEPSCOPE_STOP_AGREE_STEPS`), only when `_can_agree_on_stop()`."""
        return local

    # --- options ------------------------------------------------------------------------

    @classmethod
    def from_json(cls, path: str | os.PathLike[str] | None = None, **overrides: Any) -> Any:
        """A hook configured by smdebug's hook JSON (`debughookconfig.json`); without `path`,
        the file named by $STEPSCOPE_HOOK_CONFIG. Keyword arguments replace its options
        (and may give the plugin's own arguments)."""
        names = set(HookOptions.__dataclass_fields__)
        options = HookOptions.from_json(path, **{k: v for k, v in overrides.items() if k in names})
        return cls(options, **{k: v for k, v in overrides.items() if k not in names})

    @property
    def out_dir(self) -> str:
        return self.options.out_dir

    def _collection_manager(self, opts: HookOptions) -> CollectionManager:
        manager = CollectionManager(opts.collections, builtin_regexes=self.builtin_regexes)
        if opts.include_regex:
            manager.get(CollectionName.DEFAULT).include(*opts.include_regex)
        if opts.save_all:
            manager.get(CollectionName.ALL).include(".*")
        return manager

    def _included(self, opts: HookOptions) -> tuple[Collection, ...]:
        # "default" takes the user's own tensors (save_tensor) and include_regex: always there.
        names = [*opts.included_names(), *sorted(ALWAYS_SAVED_COLLECTIONS), CollectionName.DEFAULT]
        if opts.save_all:
            names.append(CollectionName.ALL)
        unknown = [n for n in names if n not in self.collections]
        if unknown:
            raise ConfigError(
                f"include_collections: unknown collection(s) {unknown}; known: {', '.join(self.collections.names())}"
                " (define others with collections=[Collection(...)])"
            )
        return tuple(
            self.collections.get(n).with_defaults(
                SCALARS_SAVE_CONFIG if opts.save_config is None and n in ALWAYS_SAVED_COLLECTIONS else self.save_config, self.reduction_config,
            )
            for n in dict.fromkeys(names)
        )

    # --- state --------------------------------------------------------------------------

    @property
    def enabled(self) -> bool:
        """False once stepscope is off for this hook: STEPSCOPE_DISABLE, a failure inside
        it (see the worker's file in stepscope-status/), or `close()`."""
        return self.failsafe.enabled and not self._counters.closed and not (self.writer is not None and self.writer.failed)

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
    def detailed(self) -> Any:
        """The windowed profilers (stepscope.profiler.detailed), None without windows."""
        return self._counters.detailed

    @property
    def stop_requested(self) -> bool:
        """True once a rule asked the job to stop (polled off the training thread). In a
        multi-rank job whose ranks agree on stopping, True from the TRAIN step at which all
        ranks agreed: the same step on every rank."""
        if self._stop_agree:
            return self._stop_agreed
        return self.stop_poller is not None and self.stop_poller.stop_requested

    def _on_stop_request(self) -> None:
        # The poller's thread: a rank deciding alone decides at the next TRAIN step end.
        if not self._stop_agree:
            self._counters.stop_check_at = 0

    def train_step_ended(self) -> bool:
        """Count one ended TRAIN step and say whether training stops now. Plugins call it
        at every TRAIN step end on every rank, also when the hook is disabled (the ranks'
        counts must stay equal). Costs an integer comparison except at decision steps."""
        counters = self._counters
        n = counters.train_ends + 1
        counters.train_ends = n
        return n >= counters.stop_check_at and self._decide_stop(n)

    def _decide_stop(self, n: int) -> bool:
        counters = self._counters
        if counters.closed or self.stop_poller is None:
            counters.stop_check_at = NEVER
            return False
        if self._stop_agree is None:
            try:
                self._stop_agree = bool(self._can_agree_on_stop())
            except Exception as exc:  # a broken detection: decide alone, as before
                logger.warning("stepscope: cannot agree on stopping with other ranks: %r", exc)
                self._stop_agree = False
        if not self._stop_agree:
            # Park first, then read: a request the poller sets in between lowers it again.
            counters.stop_check_at = NEVER
            if self.stop_poller.request is None:
                return False
        elif not self._stop_agreed:
            if n < self._stop_agree_next:  # woken early by the poller (it raced the first decision)
                counters.stop_check_at = self._stop_agree_next
                return False
            every = self._stop_agree_steps
            # The next multiple of `every`: the same TRAIN step on every rank.
            self._stop_agree_next = counters.stop_check_at = (n // every + 1) * every
            # Every rank runs this collective at the same step; a failure here (a peer gone)
            # is the job's failure and is not hidden.
            self._stop_agreed = bool(self._agree_on_stop(self.stop_poller.request is not None))
            if not self._stop_agreed:
                return False
        counters.stop_check_at = n + 1  # stopping: so at every following TRAIN step end too
        return True

    @property
    def due(self) -> bool:
        """Whether some collection is due at the open step."""
        step = self._counters.step
        return step is not None and bool(step.due)

    def is_due(self, collection: str) -> bool:
        step = self._counters.step
        return step is not None and collection in step.due_names

    # --- the step driver ----------------------------------------------------------------

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
            if not c.closed and self.stop_poller is not None:
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
                    slow = True
                    if meter is not None:
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
            next_due = c.next_due[mode]
            # Most steps save nothing: compare with the next due step instead of asking every
            # collection's schedule.
            if next_due is not None and mode_step >= next_due and self.writes_tensors and (due := self._due_at(mode, mode_step)):
                slow = True
                if meter is not None and not timed:
                    started, timed = _perf_counter(), True
                step = c.step = StepState(global_step, mode, mode_step, due, frozenset(collection.name for collection in due))
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
                append = c.log_append
                try:
                    if code is None:
                        append((_BEGIN, global_step, mode, begin))
                        append((_ENTER, phase_code, now))  # the batch is here: "data" ends
                    else:  # one record for both
                        append((_BEGIN_EVENT, global_step, mode, begin, code, now))
                    c.timing = True
                except Exception as exc:
                    self._timeline_failed(exc)
            if c.detailed is not None:
                self.profiler_failsafe.call(c.detailed.step_started, global_step)
            if not due:
                if c.notify:
                    self._on_step_begin(False)
                return False
            if meter is not None:
                meter.depth = 1
            self._on_step_begin(True)
            if code is not None and c.step is step:
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

    def _due_at(self, mode: ModeKeys, mode_step: int) -> tuple[Collection, ...]:
        """The collections due at `mode_step` of `mode`; sets when the next one is due."""
        candidates = self._collections_for(mode)
        # with_defaults gave every included collection a save_config.
        due = tuple(c for c in candidates if c.save_config.should_save(mode_step, mode))  # type: ignore[union-attr]
        upcoming = [n for n in (c.save_config.for_mode(mode).next_save_step(mode_step + 1) for c in candidates) if n is not None]  # type: ignore[union-attr]
        self._counters.next_due[mode] = min(upcoming) if upcoming else None
        return due

    def end_step(self, *, raise_on_stop: bool = True) -> None:
        """Close the open step: its timeline ends now and what it saved goes to the writer.
        After a rule asked to stop, raises StopTrainingRequested once at the end of a TRAIN
        step (unless `raise_on_stop` is False: callbacks stop through their framework)."""
        counters = self._counters
        step = counters.step
        mode = self._off_mode or (step.mode if step is not None else None)
        self._off_mode = None
        if self.enabled:
            self.failsafe.call(self._end_step)
        if raise_on_stop and mode is _TRAIN:
            n = counters.train_ends + 1  # train_step_ended(), inlined: this runs every step
            counters.train_ends = n
            if n >= counters.stop_check_at and self._decide_stop(n):
                self._raise_stop()

    @contextlib.contextmanager
    def step(self, mode: ModeKeys | str = ModeKeys.TRAIN) -> Iterator[HookBase]:
        """`with hook.step("train"):` around one step of a hand-written loop."""
        self.begin_step(mode)
        try:
            yield self
        finally:
            self.end_step()

    def phase(self, name: str) -> _PhaseScope:
        """Start phase `name` ("data", "forward", "backward", "optimizer", "compute",
        "other") of the open step now; as `with hook.phase("forward"):` the step moves to
        "other" when the block ends. The phases of a step tile it on the timeline."""
        if name not in PHASES:
            raise ConfigError(f"phase: unknown phase {name!r}; phases: {', '.join(PHASES)}")
        self._enter_phase(name)
        return _PhaseScope(self)

    def phase_event(self, event: str) -> None:
        """A framework event (see `stepscope.phases.EVENTS`) moves the step to the phase
        that `stepscope.phases.TRANSITIONS` gives; on a step where something is due the
        plugin also saves what the event makes available (gradients before the update)."""
        # The hot path of every step: plain attribute reads, no wrappers on steps where
        # nothing is due (a phase event is a clock reading and a list extend; the table
        # is applied when the log is drained, off the training thread).
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
                c.log_append((_END, token))
            except Exception as exc:
                self._timeline_failed(exc)
                return
            c.last_end = token
            c.timing = False

    def _enter_phase(self, name: str) -> None:
        c = self._counters
        if c.timing and self.enabled:
            try:
                c.log_append((_ENTER, PHASE_CODES[name], c.now()))
            except Exception as exc:
                self._timeline_failed(exc)

    def _log_event(self, code: int) -> None:
        """(event code, now) to the open step's timeline (`code`: phases.EVENT_CODES)."""
        c = self._counters
        try:
            c.log_append((code, c.now()))
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
        if (step.tensors or step.shapes) and self.writer is not None:
            self._saved.note(step.mode, step.tensors)
            self.writer.write_step(step.global_step, step.mode, step.mode_step, step.tensors, step.shapes)
            if self.writer.failed:
                self.failsafe.enabled = False

    def make_due(self, *collections: str) -> None:
        """Make `collections` due at the open step whatever their schedule (e.g. metrics a
        framework reduces at the end of an evaluation loop, saved in its last step)."""
        counters = self._counters
        step = counters.step
        if step is None:
            return
        extra = tuple(c for c in self.included if c.name in collections and c.name not in step.due_names)
        if extra:
            if step is counters.idle:  # the shared state of steps where nothing is due
                step = counters.step = StepState(step.global_step, step.mode, step.mode_step)
            if not step.due:
                step.tensors, step.shapes = {}, {}
            step.due = step.due + extra
            step.due_names = step.due_names | {c.name for c in extra}

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
        claim = getattr(self, "_claim", None)
        if claim is not None:  # this run continues the job's numbering: not a second training
            self.failsafe.call(claim.resumed)
        counters.global_step = global_step
        for mode in ModeKeys:
            counters.begun[mode] = mode_steps.get(mode, counters.begun[mode])
            counters.next_due[mode] = 0 if self.writes_tensors else None  # (asked again at the next step)

    def _raise_stop(self) -> None:
        """Raise StopTrainingRequested (once): `train_step_ended()` said to stop."""
        # A rank whose hook turned off stops too once the ranks agreed: alone, it would wait
        # for its stopped peers in the next all-reduce.
        if not self._stop_raised and (self.failsafe.enabled or self._stop_agree):
            self._stop_raised = True
            request = self.stop_poller.request if self.stop_poller is not None else None
            if request is None and self._stop_agree:
                request = {"action": "StopTraining", "reason": "another rank saw the request; all ranks agreed"}
            raise StopTrainingRequested(f"stepscope: a rule asked to stop training ({request})")

    def _collections_for(self, mode: ModeKeys) -> tuple[Collection, ...]:
        if mode == ModeKeys.TRAIN:
            return self.included
        return tuple(c for c in self.included if c.name not in TRAIN_ONLY_COLLECTIONS)

    # --- what is saved (plugin side) ------------------------------------------------------

    def claim_names(self, names: Iterable[str]) -> None:
        """Names of the model's own tensors: `save_tensor` refuses them (a user value must
        never silently replace a model tensor of the same name)."""
        self._model_names.update(names)

    def note_module_class(self, tensor_name: str, module_class: str) -> None:
        """The class of the module (layer) whose input/output `tensor_name` is: written in
        the collections metadata, so that rules recognise activations by type."""
        self._module_classes[tensor_name] = module_class

    def declare_scope(self, name: str, parameters: Iterable[str], *, kind: str = "model") -> None:
        """Record a scope: one network (`kind="model"`) or one optimizer's parameters
        (`kind="optimizer"`). `parameters` are the tensor names as the weights/biases
        collections save them (the gradient of P is saved as `gradient/P`). Rules that
        compare layers compare them only within a scope. Declaring a name again adds
        parameters. Bad input is logged with what was wrong and ignored: never raises."""
        try:
            scope = make_scope(name, parameters, kind)
            self._scopes[scope.name] = merge_scope(self._scopes.get(scope.name), scope)
        except ConfigError as exc:
            logger.warning("stepscope: declare_scope ignored: %s", exc)
        except Exception as exc:  # noqa: BLE001 - a bad iterable must not break training
            logger.warning("stepscope: declare_scope(%r) ignored: %s", name, exc)

    @property
    def scopes(self) -> tuple[Scope, ...]:
        """The scopes declared so far (see declare_scope)."""
        return tuple(self._scopes.values())

    def _matching(self, name: str, collections: tuple[str, ...]) -> tuple[Collection, ...]:
        key = (name, collections)
        found = self._matching_cache.get(key)
        if found is None:
            found = tuple(c for c in self.included if c.name in collections or c.matches(name))
            self._matching_cache[key] = found
            for c in found:
                c.add_tensor_name(name)
        return found

    def plan(self, name: str, collections: Iterable[str] = ()) -> TensorPlan | None:
        """What to save of tensor `name` (member of `collections` by the plugin's knowledge,
        plus any included collection whose regex matches) at the open step; None: nothing."""
        step = self._counters.step
        if step is None or not step.due:
            return None
        due = step.due_names
        matched = [c for c in self._matching(name, tuple(collections)) if c.name in due]
        if not matched:
            return None
        save_raw, save_shape, wanted = False, False, []
        for c in matched:
            rc = c.reduction_config
            assert rc is not None  # with_defaults filled it
            save_raw = save_raw or rc.save_raw_tensor or rc.is_empty
            save_shape = save_shape or rc.save_shape
            wanted.extend(rc.requested())
        return TensorPlan(name, save_raw, tuple(dict.fromkeys(wanted)), save_shape)

    def record(
        self,
        plan: TensorPlan,
        raw: Any = None,
        reduction_values: Mapping[tuple[str, bool], Any] | None = None,
        shape: Sequence[int] | None = None,
    ) -> None:
        """Buffer what the plugin computed for `plan` in the open step."""
        step = self._counters.step
        if step is None:
            return
        if plan.save_raw and raw is not None:
            step.tensors[plan.name] = raw
        for (reduction, is_abs), value in (reduction_values or {}).items():
            step.tensors[reductions.reduction_tensor_name(plan.name, reduction, is_abs)] = value
        if plan.save_shape and shape is not None:
            step.shapes[plan.name] = tuple(int(d) for d in shape)

    def save_value(self, name: str, value: Any, collections: Iterable[str] = ()) -> None:
        """Save `value` as tensor `name` when due: a framework tensor by the plugin, anything
        else (number, numpy array) by numpy. For the plugin's own discoveries."""
        plan = self.plan(name, collections)
        if plan is None:
            return
        try:
            if not self._capture(plan, value):
                self._record_host(plan, np.asarray(value))
        except UnsupportedValue as exc:
            self._drop_unsupported(name, value, exc)

    def _drop_unsupported(self, name: str, value: Any, exc: UnsupportedValue) -> None:
        """One value the format cannot hold costs that value only: warned once per name,
        listed in the worker's status ("degraded"); the hook and training go on."""
        if name in self._unsupported:
            return
        self._unsupported[name] = f"{type(value).__name__}: {exc}"
        logger.warning("stepscope: tensor %r is not saved: %s (%s); later steps and other tensors are unaffected", name, exc, type(value).__name__)
        if self.store is not None:
            self.failsafe.call(write_status, self.store, self.worker, {
                "state": "degraded",
                "component": f"{self.framework} hook ({self.worker})",
                "error": f"{len(self._unsupported)} tensor(s) of unsupported kinds are not saved",
                "dropped_tensors": [f"{n} ({why})" for n, why in list(self._unsupported.items())[:100]],
                "time": time.time(),
                "pid": os.getpid(),
            })

    def _record_host(self, plan: TensorPlan, array: np.ndarray) -> None:
        values = {(r, a): reductions.compute(array, r, a) for r, a in plan.reductions if array.size}
        self.record(plan, array, values, array.shape)

    # --- what is saved (user side) ---------------------------------------------------------

    def save_tensor(self, name: str, value: Any, collections: Iterable[str] | str = CollectionName.DEFAULT) -> None:
        """Save `value` (a framework tensor, numpy array or number) as tensor `name` of the
        open step, when one of `collections` (a string is one name; default "default") or
        a collection whose regex matches `name` is due. A value that cannot be saved, a
        bad name, or the name of one of the model's own tensors raises ConfigError here."""
        if not self.enabled:
            return
        names = name_tuple("save_tensor collections", collections)
        host = self._check_user_value(name, value)
        self._warn_not_included(name, names)
        self.failsafe.call(self._save_user_value, name, value if host is None else host, names)

    def save_scalar(self, name: str, value: Any) -> None:
        """Save a number of the open step in the "metrics" collection (every plugin)."""
        self.save_tensor(name, value, CollectionName.METRICS)

    def save_loss(self, value: Any, name: str = "loss") -> None:
        """Save a loss value of the open step in the "losses" collection: for functional
        losses (`F.nll_loss(...)`, `keras.losses.*`) that no module or layer computes."""
        self.save_tensor(name, value, CollectionName.LOSSES)

    def _check_user_value(self, name: Any, value: Any) -> np.ndarray | None:
        """Refuse at the call what could only fail later, on the writer thread. Returns the
        host array of a non-framework value."""
        if not isinstance(name, str) or not name:
            raise ConfigError(f"save_tensor: the name must be a non-empty string, got {name!r}")
        try:
            name.encode("utf-8")
        except UnicodeEncodeError:
            raise ConfigError(f"save_tensor({name!r}): the name is not valid UTF-8 text (lone surrogate?)") from None
        if name in self._model_names:
            raise ConfigError(
                f"save_tensor({name!r}): the model has a tensor of that name, which the hook saves itself; "
                "give your value another name"
            )
        if self._is_framework_value(value):
            return None
        try:
            array = np.asarray(value)
        except (ValueError, TypeError) as exc:
            raise ConfigError(f"save_tensor({name!r}): cannot save {type(value).__name__} value: {exc}") from None
        if array.dtype.kind not in _SAVEABLE_KINDS:
            raise ConfigError(
                f"save_tensor({name!r}): cannot save a value of dtype {array.dtype} ({type(value).__name__}); "
                "give a number, a numeric numpy array or a framework tensor"
            )
        return array

    def _warn_not_included(self, name: str, collections: tuple[str, ...]) -> None:
        missing = [c for c in collections if c not in self._included_names]
        if missing and len(missing) == len(collections) and not self._warned_collections.issuperset(missing):
            self._warned_collections.update(missing)
            logger.warning("stepscope: save_tensor(%r): collection(s) %s are not included in the hook; nothing is saved there", name, missing)

    def _save_user_value(self, name: str, value: Any, collections: tuple[str, ...]) -> None:
        plan = self.plan(name, collections)
        if plan is None:
            return
        try:
            if isinstance(value, np.ndarray):
                self._record_host(plan, value)
            elif not self._capture(plan, value):
                self._record_host(plan, np.asarray(value))
        except UnsupportedValue as exc:
            self._drop_unsupported(name, value, exc)

    # --- profiler side ----------------------------------------------------------------

    def _start_profiler(self) -> None:
        from .monitor import SystemMonitor, default_node_id
        from .step_timeline import TimelineWriter

        assert self.store is not None
        node = default_node_id()
        config = self.profiler_config
        if config.system_monitor and SystemMonitor.should_run(self.rank, self.local_rank, config.monitor_every_rank):
            node_id = default_node_id(self.rank) if config.monitor_every_rank else node
            # In a sampler process of its own: the training thread's hold on the GIL cannot
            # delay a sample there.
            self.monitor = SystemMonitor(self.store, interval_ms=config.monitor_interval_ms, node_id=node_id, process=True)
            self.monitor.start()
        if config.step_timeline:
            self.timeline = TimelineWriter(self.store, node_id=node, rank=self.rank, framework=self.framework)
            self._timer = StepTimer(self._make_clock())
            flat = getattr(self._timer.clock, "int_tokens", False)
            self._log = PhaseLog(flat=flat, words=self._counters.log_words() if flat else None)
            self._counters.log_append = self._log.append
            self._counters.now = self._timer.clock.now
            self.timeline.add_source(self._drain_timeline)
            # stepscope.annotate() outside profiling windows: a span of the open step.
            annotation.set_sink(self._annotation_span)
        self._counters.detailed = self._make_detailed_profilers()

    def _annotation_span(self, name: str, start_ns: int, end_ns: int) -> None:
        self.add_timeline(name, start_ns, end_ns, phase="annotation")

    def _set_clock(self, clock: Clock) -> None:
        """Use `clock` for the step timeline from now on (before the first step: a plugin
        that learns the model's device)."""
        if self._timer is not None:
            flat = getattr(clock, "int_tokens", False)
            if self._log is not None and self._log.flat != flat:
                self._publish_timeline(True)  # (empty before the first step)
                self._log = PhaseLog(flat=flat, words=self._counters.log_words() if flat else None)
                self._counters.log_append = self._log.append
            self._timer.clock = clock
            self._counters.now = clock.now

    def _drain_timeline(self, wait: bool = False) -> list[tuple[int, ModeKeys, list[tuple[str, int, int]]]]:
        """The steps logged since the last drain whose times the clock knows (all of them
        with `wait`), in wall-clock ns. Runs on the timeline's flush thread, and at flush()
        and close(): the training thread only appends to the log."""
        timer, log = self._timer, self._log
        if timer is None or log is None:
            return []
        with self._drain_lock:
            offset = getattr(timer.clock, "offset", None)
            if log.flat and isinstance(offset, int):  # CPU clock: known at once, one pass
                return log.drain_wall(offset)
            for step, mode, spans in log.drain():
                timer.add_step(step, mode, spans)
            return list(timer.ready_steps(wait))

    def _publish_timeline(self, wait: bool) -> None:
        if self.timeline is None:
            return
        for step, mode, spans in self._drain_timeline(wait):
            self.timeline.add_spans(spans, step=step, mode=mode)

    def add_timeline(self, name: str, start_ns: int, end_ns: int, phase: str = "step", args: dict[str, Any] | None = None,
                     *, step: int | None = None, mode: ModeKeys | None = None) -> None:
        """Record one extra span (absolute time.time_ns() times) of the open step, or of
        `step`/`mode`."""
        if self.timeline is None or not self.profiler_failsafe.enabled:
            return
        if step is None:
            open_step = self._counters.step
            if open_step is None:
                return
            step, mode = open_step.global_step, open_step.mode
        self.profiler_failsafe.call(self.timeline.add, name, start_ns, end_ns, step=step, mode=mode, phase=phase, args=args)

    # --- end --------------------------------------------------------------------------

    def _write_collections(self) -> None:
        if self.writer is None:
            return
        manager = CollectionManager(self.included)
        manager.module_classes.update(self._module_classes)
        manager.scopes.update(self._scopes)
        self.writer.write_collections(manager.dumps(self.num_workers))

    def flush(self, timeout: float | None = None) -> None:
        """Publish everything recorded so far (the open step included, which it closes):
        tensors, the collections file and the step timeline, without closing. Callbacks
        call it at the end of every fit / validate / test / predict."""
        if self._counters.closed:
            return
        if self.failsafe.enabled and self._counters.step is not None:
            self.failsafe.call(self._end_step)
        if self.writer is not None and self.failsafe.enabled:
            self.failsafe.call(self._write_collections)
            if not self.writer.flush(timeout) and self.writer.in_outage:
                return  # the store is not answering: the timeline and monitor retry on their own threads
        if self.timeline is not None and self.profiler_failsafe.enabled:
            self.profiler_failsafe.call(self._publish_timeline, True)
            self.profiler_failsafe.call(self.timeline.flush)
        if self.monitor is not None and self.profiler_failsafe.enabled:
            self.profiler_failsafe.call(self.monitor.flush)

    def _close_timeout_s(self) -> float:
        if self.writer is not None:
            return self.writer.close_timeout_s
        try:
            return close_timeout_from_env()
        except Exception:  # noqa: BLE001 - closing never raises; the hook's start said what was wrong
            return 60.0

    def _part_closer(self, part: Any, deadline: Deadline) -> Callable[[], None]:
        """What closes one of the hook's background parts (the monitor has only stop())."""
        def close() -> None:
            method = getattr(part, "close", None)
            if method is not None:
                self.profiler_failsafe.call(method)
            else:
                self.profiler_failsafe.call(part.stop, timeout_s=deadline.left() / 2)

        return close

    def close(self, timeout: float | None = None, *, deadline: Deadline | None = None) -> None:
        """Publish the rest, write the job's end marker (rank 0), stop the monitor and the
        poller, and remove what the plugin installed. Idempotent; also runs at exit.

        One deadline bounds it all: `timeout` seconds (default STEPSCOPE_CLOSE_TIMEOUT_S,
        60 s) for the writer, the status file, the step timeline, the monitor and the cost
        file together (at exit, shared with every other stepscope part closing then). A
        part the store still holds then is left on its daemon thread and named in the log;
        the writer's lost steps are listed in the status file."""
        counters = self._counters
        if counters.closed:
            return
        if deadline is None:
            deadline = Deadline(self._close_timeout_s() if timeout is None else max(0.0, float(timeout)))
        parts: dict[str, Any] = {}
        try:
            if self.failsafe.enabled and counters.step is not None:
                self.failsafe.call(self._end_step)
            self.profiler_failsafe.call(self._publish_timeline, True)
            # What needs nothing from the writer closes alongside it, on threads of its own.
            for name, part in (("step timeline", self.timeline), ("system monitor", self.monitor), ("stop poller", self.stop_poller)):
                if part is not None:
                    parts[name] = start_within(self._part_closer(part, deadline), name)
            if self.writer is not None:
                self.failsafe.call(self._write_collections)
                # Only rank 0 marks the job finished; other workers just flush.
                self.writer.close(end_marker=self.rank == 0, deadline=deadline.earlier(min(_AFTER_WRITER_S, deadline.seconds / 10)))
            claim = getattr(self, "_claim", None)
            if claim is not None:  # (also after a failure: the worker is free again)
                parts["run claim"] = start_within(claim.release, "run claim")
            if counters.detailed is not None:
                self.profiler_failsafe.call(counters.detailed.close, deadline)
            if annotation._sink == self._annotation_span:
                annotation.set_sink(None)
            if self.writer is not None and self.rank == 0:
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
        finally:
            counters.closed = True
            try:
                self._on_close()
            except Exception as exc:  # noqa: BLE001 - closing must not raise into training code
                logger.warning("stepscope: could not remove the hooks cleanly: %s", exc)
            at_exit = getattr(self, "_at_exit", None)
            if at_exit is not None:
                atexit.unregister(at_exit)

    def _included_collection_names(self, name: str) -> set[str]:
        """The (growing) set of tensor names of included collection `name` ({} if not included)."""
        for c in self.included:
            if c.name == name:
                return c.tensor_names
        return set()

    def _say_if_too_little_saved(self) -> None:
        """One line, and the worker's status file, when the job saved less than the default
        rules need to judge it (stepscope.evidence)."""
        shortfall = self._saved.shortfall(gradients="gradients" in self._included_names)
        if shortfall is None or self.store is None:
            return
        logger.warning("stepscope: %s", shortfall)
        # Its own status file: the worker's (a failure, if any) must stay as it is.
        write_status(self.store, f"{self.worker}_evidence", {"state": TOO_LITTLE_DATA, "message": shortfall, **self._saved.to_json()})

    def __enter__(self) -> HookBase:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


__all__ = ["HookBase", "HookOptions", "StepState", "StopTrainingRequested", "TensorPlan", "env_rank"]
