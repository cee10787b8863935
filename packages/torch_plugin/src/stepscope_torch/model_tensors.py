"""What the torch hook saves of its models at a step where something is due: parameters,
gradients (read before the update, or as backward accumulates them), optimizer state, the
inputs and outputs of watched modules, and the registered loss modules' outputs (a 0-d CPU
loss read with `.item()`); and which of these walks a step that saves only losses and
metrics can skip."""

from __future__ import annotations

import functools
from typing import Any

import numpy as np
import torch
from torch import nn

from stepscope.capture.hook import TensorPlan
from stepscope.config import ROUTINE_COLLECTIONS, CollectionName

from . import naming
from .distributed import DistributedParts
from .transfer import HostTransfer, host_tensor

# Dtypes whose 0-d CPU tensors (a loss, a metric) are read with .item() into numpy: exact
# (the Python number holds every value of these).
PLAIN_SCALARS = {torch.float32: np.float32, torch.float64: np.float64, torch.float16: np.float16, torch.int64: np.int64, torch.int32: np.int32}


class ModelTensors(DistributedParts):
    """The watched models' tensors, saved into the open step (a part of `Hook`, whose
    `__init__` and `register_*` methods set the attributes below)."""

    _params: list[tuple[str, nn.Parameter]]
    _param_names: dict[int, str]
    _scalar_params: bool | None
    _scalar_states: dict[int, tuple[int, bool]]
    _optimizers: list[torch.optim.Optimizer]
    _scaler: Any
    _losses_armed: bool
    _loss_plans: dict[str, tuple[frozenset[str], int, TensorPlan]]  # per loss: what _loss_ends saves in the routine case
    _step_handles: list[Any]
    _transfer: HostTransfer

    def _forward_work_ends(self) -> None:
        """The update of a due TRAIN step is over: activations and losses computed after it
        belong to no step."""
        self._losses_armed = False
        if self._step_handles:
            self._remove(self._step_handles)

    def _only_scalars_due(self) -> bool:
        """Whether only routine collections (losses, metrics, the default collection) are
        due at the open step (every step under the capture defaults, or under a save_config
        of every step) and no parameter or gradient belongs to them: the walks over the
        parameters and gradients then have nothing to save and are skipped."""
        step = self._counters.step
        if step is None or not step.due_names <= ROUTINE_COLLECTIONS:
            return False
        if self._scalar_params is None:
            self._scalar_params = any(
                c.name in ROUTINE_COLLECTIONS
                for name, _ in self._params
                for tensor, collections in ((name, naming.parameter_collections(name)), (naming.gradient_name(name), (CollectionName.GRADIENTS,)))
                for c in self._saver.matching(tensor, collections)
            )
        return not self._scalar_params

    def _save_parameters(self) -> None:
        if self._only_scalars_due():
            return
        self.save_values([(name, param, naming.parameter_collections(name)) for name, param in self._params])

    def _own_parameters(self, optimizer: torch.optim.Optimizer | None) -> list[tuple[str, nn.Parameter]]:
        """The watched parameters `optimizer` updates; all of them with one optimizer or none
        known (gradients of parameters no optimizer holds are saved too)."""
        if optimizer is None or len(self._optimizers) < 2:
            return self._params
        names = self._param_names
        return [(names[id(p)], p) for group in optimizer.param_groups for p in group["params"] if id(p) in names]

    def _save_gradients(self, params: list[tuple[str, nn.Parameter]] | None = None) -> None:
        if self._only_scalars_due():
            return
        gradients = (CollectionName.GRADIENTS,)
        self.save_values([(naming.gradient_name(name), p.grad, gradients) for name, p in (self._params if params is None else params) if p.grad is not None])

    def _gradient_hooks(self) -> list[Any]:
        """At a due TRAIN step without a registered optimizer: a post-accumulate hook on each
        parameter whose gradient a due collection saves, holding that gradient's plan for
        the step (made once here, not asked again from each hook). A parameter whose
        gradient nothing saves at this step (weights alone are due) gets none: backward
        then calls no Python for it."""
        handles = []
        gradients = (CollectionName.GRADIENTS,)
        for name, param in self._params:
            if param.requires_grad:
                plan = self.plan(naming.gradient_name(name), gradients)
                if plan is not None:
                    handles.append(param.register_post_accumulate_grad_hook(functools.partial(self._on_grad_accumulated, plan)))
        return handles

    def _on_grad_accumulated(self, plan: TensorPlan, param: torch.Tensor) -> None:
        grad = param.grad
        step = self._counters.step
        if grad is None or step is None or not step.due:
            return
        if self._scaler is None and host_tensor(grad):
            # The routine case (a CPU gradient, nothing to unscale): snapshotted and recorded
            # here, not through the general path's layers, which cost each hook several
            # times the Python where backward has the caches.
            self.failsafe.call(self._record_host_gradient, plan, grad)
        else:
            self.failsafe.call(self._save_gradient, plan, grad)

    def _record_host_gradient(self, plan: TensorPlan, grad: torch.Tensor) -> None:
        self.record(plan, *self._transfer.capture_host(plan, grad))

    def _save_gradient(self, plan: TensorPlan, grad: torch.Tensor) -> None:
        # Backward under a GradScaler accumulates scaled gradients: saved divided by the
        # scale backward ran with (a power of two: exact), so they read as the true ones.
        scale = self._loss_scale()
        self._saver.save(plan, plan.name, grad if scale is None else grad / scale)

    def _loss_scale(self) -> torch.Tensor | None:
        """The registered GradScaler's scale now, as a 0-d tensor on its device (no sync)."""
        scaler = self._scaler
        if scaler is None or not scaler.is_enabled():
            return None
        scale = getattr(scaler, "_scale", None)
        if not isinstance(scale, torch.Tensor):
            return None  # scale() not called yet: nothing was scaled
        return scale.reshape(())

    def save_optimizer_state(self, optimizer: torch.optim.Optimizer) -> None:
        """Save `optimizer`'s per-parameter state (optimizer_variables) at the open step."""
        if self.due:
            self.failsafe.call(self._save_optimizer_state, optimizer)

    def _save_optimizer_state(self, optimizer: torch.optim.Optimizer) -> None:
        if self._only_scalars_due():
            # Known (for this many parameters with state) to hold no name of a scalar collection.
            known = self._scalar_states.get(id(optimizer))
            if known is not None and known == (len(optimizer.state), False):
                return
        states = self._optimizer_states(optimizer)
        if self._only_scalars_due() and not self._scalar_states[id(optimizer)][1]:
            return
        self.save_values([(name, value, (CollectionName.OPTIMIZER_VARIABLES,)) for name, value in states])

    def _states_hold_no_scalars(self) -> bool:
        """Whether the optimizers' states are known (for their number of parameters with
        state) to hold no name of a scalar collection: a step that saves only scalars then
        has nothing to save of them."""
        known = self._scalar_states
        for optimizer in self._optimizers:
            if known.get(id(optimizer)) != (len(optimizer.state), False):
                return False
        return True

    def _optimizer_states(self, optimizer: torch.optim.Optimizer) -> list[tuple[str, torch.Tensor]]:
        """(name, tensor) of `optimizer`'s per-parameter state; notes (per optimizer and
        number of parameters with state) whether a name is in a scalar collection."""
        states = []
        for group in optimizer.param_groups:
            for param in group["params"]:
                name = self._param_names.get(id(param))
                if name is None:
                    continue
                for key, value in optimizer.state.get(param, {}).items():
                    if isinstance(value, torch.Tensor):
                        states.append((naming.optimizer_state_name(name, key), value))
        scalar = any(c.name in ROUTINE_COLLECTIONS for n, _ in states for c in self._saver.matching(n, (CollectionName.OPTIMIZER_VARIABLES,)))
        self._scalar_states[id(optimizer)] = (len(optimizer.state), scalar)
        return states

    def _loss_begins(self, module: nn.Module) -> bool:
        """At the start of a registered loss module's forward: whether its end saves."""
        return self._losses_armed

    def _loss_ends(self, name: str, module: nn.Module, args: Any, output: Any) -> None:
        if not (self._losses_armed and self.failsafe.enabled):
            return
        # The routine case (every step under the capture defaults): the same due collections
        # and arguments as a step before, whose inputs nothing saves, and a 0-d CPU loss.
        known = self._loss_plans.get(name)
        step = self._counters.step
        if known is not None and step is not None and known[0] is step.due_names and args.__class__ is tuple and len(args) == known[1]:
            for arg in args:
                if arg.__class__ is not torch.Tensor:
                    break
            else:
                try:
                    if self._record_scalar(known[2], output):
                        return
                except Exception as exc:  # the contract: nothing escapes into training
                    self.failsafe.fail(exc)
                    return
        self.failsafe.call(self._save_io, name, args, output, type(module).__name__)
        self.failsafe.call(self._learn_loss_plan, name, args, output)

    def _learn_loss_plan(self, name: str, args: Any, output: Any) -> None:
        """Remember for `_loss_ends` what loss `name` saves at the open step's due
        collections when its arguments are plain tensors that no due collection saves and
        its output is one plain tensor: then only that output's plan."""
        step = self._counters.step
        saver = self._saver
        if step is None or args.__class__ is not tuple or output.__class__ is not torch.Tensor or any(a.__class__ is not torch.Tensor for a in args):
            return
        if any(saver.plan(naming.activation_name(name, "input", i), ()) is not None for i in range(len(args))):
            return
        plan = saver.plan(naming.activation_name(name, "output", 0), ())
        if plan is not None and len(self._loss_plans) < 64:  # (a few due sets per loss: a schedule's runs)
            self._loss_plans[name] = (step.due_names, len(args), plan)

    def _save_io(self, module_name: str, args: Any, output: Any, module_class: str) -> None:
        saver = self._saver
        classes = saver.module_classes
        for kind, value in (("input", args), ("output", output)):
            for i, tensor in enumerate(naming.flatten_tensors(value)):
                name = naming.activation_name(module_name, kind, i)
                classes[name] = module_class
                if not saver.matching(name, ()):
                    continue  # (no included collection holds it: a loss module's inputs, mostly)
                plan = saver.plan(name, ())
                if plan is not None and not self._record_scalar(plan, tensor):
                    saver.save(plan, name, tensor)

    def _record_scalar(self, plan: TensorPlan, tensor: torch.Tensor) -> bool:
        """Record a 0-d CPU tensor of a plain dtype (a loss) by reading its value (on the
        CPU `.item()` waits for nothing), without the general capture's checks and copies;
        False for anything else (a GPU loss is copied without a sync, by `_capture`)."""
        if plan.reductions or tensor.__class__ is not torch.Tensor or not tensor.is_cpu or tensor.dim() or tensor.layout is not torch.strided:
            return False
        to_numpy = PLAIN_SCALARS.get(tensor.dtype)
        if to_numpy is None:
            return False
        # What TensorSaver.record does for a value with no reductions and shape (), inlined:
        # this runs at every step under the capture defaults.
        step = self._counters.step
        if step is not None:
            if plan.save_raw:
                step.tensors[plan.name] = to_numpy(tensor.item())  # type: ignore[arg-type]
            if plan.save_shape:
                step.shapes[plan.name] = ()
        return True

    @staticmethod
    def _remove(handles: list[Any]) -> None:
        while handles:
            handles.pop().remove()


__all__ = ["ModelTensors"]
