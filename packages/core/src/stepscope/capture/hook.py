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
(`plugin.FrameworkPlugin` is this contract as a Protocol.)

HookBase is a facade over parts with one job each: the step driver (`step_driver.py`,
its base: counters, due collections, the phase log), the tensor saver
(`tensor_saver.py`), the stop coordinator (`stop.py`) and the runtime
(`runtime.py`: store, claim, writer, outputs, poller, monitor, step timeline).
"""

from __future__ import annotations

import atexit
import logging
import os
import weakref
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, ClassVar

import numpy as np

from .. import layout
from ..closing import ClosedOnExit
from ..config import ROUTINE_COLLECTIONS, Collection, ProfilerConfig, ReductionConfig, SaveConfig, default_save_config
from ..exceptions import ConfigError, UnsupportedValue
from ..modes import ModeKeys
from ..store import open_store
from .collection_manager import CollectionManager
from .control import write_response
from .deadline import Deadline, exit_deadline
from .evidence import SavedEvidence
from .hook_options import HookOptions, name_tuple
from .phases import Clock, CpuClock
from .runtime import HookRuntime
from .safety import FailSafe
from .scopes import Scope
from .step_counters import StepCounters
from .step_driver import IdleStep, StepDriver, StepState
from .stop import STOP_AGREE_ENV, STOP_POLL_ENV, StopCoordinator, StopTrainingRequested, agree_steps_from_env, poll_interval_from_env
from .tensor_saver import TensorPlan, TensorSaver

logger = logging.getLogger("stepscope")


def env_rank() -> tuple[int, int, int]:
    """(rank, world size, local rank) from the RANK / WORLD_SIZE / LOCAL_RANK variables
    that torchrun, mpirun wrappers and SageMaker set."""
    try:
        return int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1)), int(os.environ.get("LOCAL_RANK", 0))
    except ValueError as exc:
        raise ConfigError(f"RANK / WORLD_SIZE / LOCAL_RANK must be integers: {exc}") from None


def _close_at_exit(ref: weakref.ref[HookBase]) -> None:
    hook = ref()
    if hook is not None:
        hook.close(deadline=exit_deadline().within(hook._runtime.close_timeout_s()))


class HookBase(StepDriver, ClosedOnExit):
    """The public surface of every stepscope hook; see the module docstring for what a
    plugin adds. `HookBase(out_dir, save_config, ..., collections)` takes the options of
    `HookOptions` (by position or name) or one `HookOptions`."""

    framework: ClassVar[str] = "generic"
    builtin_regexes: ClassVar[Mapping[str, Sequence[str]]] = {}
    # Whether begin_step calls `_on_step_begin(False)` / `_on_step_end()` at steps where
    # nothing is due; a plugin with nothing to do there sets False (two calls less a step).
    notify_every_step: ClassVar[bool] = True
    __slots__ = ()  # (the step driver's: `_counters` is a slot)

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
        self._saver = TensorSaver(self, opts, self.save_config, self.reduction_config, self.builtin_regexes)
        self.collections: CollectionManager = self._saver.collections
        self.included: tuple[Collection, ...] = self._saver.included
        # What every step reads and changes: the open step, the step numbers, the timeline's
        # clock and log, the stop counters (step_counters.py; a plugin may compile it).
        counters = self._counters = self._make_counters()
        counters.idle = IdleStep(counters)
        self._log = None
        self._off_mode: ModeKeys | None = None  # the mode of a step begun while the hook was off
        self._meter: Any = None  # the cost meter begin_step feeds (hook_outputs.instrument; counters.meter_at)
        self._stop = StopCoordinator(counters, 1 if validate_only else agree_steps_from_env(), self._can_agree_on_stop, self._agree_on_stop, lambda: self.failsafe.enabled)
        self._stop.on_control = self._on_control_request
        if not self.writes_tensors:  # nothing is ever due
            for mode in ModeKeys:
                counters.next_due[mode] = None
        self._runtime = HookRuntime(self)
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
        saved = SavedEvidence(self._saver.collection_tensor_names("losses"), self._saver.collection_tensor_names("gradients"))
        self._runtime.start(saved, control_poll_s or poll_interval_from_env())

    # --- what a plugin supplies (plugin.FrameworkPlugin) -------------------------------

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
        """The framework's windowed profilers (stepscope.capture.detailed.WindowedProfilers)
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

    def _on_control_request(self, request: dict[str, Any]) -> None:
        """An on-demand request (control.send_request) at the end of a TRAIN step, on the
        training thread: the plugin answers what it can; by default each is answered as
        not supported by this framework."""
        store = self.store
        if store is not None:
            write_response(store, request, self.worker, rank=self.rank, step=self.global_step, written=[],
                           error=f"the {self.framework} hook does not support {request.get('action')!r} requests")  # fmt: skip

    def _can_agree_on_stop(self) -> bool:
        """Whether this rank's peers can agree on stopping through a collective (asked once,
        at the end of the first TRAIN step; the answer must be the same on every rank)."""
        return False

    def _agree_on_stop(self, local: bool) -> bool:
        """Whether the job stops now, given this rank's own view `local`: True on every rank
        when any rank saw a stop request. Runs on every rank at the same TRAIN steps (every
        `$STEPSCOPE_STOP_AGREE_STEPS`), only when `_can_agree_on_stop()`."""
        return local

    # --- options and state --------------------------------------------------------------

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

    @property
    def enabled(self) -> bool:
        """False once stepscope is off for this hook: STEPSCOPE_DISABLE, a failure inside
        it (see the worker's file in stepscope-status/), or `close()`."""
        writer = self._runtime.writer
        return self.failsafe.enabled and not self._counters.closed and not (writer is not None and writer.failed)

    @property
    def detailed(self) -> Any:
        """The windowed profilers (stepscope.capture.detailed), None without windows."""
        return self._counters.detailed

    # The runtime's parts, read where a plugin or a test needs them.
    store = property(lambda self: self._runtime.store, doc="The job's store (None before start or when disabled).")
    writer = property(lambda self: self._runtime.writer, doc="The writer (None on a worker that saves no tensors).")
    outputs = property(lambda self: self._runtime.outputs, doc="The cost meter and the optional outputs.")
    stop_poller = property(lambda self: self._runtime.stop_poller, doc="The stop-request poller.")
    monitor = property(lambda self: self._runtime.monitor, doc="The system monitor, if this process runs it.")
    _timer = property(lambda self: self._runtime.timer, doc="The step timeline's timer, None without a timeline.")

    @property
    def timeline(self) -> Any:
        """The step timeline's writer, None without a timeline."""
        return self._runtime.timeline

    @timeline.setter
    def timeline(self, writer: Any) -> None:
        self._runtime.timeline = writer

    # --- stop requests (stop.py) -------------------------------------------------------

    @property
    def stop_requested(self) -> bool:
        """True once a rule asked the job to stop (polled off the training thread). In a
        multi-rank job whose ranks agree on stopping, True from the TRAIN step at which all
        ranks agreed: the same step on every rank."""
        return self._stop.requested

    def _decide_stop(self, n: int) -> bool:
        return self._stop.decide(n)

    def _raise_stop(self) -> None:
        self._stop.raise_stop()

    # --- what the step driver asks ------------------------------------------------------

    def _collections_for(self, mode: ModeKeys) -> tuple[Collection, ...]:
        return self._saver.collections_for(mode)

    def _hand_over(self, step: StepState) -> None:
        writer, held = self._runtime.writer, self._runtime.held
        if writer is not None and held is not None:
            # (Routine steps, where only losses, metrics and the default collection were due,
            # go to the writer in batches: held_steps.py, which also notes the evidence each
            # step holds.)
            held.hand_over(step.global_step, step.mode, step.mode_step, step.tensors, step.shapes, step.due_names <= ROUTINE_COLLECTIONS)
            if writer.failed:
                self.failsafe.enabled = False

    def _release_held(self) -> None:
        """The held scalar steps to the writer (a plugin's own source of them calls this
        once enough wait: held_steps.py)."""
        self._runtime.release_held()
        writer = self._runtime.writer
        if writer is not None and writer.failed:
            self.failsafe.enabled = False

    def _resumed(self) -> None:
        claim = self._runtime.claim
        if claim is not None:  # this run continues the job's numbering: not a second training
            self.failsafe.call(claim.resumed)

    # --- what is saved (tensor_saver.py) -------------------------------------------------

    def claim_names(self, names: Iterable[str]) -> None:
        """Names of the model's own tensors: `save_tensor` refuses them (a user value must
        never silently replace a model tensor of the same name)."""
        self._saver.model_names.update(names)

    def note_module_class(self, tensor_name: str, module_class: str) -> None:
        """The class of the module (layer) whose input/output `tensor_name` is: written in
        the collections metadata, so that rules recognise activations by type."""
        self._saver.module_classes[tensor_name] = module_class

    def declare_scope(self, name: str, parameters: Iterable[str], *, kind: str = "model") -> None:
        """Record a scope: one network (`kind="model"`) or one optimizer's parameters
        (`kind="optimizer"`). `parameters` are the tensor names as the weights/biases
        collections save them (the gradient of P is saved as `gradient/P`). Rules that
        compare layers compare them only within a scope. Declaring a name again adds
        parameters. Bad input is logged with what was wrong and ignored: never raises."""
        self._saver.declare_scope(name, parameters, kind)

    @property
    def scopes(self) -> tuple[Scope, ...]:
        """The scopes declared so far (see declare_scope)."""
        return tuple(self._saver.scopes.values())

    def plan(self, name: str, collections: Iterable[str] = ()) -> TensorPlan | None:
        """What to save of tensor `name` (member of `collections` by the plugin's knowledge,
        plus any included collection whose regex matches) at the open step; None: nothing."""
        return self._saver.plan(name, collections)

    def record(self, plan: TensorPlan, raw: Any = None, reduction_values: Mapping[tuple[str, bool], Any] | None = None, shape: Sequence[int] | None = None) -> None:
        """Buffer what the plugin computed for `plan` in the open step."""
        self._saver.record(plan, raw, reduction_values, shape)

    def save_value(self, name: str, value: Any, collections: Iterable[str] = ()) -> None:
        """Save `value` as tensor `name` when due: a framework tensor by the plugin, anything
        else (number, numpy array) by numpy. For the plugin's own discoveries."""
        self._saver.save(self.plan(name, collections), name, value)

    def save_values(self, items: Iterable[tuple[str, Any, Iterable[str]]]) -> None:
        """`save_value` for each (name, value, collections) of `items`, in one batch where
        the plugin can copy them together (`_capture_many`)."""
        self._saver.save_many(items)

    def _record_host(self, plan: TensorPlan, array: np.ndarray) -> None:
        self._saver.record_host(plan, array)

    def _drop_unsupported(self, name: str, value: Any, exc: UnsupportedValue) -> None:
        self._saver.drop_unsupported(name, value, exc)

    def save_tensor(self, name: str, value: Any, collections: Iterable[str] | str = "default") -> None:
        """Save `value` (a framework tensor, numpy array or number) as tensor `name` of the
        open step, when one of `collections` (a string is one name; default "default") or
        a collection whose regex matches `name` is due. A value that cannot be saved, a
        bad name, or the name of one of the model's own tensors raises ConfigError here."""
        if not self.enabled:
            return
        saver = self._saver
        names = name_tuple("save_tensor collections", collections)
        host = saver.check_user_value(name, value)
        saver.warn_not_included(name, names)
        self.failsafe.call(lambda: saver.save(self.plan(name, names), name, value if host is None else host, host_checked=True))

    def save_scalar(self, name: str, value: Any) -> None:
        """Save a number of the open step in the "metrics" collection (every plugin)."""
        self.save_tensor(name, value, "metrics")

    def save_loss(self, value: Any, name: str = "loss") -> None:
        """Save a loss value of the open step in the "losses" collection: for functional
        losses (`F.nll_loss(...)`, `keras.losses.*`) that no module or layer computes."""
        self.save_tensor(name, value, "losses")

    # --- the step timeline, flush and close (runtime.py) ---------------------------------

    def _set_clock(self, clock: Clock) -> None:
        """Use `clock` for the step timeline from now on (before the first step: a plugin
        that learns the model's device)."""
        self._runtime.set_clock(clock)

    def _drain_timeline(self, wait: bool = False) -> list[tuple[int, ModeKeys, list[tuple[str, int, int]]]]:
        return self._runtime.drain_timeline(wait)

    def add_timeline(self, name: str, start_ns: int, end_ns: int, phase: str = "step", args: dict[str, Any] | None = None,
                     *, step: int | None = None, mode: ModeKeys | None = None) -> None:
        """Record one extra span (absolute time.time_ns() times) of the open step, or of
        `step`/`mode`."""
        timeline = self._runtime.timeline
        if timeline is None or not self.profiler_failsafe.enabled:
            return
        if step is None:
            open_step = self._counters.step
            if open_step is None:
                return
            step, mode = open_step.global_step, open_step.mode
        self.profiler_failsafe.call(timeline.add, name, start_ns, end_ns, step=step, mode=mode, phase=phase, args=args)

    def flush(self, timeout: float | None = None) -> None:
        """Publish everything recorded so far (the open step included, which it closes):
        tensors, the collections file, the step timeline and the traces of the profiling
        windows that have ended, without closing. Callbacks call it at the end of every
        fit / validate / test / predict."""
        if self._counters.closed:
            return
        if self.failsafe.enabled and self._counters.step is not None:
            self.failsafe.call(self._end_step)
        self._runtime.flush(timeout)

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
            deadline = Deadline(self._runtime.close_timeout_s() if timeout is None else max(0.0, float(timeout)))
        try:
            if self.failsafe.enabled and counters.step is not None:
                self.failsafe.call(self._end_step)
            self._runtime.close(deadline)
        finally:
            counters.closed = True
            try:
                self._on_close()
            except Exception as exc:  # noqa: BLE001 - closing must not raise into training code
                logger.warning("stepscope: could not remove the hooks cleanly: %s", exc)
            at_exit = getattr(self, "_at_exit", None)
            if at_exit is not None:
                atexit.unregister(at_exit)



__all__ = [
    "STOP_AGREE_ENV", "STOP_POLL_ENV", "HookBase", "HookOptions", "StepState", "StopTrainingRequested", "TensorPlan", "env_rank",
]
