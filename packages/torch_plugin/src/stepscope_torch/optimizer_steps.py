"""The torch hook's optimizers: registering them, their step hooks (a registered
optimizer's step ends the TRAIN step: gradients saved before the update, state after it;
several optimizers make one step), the optimizer events a framework callback reports, and a
GradScaler's skipped steps."""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

from stepscope.capture.phases import EVENT_CODES, OPTIMIZER_BEGIN, OPTIMIZER_END
from stepscope.config import CollectionName
from stepscope.exceptions import ConfigError
from stepscope.modes import ModeKeys

from . import fastpath
from .model_tensors import ModelTensors

_TRAIN = ModeKeys.TRAIN
_OPTIMIZER_BEGIN, _OPTIMIZER_END = EVENT_CODES[OPTIMIZER_BEGIN], EVENT_CODES[OPTIMIZER_END]


class _ScalerUpdateHook:
    """Calls `before()` at the start of each `scaler.update()` (an instance attribute over
    the class's method; `remove()` takes it away), like a torch hook handle."""

    def __init__(self, scaler: Any, before: Callable[[], None]) -> None:
        self.scaler = scaler
        update = type(scaler).update

        def hooked_update(*args: Any, **kwargs: Any) -> Any:
            before()
            return update(scaler, *args, **kwargs)

        self.hooked = hooked_update
        scaler.update = hooked_update

    def remove(self) -> None:
        if self.scaler.__dict__.get("update") is self.hooked:
            del self.scaler.update


class OptimizerSteps(ModelTensors):
    """The registered optimizers and GradScaler (a part of `Hook`, whose `__init__` sets
    the attributes below)."""

    _ending: list[torch.optim.Optimizer]
    _optimizer_handles: dict[int, list[Any]]
    _stepped: set[int]
    _stepping: torch.optim.Optimizer | None
    _step_goes_on: bool
    _optimizers_watched: Any  # the handles of `_watch_optimizers`'s hooks on every optimizer, or None
    _updates_watched: weakref.WeakKeyDictionary[torch.optim.Optimizer, bool]  # per optimizer seen: whether it updates a watched parameter
    _watched_optimizer: Callable[[], torch.optim.Optimizer | None]  # a weak reference to the last optimizer that did
    _handles: list[Any]
    _fast: Any
    _counters: fastpath.TorchCounters

    def register_optimizer(
        self, optimizer: torch.optim.Optimizer, *, name: str | None = None, drive_steps: bool = True, ends_step: bool = True
    ) -> None:
        """Make `optimizer.step()` end a TRAIN step; gradients are saved right before the
        update, optimizer state (e.g. Adam's moments) right after it. A framework callback
        that drives the steps itself passes `drive_steps=False`.

        With several optimizers (a GAN's two, one per model), each optimizer's step is a
        phase of one TRAIN step, which ends once every optimizer registered with
        `ends_step=True` (the default) has stepped since it began: a discriminator stepped
        five times and a generator once make one TRAIN step. Each optimizer's step saves
        the gradients and state of its own parameters. `ends_step=False` makes an
        optimizer's steps phases only (one that does not step every batch). `name` names
        its scope for the rules (default `optimizer_<i>`, in registration order)."""
        if not isinstance(optimizer, torch.optim.Optimizer):
            raise ConfigError(f"register_optimizer: expected a torch.optim.Optimizer, got {type(optimizer).__name__}")
        if not self.enabled or any(o is optimizer for o in self._optimizers):
            return
        self._optimizers.append(optimizer)
        params = [self._param_names[id(p)] for group in optimizer.param_groups for p in group["params"] if id(p) in self._param_names]
        self.declare_scope(name or f"optimizer_{len(self._optimizers) - 1}", params, kind="optimizer")
        if drive_steps:
            self._unwatch_optimizers()  # (its hooks end the steps' timelines now)
            self._counters.drives_optimizer = True
            self._optimizer_handles[id(optimizer)] = []
            if ends_step:
                self._ending.append(optimizer)
            self._install_optimizer_hooks()

    def _install_optimizer_hooks(self) -> None:
        """The step hooks of the step-driving optimizers: the compiled ones for one optimizer
        (the routine case), the Python ones for several (a step ends after all of them)."""
        fast = self._fast if len(self._optimizer_handles) == 1 and self._ending else None
        for optimizer in self._optimizers:
            handles = self._optimizer_handles.get(id(optimizer))
            if handles is None:
                continue
            self._remove(handles)
            handles += [
                optimizer.register_step_pre_hook(fast.optimizer_pre if fast is not None else self._on_optimizer_pre),
                optimizer.register_step_post_hook(fast.optimizer_post if fast is not None else self._on_optimizer_post),
            ]

    def _watch_optimizers(self) -> None:
        """Without a registered optimizer a TRAIN step ends at the next forward, so the wait
        for that forward's batch was timed as the step's `backward`, and the next step's
        `data` phase held nothing: a loop waiting for data half of its time read 0 % data.
        And the update itself was timed as `backward` too: an Adam step of 14 ms after a
        5 ms backward read as a 19 ms backward and no optimizer phase. So a step pre-hook
        and a post-hook on every optimizer (torch's `register_optimizer_step_pre_hook` and
        `register_optimizer_step_post_hook`) mark an optimizer that updates a watched
        parameter: its update is the step's `optimizer` phase, and once it has stepped the
        open TRAIN step's timeline ends; the step itself goes on to the next forward (what
        is saved after the update still belongs to it), and its wait for the next batch is
        the next step's `data`. Only with the step timeline on, and only until an optimizer
        is registered to end the steps (its own hooks then do it)."""
        if self._optimizers_watched is None and self._counters.now is not None and not self._counters.drives_optimizer:
            self._optimizers_watched = (
                register_optimizer_step_pre_hook(self._any_optimizer_begins),
                register_optimizer_step_post_hook(self._any_optimizer_stepped),
            )

    def _unwatch_optimizers(self) -> None:
        handles, self._optimizers_watched = self._optimizers_watched, None
        for handle in handles or ():
            handle.remove()

    def _updates_a_watched_parameter(self, optimizer: torch.optim.Optimizer) -> bool:
        """Whether `optimizer` updates a parameter of a registered module (asked once per
        optimizer); False for one whose parameters cannot be read (another make of
        optimizer: its steps leave the timeline as it was; never raise into step()). The
        last one found to update is remembered (weakly): the two hooks of a routine step
        then cost an identity check each, not a dictionary lookup."""
        try:
            updates = self._updates_watched.get(optimizer)
            if updates is None:
                names = self._param_names
                updates = any(id(p) in names for group in optimizer.param_groups for p in group["params"])
                self._updates_watched[optimizer] = updates
            if updates:
                self._watched_optimizer = weakref.ref(optimizer)
        except Exception:
            return False
        return updates

    def _any_optimizer_begins(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        c = self._counters
        if c.timing and c.mode is _TRAIN and (self._watched_optimizer() is optimizer or self._updates_a_watched_parameter(optimizer)):
            self._log_event(_OPTIMIZER_BEGIN)  # (catches its own failures: the timeline turns off, training goes on)

    def _any_optimizer_stepped(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        c = self._counters
        if c.timing and c.mode is _TRAIN and (self._watched_optimizer() is optimizer or self._updates_a_watched_parameter(optimizer)):
            self.finish_step_timing()  # (catches its own failures: the timeline turns off, training goes on)

    def optimizer_step_begins(self, optimizer: torch.optim.Optimizer) -> None:
        """For a framework callback that drives the steps: `optimizer` is about to update
        (the optimizer phase starts; its gradients are saved when due: with several
        registered optimizers, those of its own parameters)."""
        self._stepping = optimizer
        self.phase_event(OPTIMIZER_BEGIN)

    def optimizer_step_ends(self, optimizer: torch.optim.Optimizer, *, step_goes_on: bool = False) -> None:
        """For a framework callback: `optimizer` updated (its state is saved when due).
        `step_goes_on`: the TRAIN step continues (manual optimization with several
        optimizers: the next optimizer's forward comes)."""
        self._stepping = optimizer
        self._step_goes_on = step_goes_on
        try:
            self.phase_event(OPTIMIZER_END)
        finally:
            self._step_goes_on = False
            self._stepping = None

    def register_grad_scaler(self, scaler: Any) -> None:
        """Follow a `torch.amp.GradScaler` (mixed precision): gradients are saved unscaled
        and steps the scaler skips still end. With a registered optimizer the gradients are
        read in its step pre-hook, after `scaler.step` unscaled them in place (or your own
        `scaler.unscale_`); without one they are read as backward accumulates them and
        divided by the scale backward ran with. When the scaler finds inf/NaN gradients it
        skips `optimizer.step()`: the TRAIN step then ends at `scaler.update()`, saves no
        gradients and `grad_scaler/skipped_step` = 1 (metrics collection, with
        `grad_scaler/scale`, the scale in effect for the step)."""
        if not (callable(getattr(scaler, "update", None)) and callable(getattr(scaler, "scale", None)) and callable(getattr(scaler, "is_enabled", None))):
            raise ConfigError(f"register_grad_scaler: expected a torch.amp.GradScaler, got {type(scaler).__name__}")
        if not self.enabled or self._scaler is scaler:
            return
        if self._scaler is not None:
            raise ConfigError("register_grad_scaler: a GradScaler is already registered with this hook")
        self._scaler = scaler
        self._handles.append(_ScalerUpdateHook(scaler, self._on_scaler_update))

    def _on_optimizer_pre(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        if not self.failsafe.enabled:
            return
        self._stepping = optimizer
        c = self._counters
        step = c.step
        if step is None or c.global_step - 1 != c.train_at:
            # optimizer.step() without a forward in this step opens one; the event is
            # recorded, and the gradients saved when due, as below.
            self._stepped.clear()
            self._open_step(_TRAIN, _OPTIMIZER_BEGIN)
            if c.step is not None:
                c.train_at = c.global_step - 1
            return
        if c.timing:
            self._log_event(_OPTIMIZER_BEGIN)
        if step.due and not self._only_scalars_due():
            self.failsafe.call(self._on_phase_event, OPTIMIZER_BEGIN)  # saves the gradients

    def _on_optimizer_post(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        c = self._counters
        if len(self._optimizer_handles) > 1 or not self._ending:
            # Several optimizers: the TRAIN step ends once each one that ends steps stepped.
            stepped = self._stepped
            stepped.add(id(optimizer))
            if any(id(o) not in stepped for o in self._ending):
                step = c.step
                if step is not None and self.failsafe.enabled and c.global_step - 1 == c.train_at:
                    if c.timing:
                        self._log_event(_OPTIMIZER_END)
                    if step.due:
                        self._step_goes_on = True
                        self.failsafe.call(self._on_phase_event, OPTIMIZER_END)  # this optimizer's state
                        self._step_goes_on = False
                self._stepping = None
                return
            stepped.clear()
        self._train_step_ends(updated=True)

    def _train_step_ends(self, updated: bool) -> None:
        """The open TRAIN step ends: its optimizer(s) stepped (`updated`), or a GradScaler
        skipped the update."""
        c = self._counters
        # Counted before the fail-safe check: a rank whose hook turned off still takes part
        # in the ranks' stop agreement (its peers would wait for it in the all-reduce).
        # (An optimizer step always ends a TRAIN step; `train_step_ended` inlined: every step.)
        n = c.train_ends + 1
        c.train_ends = n
        stop = n >= c.stop_check_at and self._decide_stop(n)
        step = c.step
        c.train_at = -1
        if step is not None and self.failsafe.enabled:
            self.finish_step_timing()
            if step.due and updated:
                if self._only_scalars_due() and self._states_hold_no_scalars():
                    self._forward_work_ends()
                else:
                    self.failsafe.call(self._on_phase_event, OPTIMIZER_END)  # saves optimizer state
        self._stepping = None
        if stop:
            self._raise_stop()

    def _on_scaler_update(self) -> None:
        """`scaler.update()` of the registered GradScaler, before it changes the scale: the
        end of an iteration. When the scaler found inf/NaN gradients it skipped
        `optimizer.step()`, so no optimizer hook ended the TRAIN step: it ends here, marked
        `grad_scaler/skipped_step` = 1, with no gradients (they were not used)."""
        c = self._counters
        step = c.step
        if step is None or c.mode is not _TRAIN or not self.failsafe.enabled:
            return
        skipped = c.drives_optimizer and c.global_step - 1 == c.train_at
        if step.due:
            self.failsafe.call(self._save_scaler_state, skipped)
        if skipped:
            self._stepped.clear()
            self._train_step_ends(updated=False)

    def _save_scaler_state(self, skipped: bool) -> None:
        scale = self._loss_scale()
        if scale is not None:
            self.save_value("grad_scaler/scale", scale, (CollectionName.METRICS,))
        if self._counters.drives_optimizer:
            self.save_value("grad_scaler/skipped_step", np.float32(skipped), (CollectionName.METRICS,))


__all__ = ["OptimizerSteps"]
