"""`Hook`: stepscope for a hand-written PyTorch training loop.

The hook learns where steps begin and end from the model's top-level forward and the
optimizer's step, and which tensors exist from the model's parameters, its modules and
the registered loss modules. Everything else (what is due, what to save, writing) is
`stepscope.hook_core.HookCore`.

Step semantics:
- TRAIN: one step per `optimizer.step()` of a registered optimizer. With gradient
  accumulation the forwards before a step belong to it, and the saved gradients are the
  accumulated ones the optimizer used. Without a registered optimizer, every top-level
  forward in training mode is a step and gradients are read as backward accumulates them.
- EVAL / PREDICT: one step per top-level forward in that mode. The mode is the one given to
  `set_mode`, else TRAIN or EVAL from `model.training`.
- The global step counts the steps of every mode (smdebug's numbering).
"""

from __future__ import annotations

import atexit
import functools
import logging
import os
import weakref
from collections.abc import Iterable
from typing import Any

import torch
from torch import nn

from stepscope.config import Collection, CollectionName, ProfilerConfig, ReductionConfig, SaveConfig
from stepscope.hook_core import HookCore, StopTrainingRequested
from stepscope.modes import ModeKeys

from . import naming
from .timing import StepTimer
from .transfer import HostTransfer

logger = logging.getLogger("stepscope")

# Collections filled by other means than module forward hooks; when only these are due, a
# step installs no activation hooks.
_NOT_ACTIVATIONS = frozenset(
    {
        CollectionName.WEIGHTS,
        CollectionName.BIASES,
        CollectionName.GRADIENTS,
        CollectionName.OPTIMIZER_VARIABLES,
        CollectionName.LOSSES,
        CollectionName.METRICS,
    }
)
_STEP_PHASE = {ModeKeys.TRAIN: "step", ModeKeys.EVAL: "eval_step", ModeKeys.PREDICT: "predict_step", ModeKeys.GLOBAL: "step"}


def distributed_rank() -> tuple[int, int, int]:
    """(rank, world size, local rank) from torch.distributed, else torchrun's environment."""
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_rank(), torch.distributed.get_world_size(), local_rank
    return int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1)), local_rank


def _close_at_exit(ref: weakref.ref[Hook]) -> None:
    hook = ref()
    if hook is not None:
        hook.close()


class Hook:
    """Saves tensors of a PyTorch training loop. Typical use::

        hook = Hook(out_dir, include_collections=["weights", "gradients"])
        hook.register_module(model)
        hook.register_loss(loss_fn)
        hook.register_optimizer(optimizer)
        ... train ...
        hook.close()

    After a rule asked to stop training, the hook raises `StopTrainingRequested` at the end
    of the TRAIN step (out of `optimizer.step()`); `hook.stop_requested` tells the same
    without an exception. With STEPSCOPE_DISABLE=1 every method is a no-op and no torch
    hook is registered."""

    def __init__(
        self,
        out_dir: str,
        save_config: SaveConfig | None = None,
        reduction_config: ReductionConfig | None = None,
        include_collections: Iterable[str] | None = None,
        include_regex: Iterable[str] | str | None = None,
        save_all: bool = False,
        include_workers: str = "one",
        profiler_config: ProfilerConfig | None = None,
        collections: Iterable[Collection] = (),
        *,
        rank: int | None = None,
        world_size: int | None = None,
        local_rank: int | None = None,
    ):
        self.core = HookCore(out_dir, **self._core_options(
            save_config, reduction_config, include_collections, include_regex, save_all, include_workers, profiler_config, collections, rank, world_size, local_rank
        ))
        self._model: nn.Module | None = None
        self._params: list[tuple[str, nn.Parameter]] = []
        self._param_names: dict[int, str] = {}
        self._modules: list[tuple[str, nn.Module]] = []
        self._losses: list[tuple[str, nn.Module]] = []
        self._optimizers: list[torch.optim.Optimizer] = []
        self._handles: list[Any] = []
        self._step_handles: list[Any] = []
        self._explicit_mode: ModeKeys | None = None
        self._transfer = HostTransfer()
        self._timer: StepTimer | None = None
        self._warned_collections: set[str] = set()
        # The open step: its mode (None: no step open), whether anything is due, whether a
        # TRAIN step still takes forwards (its optimizer has not stepped yet).
        self._open_mode: ModeKeys | None = None
        self._due = False
        self._train_active = False
        self._timing_done = False
        # Clock tokens of the open step's boundaries.
        self._step_start: Any = None
        self._fwd_start: Any = None
        self._fwd_end: Any = None
        self._opt_start: Any = None
        self._last_end: Any = None
        self._stop_raised = False
        self._closed = False
        # Close at interpreter exit if the user did not; the weak reference keeps atexit
        # from holding the model alive.
        self._at_exit = functools.partial(_close_at_exit, weakref.ref(self))
        atexit.register(self._at_exit)

    @staticmethod
    def _core_options(
        save_config, reduction_config, include_collections, include_regex, save_all, include_workers, profiler_config, collections, rank=None, world_size=None, local_rank=None
    ) -> dict[str, Any]:
        detected = distributed_rank()
        return dict(
            framework="pytorch",
            builtin_regexes=naming.BUILTIN_REGEXES,
            save_config=save_config,
            reduction_config=reduction_config,
            include_collections=include_collections,
            include_regex=include_regex,
            save_all=save_all,
            include_workers=include_workers,
            profiler_config=profiler_config,
            collections=list(collections),
            rank=detected[0] if rank is None else rank,
            world_size=detected[1] if world_size is None else world_size,
            local_rank=detected[2] if local_rank is None else local_rank,
        )

    @classmethod
    def validate_options(cls, out_dir: str, **options: Any) -> None:
        """Check the constructor's arguments the way the constructor does (raising
        ConfigError), without starting anything or writing to out_dir."""
        defaults = dict(save_config=None, reduction_config=None, include_collections=None, include_regex=None, save_all=False,
                        include_workers="one", profiler_config=None, collections=())
        HookCore(out_dir, validate_only=True, **cls._core_options(**{**defaults, **options}))

    @classmethod
    def from_json(cls, path: str | None = None, **overrides: Any) -> Hook:
        """A hook configured by smdebug's hook JSON (`debughookconfig.json`); without `path`,
        the file named by STEPSCOPE_HOOK_CONFIG."""
        options = HookCore.options_from_json(path)
        options.update(overrides)
        return cls(**options)

    def __enter__(self) -> Hook:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # --- public API ---------------------------------------------------------------------

    @property
    def enabled(self) -> bool:
        """False once disabled (STEPSCOPE_DISABLE, a failure, or close)."""
        return self.core.failsafe.enabled and not self._closed

    @property
    def stop_requested(self) -> bool:
        return self.core.stop_requested

    @property
    def global_step(self) -> int:
        """The global step of the open step (or of the next one when none is open)."""
        return self.core.step.global_step if self.core.step is not None else self.core.global_step

    @property
    def mode(self) -> ModeKeys:
        return self._open_mode or self._explicit_mode or ModeKeys.TRAIN

    def register_module(self, model: nn.Module) -> None:
        """Watch `model`: its top-level forward delimits steps; its parameters are the
        weights, biases and gradients; its modules' inputs and outputs the activations."""
        self.attach(model, drive_steps=True)

    def attach(self, model: nn.Module, drive_steps: bool) -> None:
        """Learn `model`'s tensors; with `drive_steps`, also its forwards delimit steps
        (a framework callback that knows the steps passes False)."""
        if not self.enabled:
            return
        if self._model is not None:
            raise ValueError("register_module: a model is already registered with this hook")
        self._model = model
        self._params = naming.named_parameters(model)
        self._param_names = {id(p): name for name, p in self._params}
        self._modules = naming.named_modules(model)
        # Which module class each parameter (and its gradient) belongs to: rules judge a
        # tensor against what is normal for its kind (an embedding, a norm layer).
        for module_name, module in naming.unwrap(model).named_modules():
            for param_name, _ in module.named_parameters(recurse=False):
                name = naming.clean_name(f"{module_name}.{param_name}" if module_name else param_name)
                self.core.module_classes[name] = self.core.module_classes[naming.gradient_name(name)] = type(module).__name__
        if self.core.timeline is not None:
            device = next((p.device for _, p in self._params), None)
            self._timer = self.core.profiler_failsafe.call(StepTimer, device)
        if drive_steps:
            # Every torch hook on a module costs each call of it; the end-of-forward hook is
            # there only for the timeline.
            self._handles.append(model.register_forward_pre_hook(self._on_forward_pre))
            if self._timer is not None:
                self._handles.append(model.register_forward_hook(self._on_forward))

    def register_loss(self, loss_module: nn.Module) -> None:
        """Save the output of a loss module as `<LossClass>_output_0` (losses collection)."""
        if not self.enabled:
            return
        base = type(loss_module).__name__
        taken = {name for name, _ in self._losses}
        name = base if base not in taken else next(f"{base}_{i}" for i in range(1, len(taken) + 2) if f"{base}_{i}" not in taken)
        self._losses.append((name, loss_module))

    def register_optimizer(self, optimizer: torch.optim.Optimizer) -> None:
        """Make each `optimizer.step()` end a TRAIN step; gradients are saved right before
        the update, optimizer state (e.g. Adam's moments) right after it."""
        if not self.enabled:
            return
        self._optimizers.append(optimizer)
        self._handles += [
            optimizer.register_step_pre_hook(self._on_optimizer_pre),
            optimizer.register_step_post_hook(self._on_optimizer_post),
        ]

    def set_mode(self, mode: ModeKeys | str | None) -> None:
        """Set the mode of the following steps; None goes back to `model.training`."""
        if not self.enabled:
            return
        new = None if mode is None else ModeKeys.parse(mode)
        if new != self._explicit_mode and self._open_mode is not None and self._open_mode != new:
            self.core.failsafe.call(self._end)
        self._explicit_mode = new

    def save_tensor(self, name: str, value: Any, collections: Iterable[str] | str = (CollectionName.DEFAULT,)) -> None:
        """Save a tensor (or number, or numpy array) of the open step in `collections`,
        which must be included in the hook (include_collections / collections=)."""
        if not self.enabled:
            return
        names = (collections,) if isinstance(collections, str) else tuple(collections)
        self.core.failsafe.call(self._save_user_value, name, value, names)

    def save_scalar(self, name: str, value: Any) -> None:
        """Save a number of the open step in the metrics collection."""
        self.save_tensor(name, value, (CollectionName.METRICS,))

    def close(self) -> None:
        """Write what is left and the job's end marker; remove every torch hook."""
        if self._closed:
            return
        if self.core.failsafe.enabled:
            self.core.failsafe.call(self._end)
            if self._timer is not None:
                self.core.profiler_failsafe.call(self._publish_timeline, True)
        self._remove(self._step_handles)
        self._remove(self._handles)
        self.core.close()
        self._closed = True
        atexit.unregister(self._at_exit)

    # --- torch hooks (training thread; each returns at once when nothing is due) ---------

    def _on_forward_pre(self, module: nn.Module, args: Any) -> None:
        if not self.core.failsafe.enabled:
            return
        mode = self._explicit_mode or (ModeKeys.TRAIN if module.training else ModeKeys.EVAL)
        if mode == ModeKeys.TRAIN and self._train_active and self._optimizers:
            # Another micro-batch of a step that ends at optimizer.step().
            if self._timer is not None:
                self.core.failsafe.call(self._forward_starts, False)
            return
        if self._open_mode == ModeKeys.TRAIN and not self._optimizers:
            self._check_stop()
        self.core.failsafe.call(self._begin, mode)

    def _on_forward(self, module: nn.Module, args: Any, output: Any) -> None:
        if self._timer is not None and self.core.failsafe.enabled:
            self._fwd_end = self._timer.mark()

    def _on_module_io(self, name: str, module: nn.Module, args: Any, output: Any) -> None:
        """Forward hook of loss and activation modules; registered only while a step is due."""
        if self._due and self.core.failsafe.enabled:
            self.core.failsafe.call(self._save_io, name, args, output, type(module).__name__)

    def _on_optimizer_pre(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        if not self.core.failsafe.enabled:
            return
        self.core.failsafe.call(self._optimizer_starts)

    def _on_optimizer_post(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        if not self.core.failsafe.enabled:
            return
        self.core.failsafe.call(self._optimizer_ends, optimizer)
        self._check_stop()

    # --- steps (also driven by the Lightning callback) ----------------------------------

    def _begin(self, mode: ModeKeys) -> None:
        """Close the open step and open the next one in `mode`."""
        start = self._timer.mark() if self._timer is not None else None
        self._end()
        self._due = self.core.begin_step(mode)
        self._open_mode = mode
        self._train_active = mode == ModeKeys.TRAIN
        self._timing_done = False
        self._step_start = self._last_end if self._last_end is not None else start
        self._fwd_start = self._fwd_end = self._opt_start = None
        if self._timer is not None:
            self._timer.begin_step(self.core.step.global_step, mode)
            self._forward_starts(True)
        if not self._due:
            return
        self._save_parameters()
        watched = list(self._losses)
        if any(name not in _NOT_ACTIVATIONS for name in self.core.step.due_names):
            watched += self._modules
        self._step_handles += [m.register_forward_hook(functools.partial(self._on_module_io, n)) for n, m in watched]
        if mode == ModeKeys.TRAIN and not self._optimizers:
            self._step_handles += [
                p.register_post_accumulate_grad_hook(functools.partial(self._on_grad_accumulated, n)) for n, p in self._params if p.requires_grad
            ]

    def _finish_work(self, end: Any = None) -> None:
        """The step's work is over (the optimizer stepped, or the next step starts): stop
        capturing activations and close the step's timeline."""
        self._train_active = False
        self._remove(self._step_handles)
        if self._timer is None or self._timing_done or self._open_mode is None:
            return
        self._timing_done = True
        if end is None:
            end = self._fwd_end if self._open_mode != ModeKeys.TRAIN and self._fwd_end is not None else self._timer.mark()
        self._file_forward(end if self._open_mode == ModeKeys.TRAIN else None)
        self._timer.add_span(_STEP_PHASE[self._open_mode], self._step_start, end)
        self._timer.end_step()
        self._last_end = end

    def _end(self) -> None:
        """Hand the open step to the writer (values saved after its work ended included)."""
        if self._open_mode is None:
            return
        self._finish_work()
        self._open_mode, self._due = None, False
        self._transfer.end_step()
        self.core.end_step()
        if self._timer is not None:
            self.core.profiler_failsafe.call(self._publish_timeline, False)

    def _check_stop(self) -> None:
        if self.core.stop_requested and not self._stop_raised and self.core.failsafe.enabled:
            self._stop_raised = True
            raise StopTrainingRequested(f"stepscope: a rule asked to stop training ({self.core.stop_poller.request})")

    def _forward_starts(self, first: bool) -> None:
        if self._timer is None:
            return
        now = self._timer.mark()
        if first:
            self._timer.add_span("data", self._step_start, now)
        else:
            self._file_forward(now)
        self._fwd_start = now

    def _file_forward(self, backward_end: Any) -> None:
        """File the last forward span, and the backward that followed it until `backward_end`."""
        if self._fwd_start is None or self._fwd_end is None:
            return
        self._timer.add_span("forward", self._fwd_start, self._fwd_end)
        if backward_end is not None:
            self._timer.add_span("backward", self._fwd_end, backward_end)
        self._fwd_start = self._fwd_end = None

    def _optimizer_starts(self) -> None:
        if not self._train_active:
            self._begin(ModeKeys.TRAIN)  # optimizer.step() without a forward in this step
        if self._timer is not None:
            self._opt_start = self._timer.mark()
            self._file_forward(self._opt_start)
        if self._due:
            self._save_gradients()

    def _optimizer_ends(self, optimizer: torch.optim.Optimizer) -> None:
        if self._due:
            self._save_optimizer_state(optimizer)
        end = None
        if self._timer is not None:
            end = self._timer.mark()
            self._timer.add_span("optimizer", self._opt_start, end)
        self._finish_work(end)

    # --- what is saved -------------------------------------------------------------------

    def _capture(self, name: str, value: Any, collections: tuple[str, ...] = ()) -> None:
        plan = self.core.plan(name, collections)
        if plan is None:
            return
        if isinstance(value, torch.Tensor):
            raw, reduced, shape = self._transfer.capture(plan, value)
            self.core.record(plan, raw, reduced, shape)
        else:
            self.core.save_numpy(name, value, collections)

    def _save_user_value(self, name: str, value: Any, collections: tuple[str, ...]) -> None:
        included = {c.name for c in self.core.included}
        missing = [c for c in collections if c not in included and c not in self._warned_collections]
        if missing and len(missing) == len(collections):
            self._warned_collections.update(missing)
            logger.warning("stepscope: save_tensor(%r): collection(s) %s are not included in the hook; nothing is saved", name, missing)
        self._capture(name, value, collections)

    def _save_parameters(self) -> None:
        for name, param in self._params:
            self._capture(name, param)

    def _save_gradients(self) -> None:
        for name, param in self._params:
            if param.grad is not None:
                self._capture(naming.gradient_name(name), param.grad, (CollectionName.GRADIENTS,))

    def _on_grad_accumulated(self, name: str, param: torch.Tensor) -> None:
        if self._due and self.core.failsafe.enabled and param.grad is not None:
            self.core.failsafe.call(self._capture, naming.gradient_name(name), param.grad, (CollectionName.GRADIENTS,))

    def _save_optimizer_state(self, optimizer: torch.optim.Optimizer) -> None:
        for group in optimizer.param_groups:
            for param in group["params"]:
                name = self._param_names.get(id(param))
                if name is None:
                    continue
                for key, value in optimizer.state.get(param, {}).items():
                    if isinstance(value, torch.Tensor):
                        self._capture(naming.optimizer_state_name(name, key), value, (CollectionName.OPTIMIZER_VARIABLES,))

    def _save_io(self, module_name: str, args: Any, output: Any, module_class: str | None = None) -> None:
        for kind, value in (("input", args), ("output", output)):
            for i, tensor in enumerate(naming.flatten_tensors(value)):
                name = naming.activation_name(module_name, kind, i)
                if module_class is not None:
                    self.core.module_classes[name] = module_class
                self._capture(name, tensor)

    def _publish_timeline(self, wait: bool) -> None:
        for step, mode, spans in self._timer.ready_steps(wait):
            self.core.add_timeline_spans(spans, step=step, mode=mode)

    @staticmethod
    def _remove(handles: list[Any]) -> None:
        while handles:
            handles.pop().remove()

