"""`StepscopeCallback` for the Hugging Face `transformers.Trainer`: one line,
`Trainer(..., callbacks=[StepscopeCallback("runs/job")])`. A thin callback like the
Lightning one: the Trainer's events say where steps and phases are, the `Hook` does the rest
on the model and optimizer the Trainer holds. Needs `transformers` (the `hf` extra); this
module imports it, the package does not.

- TRAIN steps are optimizer steps (`state.global_step`): with
  `gradient_accumulation_steps=k` the k micro-batches before an update belong to one step.
  Gradients are read in `on_pre_optimizer_step`: accumulated over the micro-batches and
  after the Trainer's clipping (`max_grad_norm`), i.e. what the optimizer uses. Weights are
  read when the step begins, optimizer state right after the update.
- Losses: `loss_output_0`, the mean of the micro-batches' losses (`outputs.loss` of the
  model's forward), as the Trainer logs it with `logging_steps=1`.
- Metrics: `learning_rate` (the rate of the update, `learning_rate/<group>` with several
  parameter groups), and what the Trainer logs (`on_log`: `loss`, `grad_norm`, ...) in the
  step just taken, when the metrics collection is due there.
- Evaluation: each `evaluate()` is one EVAL step holding the metrics it returned
  (`eval_loss`, ...), whatever the save interval, and `eval_loss` as its `loss_output_0`.
- Phases: data, forward (each micro-batch's forward), backward (until the next micro-batch
  or the update), optimizer (clipping is in the backward phase).
- Rank and world size come from the Trainer's arguments (`process_index`, `world_size`),
  so a `torchrun` / `accelerate launch` job names its workers `worker_<rank>`.
- A stop request sets `control.should_training_stop` at the end of the TRAIN step.
- When `train()` returns everything is published; the job ends (end marker) at
  `callback.close()` or interpreter exit, so a later `trainer.evaluate()` lands in the same
  job.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers import TrainerCallback

from stepscope.capture.hook_options import HookOptions
from stepscope.capture.phases import FORWARD_BEGIN, FORWARD_END, OPTIMIZER_BEGIN, OPTIMIZER_END
from stepscope.config import CollectionName
from stepscope.modes import ModeKeys

from .hook import Hook

_LOSS_NAME = "loss_output_0"


def _loss_of(output: Any) -> torch.Tensor | None:
    """The `loss` of a model's output (a ModelOutput, a dict, or a tuple starting with it)."""
    loss = output.get("loss") if isinstance(output, dict) else getattr(output, "loss", None)
    if loss is None and isinstance(output, (tuple, list)) and output and isinstance(output[0], torch.Tensor) and output[0].numel() == 1:
        loss = output[0]
    return loss if isinstance(loss, torch.Tensor) and loss.numel() == 1 else None


def _inner_optimizer(optimizer: Any) -> Any:
    """The torch optimizer inside Accelerate's `AcceleratedOptimizer` wrapper."""
    while not isinstance(optimizer, torch.optim.Optimizer) and hasattr(optimizer, "optimizer"):
        optimizer = optimizer.optimizer
    return optimizer


class StepscopeCallback(TrainerCallback):
    """Same options as `Hook` (see `stepscope.HookOptions`), or one `HookOptions`; pass to
    `Trainer(callbacks=[StepscopeCallback(out_dir, ...)])`."""

    def __init__(self, out_dir: Any = None, *args: Any, **kwargs: Any):
        self.options = HookOptions.of(out_dir, *args, **kwargs)
        Hook(self.options, validate_only=True)  # bad arguments fail here, not inside train()
        self.hook: Hook | None = None
        self._optimizer: torch.optim.Optimizer | None = None
        self._losses: list[torch.Tensor] = []
        self._handles: list[Any] = []

    # --- lifecycle ---------------------------------------------------------------------------

    def on_train_begin(self, args: Any, state: Any, control: Any, model: Any = None, optimizer: Any = None, **kwargs: Any) -> None:
        if self.hook is None:
            self.hook = Hook(self.options, rank=args.process_index, world_size=args.world_size, local_rank=args.local_process_index)
        hook = self.hook
        if not hook.enabled:
            return
        if model is not None and not self._handles:
            hook.register_module(model, drive_steps=False)
            hook.claim_names([_LOSS_NAME])
            self._handles.append(model.register_forward_pre_hook(self._forward_begins))
            self._handles.append(model.register_forward_hook(self._forward_ends))
        inner = _inner_optimizer(optimizer)
        if isinstance(inner, torch.optim.Optimizer):
            self._optimizer = inner
            hook.register_optimizer(inner, drive_steps=False)

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.hook is not None:
            self.hook.flush()  # what training recorded is readable when train() returns

    def close(self) -> None:
        """End the job: publish the rest, write its end marker, remove the model's hooks."""
        while self._handles:
            self._handles.pop().remove()
        if self.hook is not None:
            self.hook.close()

    # --- training ------------------------------------------------------------------------------

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        hook = self.hook
        if hook is not None and hook.enabled:
            self._losses = []
            hook.begin_step(ModeKeys.TRAIN, FORWARD_BEGIN)

    def on_substep_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        pass  # the next micro-batch's forward says where its phase begins

    def _forward_begins(self, module: torch.nn.Module, args: Any) -> None:
        hook = self.hook
        if hook is not None and module.training and hook.train_step_open:
            hook.phase_event(FORWARD_BEGIN)

    def _forward_ends(self, module: torch.nn.Module, args: Any, output: Any) -> None:
        hook = self.hook
        if hook is None or not module.training or not hook.train_step_open:
            return
        hook.phase_event(FORWARD_END)
        if hook.due:
            loss = _loss_of(output)
            if loss is not None:
                self._losses.append(loss.detach())

    def on_pre_optimizer_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.hook is not None:
            self.hook.phase_event(OPTIMIZER_BEGIN)  # saves the gradients when due

    def on_optimizer_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        hook = self.hook
        if hook is None:
            return
        hook.phase_event(OPTIMIZER_END)  # saves the optimizer state when due
        if hook.due:
            hook.failsafe.call(self._save_learning_rates)

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        hook = self.hook
        if hook is None:
            return
        # Counted on every rank, with the hook off too: ranks agree on the step to stop at.
        if hook.train_step_ended():
            control.should_training_stop = True
        if not hook.enabled:
            return
        hook.finish_step_timing()
        if hook.due and self._losses:
            hook.failsafe.call(self._save_loss)
        # The step stays open until the next one begins: the Trainer logs after this.

    def on_log(self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None, **kwargs: Any) -> None:
        hook = self.hook
        step = hook.current_step if hook is not None and hook.enabled else None
        if hook is None or step is None or step.mode is not ModeKeys.TRAIN or not hook.is_due(CollectionName.METRICS):
            return
        for name, value in (logs or {}).items():
            if isinstance(value, (int, float)) and not isinstance(value, bool) and not name.startswith("eval_"):
                hook.failsafe.call(hook.save_value, name, float(value), (CollectionName.METRICS,))

    def on_evaluate(self, args: Any, state: Any, control: Any, metrics: dict[str, Any] | None = None, **kwargs: Any) -> None:
        hook = self.hook
        if hook is None or not hook.enabled:
            return
        hook.begin_step(ModeKeys.EVAL)
        hook.make_due(CollectionName.METRICS)
        for name, value in (metrics or {}).items():
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                hook.failsafe.call(hook.save_value, name, float(value), (CollectionName.METRICS,))
        loss = (metrics or {}).get("eval_loss")
        if isinstance(loss, (int, float)) and not isinstance(loss, bool):
            # Also the EVAL step's loss, under the TRAIN loss's name: the loss rules compare them.
            hook.failsafe.call(hook.save_value, _LOSS_NAME, float(loss), (CollectionName.LOSSES,))
        hook.end_step(raise_on_stop=False)

    # --- values --------------------------------------------------------------------------------

    def _save_loss(self) -> None:
        assert self.hook is not None
        self.hook.save_value(_LOSS_NAME, torch.stack(self._losses).float().mean(), (CollectionName.LOSSES,))
        self._losses = []

    def _save_learning_rates(self) -> None:
        assert self.hook is not None
        if self._optimizer is None:
            return
        groups = self._optimizer.param_groups
        for i, group in enumerate(groups):
            name = "learning_rate" if len(groups) == 1 else f"learning_rate/{i}"
            lr = group.get("lr")
            if isinstance(lr, (int, float, torch.Tensor)):
                self.hook.save_value(name, float(lr), (CollectionName.METRICS,))


__all__ = ["StepscopeCallback"]
