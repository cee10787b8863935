"""`Hook`: stepscope for a hand-written PyTorch training loop, on core's `HookBase`.

The plugin part is small: the model's top-level forward and the optimizer's step say
where steps and phases begin and end (through the public driver `begin_step`,
`phase_event`, `finish_step_timing`, which the Lightning callback calls too); the model's
parameters, its modules and the registered losses are the tensors; `HostTransfer` copies
them to host. Everything else (options, schedules, saving, timeline, fail-safe) is core.

`Hook` is this module's registration, plugin contract and forward entry points, over
parts with one job each (each a base class, as core's step driver is, so that the hot
paths stay plain attribute reads on the hook): `optimizer_steps.OptimizerSteps` (the
optimizers and a GradScaler), `model_tensors.ModelTensors` (what a due step saves of the
models) and `distributed.DistributedParts` (ranks, the stop agreement, sharded tensors).

Step semantics:
- TRAIN: one step per `optimizer.step()` of a registered optimizer. With gradient
  accumulation the forwards before a step belong to it, and the saved gradients are the
  accumulated ones the optimizer used. Without a registered optimizer, every top-level
  forward in training mode is a step and gradients are read as backward accumulates them.
- EVAL / PREDICT: one step per top-level forward in that mode. The mode is the one given to
  `set_mode`, else TRAIN or EVAL from `model.training`; a forward without autograd
  (`torch.no_grad`, `inference_mode`) in training mode is EVAL, unless it comes inside an
  open TRAIN step (with registered optimizers, before `optimizer.step()`).
- The global step counts the steps of every mode (smdebug's numbering).
"""

from __future__ import annotations

import functools
import logging
import weakref
from collections.abc import Callable
from typing import Any, TypeVar

import torch
from torch import nn

from stepscope.capture.hook import StopTrainingRequested, TensorPlan
from stepscope.capture.phases import EVENT_CODES, FORWARD_BEGIN, FORWARD_END, OPTIMIZER_BEGIN, OPTIMIZER_END, Clock
from stepscope.config import CollectionName
from stepscope.exceptions import ConfigError
from stepscope.modes import ModeKeys

from . import blackbox, fastpath, naming, sharded
from .distributed import distributed_rank
from .driver import drive_forward
from .optimizer_steps import OptimizerSteps
from .timing import device_clock
from .transfer import HostTransfer

logger = logging.getLogger("stepscope")
_TRAIN, _EVAL = ModeKeys.TRAIN, ModeKeys.EVAL
# Phase-log records the hot paths append themselves (stepscope.capture.phases.PhaseLog).
_FORWARD_BEGIN, _FORWARD_END, _OPTIMIZER_BEGIN = EVENT_CODES[FORWARD_BEGIN], EVENT_CODES[FORWARD_END], EVENT_CODES[OPTIMIZER_BEGIN]
_OPTIMIZER_END = EVENT_CODES[OPTIMIZER_END]
F = TypeVar("F", bound=Callable[..., Any])

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


class Hook(OptimizerSteps):
    """Saves tensors of a PyTorch training loop. Typical use::

        hook = Hook(out_dir, include_collections=["weights", "gradients"])
        hook.register_module(model)
        hook.register_loss(loss_module)        # or: hook.save_loss(F.nll_loss(out, y))
        hook.register_optimizer(optimizer)
        ... train ...
        hook.close()

    Options: those of `stepscope.HookOptions`. After a rule asked to stop training, the
    hook raises `StopTrainingRequested` at the end of the TRAIN step (out of
    `optimizer.step()`); `hook.stop_requested` tells the same without an exception. Under
    torch.distributed (world size > 1) the ranks agree on the step to stop at with a
    one-integer all-reduce every $STEPSCOPE_STOP_AGREE_STEPS (8) TRAIN steps. With
    STEPSCOPE_DISABLE=1 every method is a no-op and no torch hook is registered."""

    framework = "pytorch"
    builtin_regexes = naming.BUILTIN_REGEXES
    notify_every_step = False  # steps where nothing is due need nothing of the plugin
    _plugin_events = frozenset({_OPTIMIZER_BEGIN, _OPTIMIZER_END})  # (forward events save nothing here)
    # What torch calls on due steps only, timed by the cost meter as the hook's own time
    # (hook_outputs.instrument): a gradient's hook, which copies it; and the saving of a
    # watched module's inputs and outputs, or of a loss that takes no routine way.
    _TIMED_CALLBACKS = ("_on_grad_accumulated", "_save_io")
    _counters: fastpath.TorchCounters  # (HookBase's, with the torch plugin's fields)

    def __init__(self, out_dir: Any = None, *args: Any, **kwargs: Any):
        self._model: nn.Module | None = None  # the first registered model (it alone may open steps of every mode)
        self._models: list[tuple[str | None, nn.Module]] = []  # every registered model, with the name it was given
        self._params: list[tuple[str, nn.Parameter]] = []
        self._scalar_params: bool | None = None  # whether a parameter or gradient name is in a scalar collection
        self._scalar_states: dict[int, tuple[int, bool]] = {}  # per optimizer: (parameters with state, whether a state is in a scalar collection)
        self._param_names: dict[int, str] = {}
        self._modules: list[tuple[str, nn.Module]] = []
        self._losses: list[tuple[str, nn.Module]] = []  # the registered loss modules
        self._hooked_losses: list[tuple[str, nn.Module]] = []  # those whose forward cannot be driven: torch hooks while due
        self._loss_forwards: dict[str, Any] = {}  # the compiled forwards of the driven loss modules (fastpath.py)
        self._losses_armed = False  # a due step is open and its forward work goes on: the loss modules save their output
        self._loss_plans: dict[str, tuple[frozenset[str], int, TensorPlan]] = {}  # model_tensors.ModelTensors._loss_ends
        self._optimizers: list[torch.optim.Optimizer] = []
        self._ending: list[torch.optim.Optimizer] = []  # the optimizers whose steps end a TRAIN step (register_optimizer)
        self._optimizer_handles: dict[int, list[Any]] = {}
        self._stepped: set[int] = set()  # ids of the ending optimizers that stepped in the open TRAIN step
        self._stepping: torch.optim.Optimizer | None = None  # the optimizer whose step is under way
        self._step_goes_on = False  # an optimizer stepped, and the TRAIN step waits for another one
        self._scaler: Any = None  # a registered torch.amp.GradScaler (register_grad_scaler)
        self._optimizers_watched: Any = None  # OptimizerSteps._watch_optimizers's hooks on every optimizer
        self._updates_watched: weakref.WeakKeyDictionary[torch.optim.Optimizer, bool] = weakref.WeakKeyDictionary()
        self._watched_optimizer: Callable[[], torch.optim.Optimizer | None] = lambda: None  # (OptimizerSteps._updates_a_watched_parameter)
        self._handles: list[Any] = []
        self._driven: nn.Module | None = None  # the model whose forward drives the steps (driver.py)
        self._driven_name: str | None = None  # its activation name, when it is one of the watched modules
        self._step_handles: list[Any] = []
        self._transfer = HostTransfer()
        super().__init__(out_dir, *args, **kwargs)
        # Collections that need module forward hooks ("default" only when include_regex
        # gave it regexes: otherwise it holds the user's own tensors).
        self._io_collections = frozenset(
            c.name for c in self.included if c.name not in _NOT_ACTIVATIONS and (c.name != CollectionName.DEFAULT or c.include_regex)
        )
        # The routine case of the four entry points below, and of steps that save only losses
        # and metrics, compiled (fastpath.py); None: Python.
        self._fast = fastpath.attach(self) if self.enabled else None
        # The black box (blackbox.py): excepthooks, the stop's, NaNs, on-demand memory snapshots.
        self._black_box = blackbox.attach(self) if self.enabled else None

    def _make_counters(self) -> fastpath.TorchCounters:
        return fastpath.make_counters(self.failsafe, self.profiler_failsafe, self.notify_every_step)

    # --- the plugin contract ------------------------------------------------------------

    def _is_framework_value(self, value: Any) -> bool:
        return isinstance(value, torch.Tensor)

    def _capture(self, plan: TensorPlan, value: Any) -> bool:
        if not isinstance(value, torch.Tensor):
            return False
        if sharded.is_sharded(value):
            self._capture_sharded(plan, value)
            return True
        raw, reduced, shape = self._transfer.capture(plan, value)
        self.record(plan, raw, reduced, shape)
        return True

    def _capture_many(self, items: list[tuple[TensorPlan, Any]]) -> list[tuple[TensorPlan, Any]]:
        # CPU tensors in one copy per dtype (transfer.py); DTensors and the rest one by one.
        batch: list[tuple[TensorPlan, Any]] = []
        rest: list[tuple[TensorPlan, Any]] = []
        for item in items:
            (rest if sharded.is_sharded(item[1]) else batch).append(item)
        return rest + self._transfer.capture_many(batch, self.record)

    def _on_step_begin(self, due: bool) -> None:
        step = self._counters.step
        assert step is not None and due
        # The loss modules' drivers save their output from now until the update.
        self._losses_armed = True
        scalars = self._only_scalars_due()
        if not scalars:
            self._save_parameters()
        watched = self._hooked_losses
        if not self._io_collections.isdisjoint(step.due_names):
            # (Not the driven model: its forward is under way; _forward_ends saves its IO.)
            watched = watched + [(n, m) for n, m in self._modules if m is not self._driven]
        if watched:
            self._step_handles += [m.register_forward_hook(functools.partial(self._on_module_io, n)) for n, m in watched]
        if not scalars and step.mode == ModeKeys.TRAIN and not self._optimizers:
            self._step_handles += self._gradient_hooks()
        if scalars and self._fast is not None:
            fastpath.compile_scalar_steps(self, step)  # this step and the next ones like it, in C

    def _adopt_step(self, losses_armed: bool) -> None:
        """The compiled path hands its open scalar step to this one (fastpath.py): the loss
        modules save their output as they did there."""
        self._losses_armed = losses_armed

    def _on_step_end(self) -> None:
        self._losses_armed = False
        if self._step_handles:
            self._remove(self._step_handles)
        step = self._counters.step
        if step is not None and step.due:  # copies are made only on steps where something is due
            self._transfer.end_step()

    def _on_phase_event(self, event: str) -> None:
        # Only on steps where something is due.
        if event == OPTIMIZER_BEGIN:
            self._save_gradients(self._own_parameters(self._stepping))
        elif event == OPTIMIZER_END:
            stepping = self._stepping
            for optimizer in self._optimizers if stepping is None or len(self._optimizers) == 1 else (stepping,):
                self._save_optimizer_state(optimizer)
            if not self._step_goes_on:
                self._forward_work_ends()

    def _on_close(self) -> None:
        self._losses_armed = False
        box = getattr(self, "_black_box", None)
        if box is not None:
            box.remove()
        self._remove(self._step_handles)
        self._remove(self._handles)
        self._unwatch_optimizers()
        for handles in self._optimizer_handles.values():
            self._remove(handles)

    def _make_detailed_profilers(self) -> Any:
        # torch.profiler, cProfile and data-loader timing in ProfilerConfig's windows (docs/traces.md).
        if not self.profiler_config.detailed or self.store is None:
            return None
        from .profiling import create_profiling

        return create_profiling(
            self.profiler_config, self.store, rank=self.rank, world_size=self.world_size,
            record_span=lambda name, start, end: self.add_timeline(name, start, end, phase=name),
        )

    # --- registration -------------------------------------------------------------------

    def register_module(self, model: nn.Module, *, name: str | None = None, drive_steps: bool = True) -> None:
        """Watch `model`: its parameters are the weights, biases and gradients; its modules'
        inputs and outputs the activations; with `drive_steps` (plain loops) its top-level
        forward also opens steps (a framework callback that knows the steps passes False).

        Several models (a GAN's generator and discriminator, a teacher and a student, an EMA
        copy) go on one hook, each with its own `name`: their tensor names start with it
        (`generator.0.weight`, `gradient/generator.0.weight`, `generator_output_0`) and
        each is a scope of its own for the rules. Only the first model's forward opens
        steps of every mode; the forward of a later one is a forward phase of the open
        step (in training mode with registered optimizers it opens a TRAIN step when none
        is open), so a teacher or EMA model run in eval mode never makes EVAL steps."""
        if not isinstance(model, nn.Module):
            raise ConfigError(f"register_module: expected a torch.nn.Module, got {type(model).__name__}")
        if name is not None and (not isinstance(name, str) or not name or "/" in name or name != name.strip()):
            raise ConfigError(f"register_module: name must be a non-empty string without '/' or surrounding spaces, got {name!r}")
        if drive_steps and isinstance(model, torch.jit.ScriptModule):  # takes no forward hook, no class swap
            raise ConfigError(
                f"register_module: the steps of a TorchScript module ({type(model).__name__}) cannot be followed from its "
                "forward; register the eager module, or pass drive_steps=False and mark steps with hook.step() / begin_step()"
            )
        for known_name, known in self._models:
            if known is model or naming.unwrap(known) is naming.unwrap(model):
                if known_name == name:
                    return  # registered again, as before: nothing changes
                raise ConfigError(f"register_module: this {type(model).__name__} is already registered (as {known_name or 'the unnamed model'!r})")
            if known_name == name:
                taken = f"name {name!r} is already taken" if name else "a model is already registered without a name"
                raise ConfigError(
                    f"register_module: {taken}; give each model of this hook its own name, e.g. "
                    "hook.register_module(generator, name='generator'); hook.register_module(discriminator, name='discriminator')"
                )
        self._models.append((name, model))
        if not self.enabled:
            return
        primary = self._model is None
        if primary:
            self._model = model
        params = naming.named_parameters(model, prefix=name)
        modules = naming.named_modules(model, prefix=name)
        clashes = sorted({n for n, _ in params} & {n for n, _ in self._params})
        if clashes:
            raise ConfigError(f"register_module: parameter names {clashes[:3]} are already taken by a registered model; give this model a name")
        self._params += params
        self._scalar_params = None
        self._param_names.update({id(p): n for n, p in params})
        self._updates_watched.clear()  # (an optimizer of this model's parameters, seen before it came, now updates watched ones)
        self._modules += modules
        self.claim_names(n for n, _ in params)
        self.claim_names(naming.gradient_name(n) for n, _ in params)
        # Which module class each parameter (and its gradient) belongs to: rules judge a
        # tensor against what is normal for its kind (an embedding, a norm layer).
        for module_name, module in naming.unwrap(model).named_modules():
            for param_name, _ in module.named_parameters(recurse=False):
                tensor = naming.prefixed(name, naming.clean_name(f"{module_name}.{param_name}" if module_name else param_name))
                self.note_module_class(tensor, type(module).__name__)
                self.note_module_class(naming.gradient_name(tensor), type(module).__name__)
        self.declare_scope(name or type(naming.unwrap(model)).__name__, [n for n, _ in params], kind="model")
        if primary and self._timer is not None:
            device = next((p.device for _, p in params), None)
            clock: Clock | None = self.profiler_failsafe.call(device_clock, device)
            if clock is not None:
                self._set_clock(clock)
        if not drive_steps:
            return
        if not primary:
            # (The Python path: the compiled one follows the first model's steps only.)
            driver = drive_forward(model, functools.partial(self._other_forward_begins, model), self._other_forward_ends)
            if driver is not None:
                self._handles.append(driver)
            else:
                self._handles.append(model.register_forward_pre_hook(lambda m, args: self._other_forward_begins(model, m)))
                self._handles.append(model.register_forward_hook(self._other_forward_ends))
            return
        # The model's own forward tells where steps begin and its forward ends (driver.py:
        # no torch hook, whose dispatch would cost more than the rest of a step where
        # nothing is due).
        driver = drive_forward(model, self._forward_begins, self._forward_ends, fast=self._fast)
        if driver is not None:
            self._handles.append(driver)
            self._driven = model
            self._driven_name = next((n for n, m in self._modules if m is model), None)
        else:  # a model whose class cannot be swapped: torch's forward hooks
            self._handles.append(model.register_forward_pre_hook(self._forward_pre_hook))
            self._handles.append(model.register_forward_hook(self._forward_ends))
        self._watch_optimizers()  # (until an optimizer is registered: its steps end the timelines)

    def split_scope(self, model: nn.Module) -> None:
        """Make each direct child of the registered `model` that holds parameters a model
        scope of its own, instead of `model` as one: a LightningModule that holds a
        generator and a discriminator (one optimizer each) is two networks to the rules."""
        name = next((n for n, m in self._models if m is model), None)
        if not self.enabled or not any(m is model for _, m in self._models):
            return
        base = naming.unwrap(model)
        self._saver.forget_scope(name or type(base).__name__)
        owned: set[str] = set()
        for child_name, child in base.named_children():
            params = [naming.prefixed(name, naming.clean_name(f"{child_name}.{p}")) for p, _ in child.named_parameters()]
            if params:
                self.declare_scope(naming.prefixed(name, child_name), params, kind="model")
                owned.update(params)
        rest = [n for n, _ in naming.named_parameters(model, prefix=name) if n not in owned]
        if rest:  # parameters of the module itself
            self.declare_scope(name or type(base).__name__, rest, kind="model")

    def register_loss(self, loss_module: nn.Module) -> nn.Module:
        """Save the output of a loss module as `<LossClass>_output_0` (losses collection).
        For a functional loss (`F.nll_loss`) use `hook.save_loss(value)` or
        `loss_fn = hook.wrap_loss(F.nll_loss)`."""
        if not isinstance(loss_module, nn.Module):
            what = getattr(loss_module, "__name__", type(loss_module).__name__)
            raise ConfigError(
                f"register_loss: expected a loss module (e.g. nn.NLLLoss()), got {what}; for a functional loss "
                f"call hook.save_loss(loss) after computing it, or use loss_fn = hook.wrap_loss({what})"
            )
        if not self.enabled:
            return loss_module
        base = type(loss_module).__name__
        taken = {name for name, _ in self._losses}
        name = base if base not in taken else next(f"{base}_{i}" for i in range(1, len(taken) + 2) if f"{base}_{i}" not in taken)
        self._losses.append((name, loss_module))
        self.claim_names([naming.activation_name(name, "output", 0)])
        # Its output is read at the end of its forward (driver.py: a torch forward hook put
        # on and taken off at every step cost more than the rest of a step that saves a loss).
        driver = drive_forward(loss_module, self._loss_begins, functools.partial(self._loss_ends, name), fast=self._fast, loss=True)
        if driver is not None:
            self._handles.append(driver)
            if self._fast is not None:
                self._loss_forwards[name] = driver.forward
        else:
            self._hooked_losses.append((name, loss_module))
        fastpath.recompile(self)
        return loss_module

    def wrap_loss(self, loss_fn: F, name: str | None = None) -> F:
        """A functional loss that also saves its value (losses collection) as
        `<name>_output_0`, `name` defaulting to the function's name: `loss_fn =
        hook.wrap_loss(F.nll_loss)`, then `loss = loss_fn(output, target)`."""
        if not callable(loss_fn):
            raise ConfigError(f"wrap_loss: expected a callable loss, got {type(loss_fn).__name__}")
        tensor_name = naming.activation_name(str(name or getattr(loss_fn, "__name__", None) or "loss"), "output", 0)

        @functools.wraps(loss_fn)
        def wrapped(*args: Any, **kwargs: Any) -> Any:
            value = loss_fn(*args, **kwargs)
            if self.due and isinstance(value, torch.Tensor) and value.numel() == 1:
                self.failsafe.call(self.save_value, tensor_name, value, (CollectionName.LOSSES,))
            return value

        return wrapped  # type: ignore[return-value]

    def snapshot_memory(self, timeout: float = 60.0) -> str | None:
        """Write the CUDA allocator's snapshot now (memory.py): taken on this thread, written
        in the background, waited for at most `timeout` seconds. Returns the key written
        under the job, or None (logged: no CUDA in this process, one still being written,
        over its size bound). `stepscope memory snapshot JOB` asks the same from outside."""
        box = getattr(self, "_black_box", None)
        if box is None:
            return None
        result = box.snapshots.take()
        result.done.wait(timeout)
        return result.key if result.done.is_set() and not result.error else None

    def set_mode(self, mode: ModeKeys | str | None) -> None:
        """Set the mode of the following steps; None goes back to `model.training`."""
        if not self.enabled:
            return
        new = None if mode is None else ModeKeys.parse(mode)
        counters = self._counters
        step = counters.step
        if new != counters.explicit_mode and step is not None and step.mode != new:
            self.end_step(raise_on_stop=False)
        counters.explicit_mode = new

    @property
    def mode(self) -> ModeKeys:
        counters = self._counters
        step = counters.step
        return step.mode if step is not None else counters.explicit_mode or ModeKeys.TRAIN

    @property
    def train_step_open(self) -> bool:
        """A TRAIN step is open and its optimizer has not stepped yet (more micro-batches
        of it may come)."""
        counters = self._counters
        if counters.step is None or counters.mode is not _TRAIN:
            return False
        # A framework callback ends the step itself (end_step) once its optimizer stepped.
        return not counters.drives_optimizer or counters.global_step - 1 == counters.train_at

    # --- torch hooks (training thread; each returns at once when nothing is due) ---------

    # The hot path: on a step where nothing is due each of these is a few attribute reads
    # and, with the timeline, a clock reading appended to the phase log. The open step is
    # the last one begun: its numbers are the counters' (`c.global_step - 1`, `c.mode`),
    # read there rather than through the shared idle step.
    # Where the extension is built, `_fastpath.c` does the routine case of these four in C
    # and calls them for every other: a change here must be made there too (the tests run
    # both paths and compare them).

    def _forward_begins(self, module: nn.Module) -> bool:
        """At the start of the driven model's forward; True when `_forward_ends` has
        something to do at its end (a step that saves, or the timeline)."""
        c = self._counters
        mode = c.explicit_mode or (_TRAIN if module.training else _EVAL)
        if mode is _TRAIN and c.explicit_mode is None and not torch.is_grad_enabled() and not self._in_train_step():
            # A forward without autograd (torch.no_grad, inference_mode) in training mode
            # trains nothing: an evaluation (a validation loop without model.eval(), a
            # prediction between optimizer steps), not a TRAIN step that no backward or
            # update follows, whose loss would read as a training loss. Inside an open TRAIN
            # step (targets computed before the update) it is a forward phase of it.
            mode = _EVAL
        if mode is _TRAIN and c.drives_optimizer:
            step = c.step
            if step is not None and c.global_step - 1 == c.train_at:
                # Another micro-batch of a step that ends at optimizer.step().
                if c.timing and self.failsafe.enabled:
                    self._log_event(_FORWARD_BEGIN)
                return bool(step.due) or bool(c.timing)
        elif not c.drives_optimizer:
            if c.step is not None and c.mode is _TRAIN:
                self.end_step()  # raises StopTrainingRequested after a stop request
        due = self._open_step(mode, _FORWARD_BEGIN)
        if mode is _TRAIN:
            c.train_at = c.global_step - 1
        return due or bool(c.timing)

    def _in_train_step(self) -> bool:
        """Whether a TRAIN step is open that the next forward belongs to (with registered
        optimizers: until optimizer.step(); without: never, each forward is a step)."""
        c = self._counters
        return bool(c.drives_optimizer) and c.step is not None and c.global_step - 1 == c.train_at

    def _forward_pre_hook(self, module: nn.Module, args: Any) -> None:
        # The driver's fallback (a class that cannot be swapped): a forward pre-hook must
        # return None to leave the arguments as they are.
        self._forward_begins(module)

    def _forward_ends(self, module: nn.Module, args: Any, output: Any) -> None:
        c = self._counters
        step = c.step
        if step is None:
            return
        if step.due and self._driven_name is not None and module is self._driven and not step.due_names.isdisjoint(self._io_collections):
            self._on_module_io(self._driven_name, module, args, output)
        if c.mode is _TRAIN:
            if c.timing:
                self._log_event(_FORWARD_END)
        else:
            self.finish_step_timing()  # an evaluation step is its forward

    def _other_forward_begins(self, model: nn.Module, module: nn.Module) -> bool:
        """At the start of a later model's forward (not the first registered): a forward
        phase of the open step; in training mode with registered optimizers it opens the
        TRAIN step when none is open (a GAN step may start with either model)."""
        c = self._counters
        if c.closed or not self.failsafe.enabled:
            return False
        mode = c.explicit_mode or (_TRAIN if module.training else _EVAL)
        step = c.step
        if mode is _TRAIN and c.drives_optimizer and (step is None or c.global_step - 1 != c.train_at):
            return self._forward_begins(module)
        if step is None or c.mode is not _TRAIN:
            return False  # an evaluation step is the first model's forward
        if c.timing:
            self._log_event(_FORWARD_BEGIN)
        return bool(c.timing)

    def _other_forward_ends(self, module: nn.Module, args: Any, output: Any) -> None:
        c = self._counters
        if c.step is not None and c.mode is _TRAIN and c.timing and self.failsafe.enabled:
            self._log_event(_FORWARD_END)

    def _on_module_io(self, name: str, module: nn.Module, args: Any, output: Any) -> None:
        """Forward hook of loss and activation modules; registered only while a step is due."""
        if self.due and self.failsafe.enabled:
            self.failsafe.call(self._save_io, name, args, output, type(module).__name__)

__all__ = ["Hook", "StopTrainingRequested", "distributed_rank"]
