"""What a hook saves of the open step: the included collections, which tensors they hold
(`plan`), and the values recorded for them (`record`), from the plugin's discoveries
(`save_value`) and from the user (`save_tensor`). The step driver hands a closed step's
tensors to the writer; this part only fills the open one."""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from .. import reductions
from ..config import (
    ALWAYS_SAVED_COLLECTIONS,
    SCALARS_REDUCTION_CONFIG,
    SCALARS_SAVE_CONFIG,
    TRAIN_ONLY_COLLECTIONS,
    Collection,
    CollectionName,
    SaveConfig,
)
from ..exceptions import ConfigError, UnsupportedValue
from ..modes import ModeKeys
from .collection_manager import CollectionManager
from .hook_options import HookOptions
from .safety import write_status
from .scopes import Scope, make_scope, merge_scope

logger = logging.getLogger("stepscope")

_SAVEABLE_KINDS = frozenset("biuf")  # numpy dtype kinds the record format holds
_PLAN_CACHE_SIZE = 1 << 16


@dataclass(frozen=True)
class TensorPlan:
    """What to save of one tensor at the current step."""

    name: str
    save_raw: bool
    reductions: tuple[tuple[str, bool], ...]
    save_shape: bool

    @property
    def raw_only(self) -> bool:
        """The raw value alone is saved (no reductions, no shape): a scalar's usual plan."""
        return self.save_raw and not self.reductions and not self.save_shape


class TensorSaver:
    """The collections of one hook and the tensors of its open step. `hook` supplies the
    plugin's `_capture` / `_is_framework_value`, the open step (`_counters.step`), and
    `store` / `worker` / `framework` / `failsafe` for the status of dropped values."""

    def __init__(self, hook: Any, opts: HookOptions, save_config: SaveConfig, reduction_config: Any, builtin_regexes: Mapping[str, Sequence[str]]):
        self._hook = hook
        self.collections = _collection_manager(opts, builtin_regexes)
        self.included: tuple[Collection, ...] = self._included(opts, save_config, reduction_config)
        self.included_names = frozenset(c.name for c in self.included)
        self._not_train_only = tuple(c for c in self.included if c.name not in TRAIN_ONLY_COLLECTIONS)
        self._warned_collections: set[str] = set()
        self._matching_cache: dict[tuple[str, tuple[str, ...]], tuple[Collection, ...]] = {}
        # plan()'s answers by (name, collections, the step's due names): a loss saved every
        # step is planned once per schedule run, not rebuilt at each step. (The included
        # collections and their reduction configs are fixed once the hook is made.)
        self._plan_cache: dict[tuple[str, tuple[str, ...], frozenset[str]], TensorPlan | None] = {}
        self.model_names: set[str] = set()
        self._unsupported: dict[str, str] = {}  # tensor name -> why it is not saved (drop_unsupported)
        self.module_classes: dict[str, str] = {}
        self.scopes: dict[str, Scope] = {}

    def _included(self, opts: HookOptions, save_config: SaveConfig, reduction_config: Any) -> tuple[Collection, ...]:
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
        included = []
        for n in dict.fromkeys(names):
            collection = self.collections.get(n)
            if n in ALWAYS_SAVED_COLLECTIONS:
                if collection.reduction_config is not None and not collection.reduction_config.is_empty:
                    logger.warning("stepscope: collection %r keeps its values whole (as smdebug does): its reduction_config is not used", n)
                collection = replace(collection, reduction_config=SCALARS_REDUCTION_CONFIG)
            included.append(
                collection.with_defaults(SCALARS_SAVE_CONFIG if opts.save_config is None and n in ALWAYS_SAVED_COLLECTIONS else save_config, reduction_config)
            )
        return tuple(included)

    def collections_for(self, mode: ModeKeys) -> tuple[Collection, ...]:
        """The included collections a step of `mode` may save."""
        return self.included if mode == ModeKeys.TRAIN else self._not_train_only

    def collection_tensor_names(self, name: str) -> set[str]:
        """The (growing) set of tensor names of included collection `name` ({} if not included)."""
        for c in self.included:
            if c.name == name:
                return c.tensor_names
        return set()

    def collections_file(self, num_workers: int) -> bytes:
        """The collections file's text: what was included, with module classes and scopes."""
        manager = CollectionManager(self.included)
        manager.module_classes.update(self.module_classes)
        manager.scopes.update(self.scopes)
        return manager.dumps(num_workers)

    # --- the model's tensors --------------------------------------------------------------

    def declare_scope(self, name: str, parameters: Iterable[str], kind: str) -> None:
        try:
            scope = make_scope(name, parameters, kind)
            self.scopes[scope.name] = merge_scope(self.scopes.get(scope.name), scope)
        except ConfigError as exc:
            logger.warning("stepscope: declare_scope ignored: %s", exc)
        except Exception as exc:  # noqa: BLE001 - a bad iterable must not break training
            logger.warning("stepscope: declare_scope(%r) ignored: %s", name, exc)

    def forget_scope(self, name: str) -> None:
        """Drop scope `name` (a plugin splitting one network into several declares them anew)."""
        self.scopes.pop(name, None)

    def matching(self, name: str, collections: tuple[str, ...]) -> tuple[Collection, ...]:
        """The included collections tensor `name` belongs to (`collections` by the plugin's
        knowledge, or by regex); the name is added to each (once: the answer is kept)."""
        key = (name, collections)
        found = self._matching_cache.get(key)
        if found is None:
            found = tuple(c for c in self.included if c.name in collections or c.matches(name))
            self._matching_cache[key] = found
            for c in found:
                c.add_tensor_name(name)
        return found

    def plan(self, name: str, collections: Iterable[str] = ()) -> TensorPlan | None:
        step = self._hook._counters.step
        if step is None or not step.due:
            return None
        key = (name, collections if collections.__class__ is tuple else tuple(collections), step.due_names)
        try:
            return self._plan_cache[key]
        except KeyError:
            pass
        plan = self._plan(*key)
        if len(self._plan_cache) >= _PLAN_CACHE_SIZE:
            self._plan_cache.clear()  # (names made anew at every step must not grow it without end)
        self._plan_cache[key] = plan
        return plan

    def _plan(self, name: str, collections: tuple[str, ...], due: frozenset[str]) -> TensorPlan | None:
        matched = [c for c in self.matching(name, collections) if c.name in due]
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

    def record(self, plan: TensorPlan, raw: Any, reduction_values: Mapping[tuple[str, bool], Any] | None, shape: Sequence[int] | None) -> None:
        step = self._hook._counters.step
        if step is None:
            return
        if plan.save_raw and raw is not None:
            step.tensors[plan.name] = raw
        for (reduction, is_abs), value in (reduction_values or {}).items():
            step.tensors[reductions.reduction_tensor_name(plan.name, reduction, is_abs)] = value
        if plan.save_shape and shape is not None:
            step.shapes[plan.name] = tuple(int(d) for d in shape)

    def record_host(self, plan: TensorPlan, array: np.ndarray) -> None:
        values = {(r, a): reductions.compute(array, r, a) for r, a in plan.reductions if array.size}
        self._hook.record(plan, array, values, array.shape)

    def save(self, plan: TensorPlan | None, name: str, value: Any, *, host_checked: bool = False) -> None:
        """Save `value` for `plan` (None: nothing due): a framework tensor by the plugin,
        anything else by numpy; a value the format cannot hold is dropped, warned once.
        `host_checked`: a numpy array here is the user's value, already checked (it is not
        the plugin's to capture: a plugin may copy arrays it discovers, not the user's)."""
        if plan is None:
            return
        hook = self._hook
        try:
            if host_checked and isinstance(value, np.ndarray):
                hook._record_host(plan, value)
            elif not hook._capture(plan, value):
                hook._record_host(plan, np.asarray(value))
        except UnsupportedValue as exc:
            self.drop_unsupported(name, value, exc)

    def save_many(self, items: Iterable[tuple[str, Any, Iterable[str]]]) -> None:
        """`save(plan(name, collections), name, value)` for each (name, value, collections)
        of a list the plugin discovered at once (a model's parameters, its gradients): the
        plugin's `_capture_many`, where it has one, copies the due values in one batch, and
        the values it leaves are saved one by one."""
        planned = []
        plan_of = self._hook.plan  # (the hook's: what a plugin or a test sees of planning)
        for name, value, collections in items:
            plan = plan_of(name, collections)
            if plan is not None:
                planned.append((plan, value))
        if not planned:
            return
        capture_many = getattr(self._hook, "_capture_many", None)
        for plan, value in planned if capture_many is None else capture_many(planned):
            self.save(plan, plan.name, value)

    def drop_unsupported(self, name: str, value: Any, exc: UnsupportedValue) -> None:
        """One value the format cannot hold costs that value only: warned once per name,
        listed in the worker's status ("degraded"); the hook and training go on."""
        if name in self._unsupported:
            return
        self._unsupported[name] = f"{type(value).__name__}: {exc}"
        logger.warning("stepscope: tensor %r is not saved: %s (%s); later steps and other tensors are unaffected", name, exc, type(value).__name__)
        hook = self._hook
        if hook.store is not None:
            hook.failsafe.call(write_status, hook.store, hook.worker, {
                "state": "degraded",
                "component": f"{hook.framework} hook ({hook.worker})",
                "error": f"{len(self._unsupported)} tensor(s) of unsupported kinds are not saved",
                "dropped_tensors": [f"{n} ({why})" for n, why in list(self._unsupported.items())[:100]],
                "time": time.time(),
                "pid": os.getpid(),
            })

    # --- the user's values ----------------------------------------------------------------

    def check_user_value(self, name: Any, value: Any) -> np.ndarray | None:
        """Refuse at the call what could only fail later, on the writer thread. Returns the
        host array of a non-framework value."""
        if not isinstance(name, str) or not name:
            raise ConfigError(f"save_tensor: the name must be a non-empty string, got {name!r}")
        try:
            name.encode("utf-8")
        except UnicodeEncodeError:
            raise ConfigError(f"save_tensor({name!r}): the name is not valid UTF-8 text (lone surrogate?)") from None
        if name in self.model_names:
            raise ConfigError(
                f"save_tensor({name!r}): the model has a tensor of that name, which the hook saves itself; "
                "give your value another name"
            )
        if self._hook._is_framework_value(value):
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

    def warn_not_included(self, name: str, names: tuple[str, ...]) -> None:
        """Warn once when none of the collections `names` is included."""
        missing = [c for c in names if c not in self.included_names]
        if missing and len(missing) == len(names) and not self._warned_collections.issuperset(missing):
            self._warned_collections.update(missing)
            logger.warning("stepscope: save_tensor(%r): collection(s) %s are not included in the hook; nothing is saved there", name, missing)


def _collection_manager(opts: HookOptions, builtin_regexes: Mapping[str, Sequence[str]]) -> CollectionManager:
    manager = CollectionManager(opts.collections, builtin_regexes=builtin_regexes)
    if opts.include_regex:
        manager.get(CollectionName.DEFAULT).include(*opts.include_regex)
    if opts.save_all:
        manager.get(CollectionName.ALL).include(".*")
    return manager


__all__ = ["TensorPlan", "TensorSaver"]
