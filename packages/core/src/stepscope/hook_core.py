"""What every framework hook shares: options, step and mode counting, which collections are
due, what to save of each tensor, buffering a step for the writer, the fail-safe, the stop
poller, and the profiler side (system monitor, step timeline). Plugins only add *when* a
step starts and ends and *which* tensors exist."""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from . import layout, reductions
from .collection_manager import CollectionManager
from .config import (
    ALWAYS_SAVED_COLLECTIONS,
    TRAIN_ONLY_COLLECTIONS,
    Collection,
    CollectionName,
    ProfilerConfig,
    ReductionConfig,
    SaveConfig,
)
from .control import StopPoller
from .exceptions import ConfigError
from .hook_config import load_hook_config
from .modes import ModeKeys
from .safety import FailSafe, disabled_by_env, write_status
from .store import open_store
from .writer import Writer

logger = logging.getLogger("stepscope")


STOP_POLL_ENV = "STEPSCOPE_STOP_POLL_S"


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


class StopTrainingRequested(RuntimeError):
    """Raised by a plain-loop hook at the end of a step after a rule asked to stop
    (Lightning and Keras stop through the framework instead)."""


@dataclass(frozen=True)
class TensorPlan:
    """What to save of one tensor at the current step."""

    name: str
    save_raw: bool
    reductions: tuple[tuple[str, bool], ...]
    save_shape: bool


@dataclass
class _StepState:
    global_step: int
    mode: ModeKeys
    mode_step: int
    due: tuple[Collection, ...]
    due_names: frozenset[str] = frozenset()
    tensors: dict[str, Any] = field(default_factory=dict)
    shapes: dict[str, Sequence[int]] = field(default_factory=dict)
    started_ns: int = 0


class HookCore:
    """Framework-free state of a hook. See the torch and TF plugins for the public hooks."""

    def __init__(
        self,
        out_dir: str,
        *,
        framework: str,
        builtin_regexes: Mapping[str, Sequence[str]] | None = None,
        save_config: SaveConfig | None = None,
        reduction_config: ReductionConfig | None = None,
        include_collections: Iterable[str] | None = None,
        include_regex: Iterable[str] | str | None = None,
        save_all: bool = False,
        include_workers: str = "one",
        profiler_config: ProfilerConfig | None = None,
        collections: Iterable[Collection] = (),
        rank: int = 0,
        world_size: int = 1,
        local_rank: int = 0,
        control_poll_s: float | None = None,
        validate_only: bool = False,
    ):
        """`validate_only` checks the arguments (out_dir included) and starts nothing: for
        callbacks that must fail at construction but can only start once they know the rank."""
        self.framework = framework
        self.failsafe = FailSafe(f"{framework} hook")
        # The profiler side fails on its own: losing the timeline must not stop tensor saving.
        self.profiler_failsafe = FailSafe(f"{framework} profiler")
        self.enabled = self.failsafe.enabled
        if include_workers not in ("one", "all"):
            raise ConfigError(f"include_workers must be 'one' or 'all', got {include_workers!r}")
        if save_config is not None and not isinstance(save_config, SaveConfig):
            raise ConfigError(f"save_config must be a SaveConfig, got {save_config!r}")
        if reduction_config is not None and not isinstance(reduction_config, ReductionConfig):
            raise ConfigError(f"reduction_config must be a ReductionConfig, got {reduction_config!r}")
        if not out_dir:
            raise ConfigError("out_dir is required (a local path or s3:// URL)")
        self.out_dir = str(out_dir)
        self.save_config = save_config or SaveConfig()
        self.reduction_config = reduction_config or ReductionConfig()
        self.profiler_config = profiler_config or ProfilerConfig()
        self.rank, self.world_size, self.local_rank = int(rank), int(world_size), int(local_rank)
        self.include_workers = include_workers
        self.worker = layout.worker_name(self.rank)
        self.writes_tensors = include_workers == "all" or self.rank == 0
        self.num_workers = self.world_size if include_workers == "all" else 1

        self.collections = CollectionManager(collections, builtin_regexes=builtin_regexes)
        # tensor name -> class of the module it comes from (rules recognise activations by it)
        self.module_classes: dict[str, str] = {}
        if isinstance(include_regex, str):
            include_regex = [include_regex]
        if include_regex:
            self.collections.get(CollectionName.DEFAULT).include(*include_regex)
        if save_all:
            self.collections.get(CollectionName.ALL).include(".*")
        names = list(include_collections or []) + [c.name for c in collections]
        names += sorted(ALWAYS_SAVED_COLLECTIONS)
        if include_regex:
            names.append(CollectionName.DEFAULT)
        if save_all:
            names.append(CollectionName.ALL)
        unknown = [n for n in names if n not in self.collections]
        if unknown:
            raise ConfigError(f"include_collections: unknown collection(s) {unknown}; known: {', '.join(self.collections.names())} (define others with collections=[Collection(...)])")
        self.included: tuple[Collection, ...] = tuple(
            self.collections.get(n).with_defaults(self.save_config, self.reduction_config) for n in dict.fromkeys(names)
        )
        self._matching_cache: dict[tuple[str, tuple[str, ...]], tuple[Collection, ...]] = {}
        self._mode_counts = {mode: 0 for mode in ModeKeys}
        self._next_due: dict[ModeKeys, int | None] = {}
        self._global_step = 0
        self.step: _StepState | None = None
        self.mode = ModeKeys.TRAIN
        self.store = None
        self.writer: Writer | None = None
        self.stop_poller: StopPoller | None = None
        self.monitor = None
        self.timeline = None
        self._closed = False
        if validate_only:
            open_store(self.out_dir)  # raises ConfigError when out_dir is a file; writes nothing
            self.enabled = False
            return
        if not self.enabled:
            return
        self.store = open_store(self.out_dir)  # raises ConfigError when out_dir is a file
        self.failsafe._on_failure = lambda status: write_status(self.store, self.worker, status)
        self.profiler_failsafe._on_failure = lambda status: write_status(self.store, f"{self.worker}_profiler", status)
        if self.writes_tensors:
            self.writer = Writer(self.store, self.worker)
            self._write_collections()
        if control_poll_s is None:
            control_poll_s = _poll_interval_from_env()
        self.stop_poller = StopPoller(self.store, control_poll_s)
        self.profiler_failsafe.call(self._start_profiler)

    @staticmethod
    def options_from_json(path: str | None = None) -> dict[str, Any]:
        """Hook keyword arguments from smdebug's hook JSON (see hook_config). Entries for
        built-in collections without a regex keep the built-in regexes and change only
        their save and reduction settings."""
        config = load_hook_config(path)
        options: dict[str, Any] = {
            "save_config": config.save_config,
            "reduction_config": config.reduction_config,
            "collections": list(config.collections.values()),
            "include_regex": list(config.include_regex) or None,
            "save_all": config.save_all,
            "include_workers": config.include_workers,
        }
        if config.out_dir:
            options["out_dir"] = config.out_dir
        return options

    # --- profiler side ----------------------------------------------------------------

    def _start_profiler(self) -> None:
        from .profiler import SystemMonitor, TimelineWriter, default_node_id

        node = default_node_id()
        config = self.profiler_config
        if config.system_monitor and SystemMonitor.should_run(self.rank, self.local_rank, config.monitor_every_rank):
            node_id = default_node_id(self.rank) if config.monitor_every_rank else node
            self.monitor = SystemMonitor(self.store, interval_ms=config.monitor_interval_ms, node_id=node_id)
            self.monitor.start()
        if config.step_timeline:
            self.timeline = TimelineWriter(self.store, node_id=node, rank=self.rank, framework=self.framework)

    def add_timeline(
        self,
        name: str,
        start_ns: int,
        end_ns: int,
        phase: str = "step",
        args: dict[str, Any] | None = None,
        *,
        step: int | None = None,
        mode: ModeKeys | None = None,
    ) -> None:
        """Record one span (absolute time.time_ns() times) of the current step, or of an
        earlier `step`/`mode` when its times are resolved late (CUDA events)."""
        if self.timeline is None or not self.profiler_failsafe.enabled:
            return
        if step is None:
            if self.step is None:
                return
            step, mode = self.step.global_step, self.step.mode
        self.profiler_failsafe.call(self.timeline.add, name, start_ns, end_ns, step=step, mode=mode, phase=phase, args=args)

    def add_timeline_spans(self, spans: list[tuple[str, int, int]], *, step: int, mode: ModeKeys) -> None:
        """Record a step's phases at once, `(phase, start_ns, end_ns)` in absolute ns."""
        if self.timeline is not None and self.profiler_failsafe.enabled and spans:
            self.profiler_failsafe.call(self.timeline.add_spans, spans, step=step, mode=mode)

    # --- steps ------------------------------------------------------------------------

    @property
    def active(self) -> bool:
        return self.failsafe.enabled and not self._closed and not (self.writer is not None and self.writer.failed)

    def begin_step(self, mode: ModeKeys | None = None) -> bool:
        """Open the next step in `mode`; True when some collection is due at it."""
        if self.step is not None:
            self.end_step()
        mode = self.mode if mode is None else mode
        self.mode = mode
        mode_step = self._mode_counts[mode]
        self._mode_counts[mode] = mode_step + 1
        due: tuple[Collection, ...] = ()
        next_due = self._next_due.get(mode, 0)
        # Most steps save nothing: compare with the next due step instead of asking every
        # collection's schedule (that is the whole cost of a step where nothing is due).
        if next_due is not None and mode_step >= next_due and self.writes_tensors and self.active:
            candidates = self._collections_for(mode)
            due = tuple(c for c in candidates if c.save_config.should_save(mode_step, mode))
            upcoming = [n for n in (c.save_config.for_mode(mode).next_save_step(mode_step + 1) for c in candidates) if n is not None]
            self._next_due[mode] = min(upcoming) if upcoming else None
        self.step = _StepState(self._global_step, mode, mode_step, due, frozenset(c.name for c in due))
        self._global_step += 1
        return bool(due)

    def _collections_for(self, mode: ModeKeys) -> tuple[Collection, ...]:
        if mode == ModeKeys.TRAIN:
            return self.included
        return tuple(c for c in self.included if c.name not in TRAIN_ONLY_COLLECTIONS)

    @property
    def due(self) -> bool:
        return self.step is not None and bool(self.step.due)

    def is_due(self, collection: str) -> bool:
        return self.step is not None and collection in self.step.due_names

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
        plus any included collection whose regex matches) at the current step; None: nothing."""
        if self.step is None or not self.step.due:
            return None
        due = self.step.due_names
        matched = [c for c in self._matching(name, tuple(collections)) if c.name in due]
        if not matched:
            return None
        save_raw, save_shape, wanted = False, False, []
        for c in matched:
            rc = c.reduction_config
            save_raw = save_raw or rc.save_raw_tensor or rc.is_empty
            save_shape = save_shape or rc.save_shape
            wanted.extend(rc.requested())
        return TensorPlan(name, save_raw, tuple(dict.fromkeys(wanted)), save_shape)

    def record(self, plan: TensorPlan, raw: Any = None, reduction_values: Mapping[tuple[str, bool], Any] | None = None, shape: Sequence[int] | None = None) -> None:
        """Buffer what the plugin computed for `plan` in the current step."""
        step = self.step
        if step is None:
            return
        if plan.save_raw and raw is not None:
            step.tensors[plan.name] = raw
        for (reduction, is_abs), value in (reduction_values or {}).items():
            step.tensors[reductions.reduction_tensor_name(plan.name, reduction, is_abs)] = value
        if plan.save_shape and shape is not None:
            step.shapes[plan.name] = tuple(int(d) for d in shape)

    def save_numpy(self, name: str, value: Any, collections: Iterable[str] = ()) -> None:
        """Save a host value (scalar, numpy array) at the current step, reductions by numpy."""
        plan = self.plan(name, collections)
        if plan is None:
            return
        array = np.asarray(value)
        values = {(r, a): reductions.compute(array, r, a) for r, a in plan.reductions if array.size}
        self.record(plan, array, values, array.shape)

    def end_step(self) -> None:
        """Hand the step to the writer (nothing happens when nothing was recorded)."""
        step, self.step = self.step, None
        if step is None or not (step.tensors or step.shapes) or self.writer is None:
            return
        self.writer.write_step(step.global_step, step.mode, step.mode_step, step.tensors, step.shapes)
        if self.writer.failed:
            self.failsafe.enabled = False

    @property
    def stop_requested(self) -> bool:
        return self.stop_poller is not None and self.stop_poller.stop_requested

    @property
    def global_step(self) -> int:
        return self._global_step

    def mode_step(self, mode: ModeKeys) -> int:
        return self._mode_counts[mode]

    # --- end --------------------------------------------------------------------------

    def _write_collections(self) -> None:
        if self.writer is None:
            return
        manager = CollectionManager(self.included)
        manager.module_classes.update(self.module_classes)
        self.writer.write_collections(manager.dumps(self.num_workers))

    def flush(self, timeout: float | None = None) -> None:
        """Publish everything handed over so far, and the collections file, without closing
        (a Lightning trainer may run validate/test after fit with the same hook)."""
        if self.writer is not None and not self._closed:
            self.failsafe.call(self._write_collections)
            self.writer.flush(timeout)

    def close(self) -> None:
        if self._closed:
            return
        try:
            if self.step is not None:
                self.failsafe.call(self.end_step)
            if self.writer is not None:
                self.failsafe.call(self._write_collections)
                # Only rank 0 marks the job finished; other workers just flush.
                self.writer.close(end_marker=self.rank == 0)
            for part in (self.timeline, self.monitor, self.stop_poller):
                if part is not None:
                    method = getattr(part, "close", None) or part.stop
                    self.profiler_failsafe.call(method)
        finally:
            self._closed = True


def wall_ns(perf_ns: int, perf_origin_ns: int, wall_origin_ns: int) -> int:
    """Convert a perf_counter_ns reading to absolute wall time (ns since the epoch)."""
    return wall_origin_ns + (perf_ns - perf_origin_ns)


def clock_origin() -> tuple[int, int]:
    """(perf_counter_ns, time_ns) read together, for `wall_ns`."""
    return time.perf_counter_ns(), time.time_ns()


__all__ = ["HookCore", "TensorPlan", "StopTrainingRequested", "disabled_by_env"]
