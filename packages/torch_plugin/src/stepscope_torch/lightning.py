"""`StepscopeCallback`: stepscope for Lightning. A thin callback: Lightning says when a step
and its phases start and end, and the `Hook` does the rest through its public step driver
(`begin_step`, `phase_event`, `finish_step_timing`, `end_step`).

- TRAIN steps are optimizer steps (`trainer.global_step`); with accumulate_grad_batches the
  batches before an optimizer step belong to it, and gradients are saved in
  `on_before_optimizer_step`, i.e. accumulated, before clipping and the update.
- Manual optimization (`automatic_optimization = False`, e.g. a GAN with two optimizers):
  one TRAIN step per training batch, however many optimizer steps it takes
  (`trainer.global_step` counts those, and is saved as `trainer/global_step`); each
  optimizer's step saves the gradients and state of its own parameters; the time after an
  optimizer step is the next forward, not optimizer time; when `training_step` returns
  nothing, the losses it logged (`self.log("d_loss", ...)`, names containing "loss") or,
  failing those, the losses given to `manual_backward` (`loss_output_<i>`) are the losses.
- Phases: data (until the batch starts), forward (until backward starts), backward (until
  the optimizer step), optimizer (until the batch ends); evaluation: data, forward, other.
- validation and test batches are EVAL steps, predict batches PREDICT steps; the sanity
  check is not recorded.
- Metrics: `trainer.callback_metrics` logged in training are saved (metrics collection) at
  the TRAIN steps where metrics are due; those logged during a validation or test loop are
  saved in that loop's last step, in its mode, whatever the save interval, and never in
  TRAIN steps.
- Each trainer stage (fit, validate, test, predict) ends with everything published; the
  job is closed (end marker written) by `close()`, on an exception, or at interpreter exit,
  so that `fit` followed by `test` lands in one job with one step numbering.
- `state_dict` / `load_state_dict` carry the step counters in Lightning checkpoints, so
  `fit(ckpt_path=...)` continues the step numbering of the run it resumes.
"""

from __future__ import annotations

from typing import Any

import torch

try:
    import lightning.pytorch as pl
except ImportError:  # the older distribution name
    import pytorch_lightning as pl  # type: ignore[no-redef]

from stepscope.capture.hook import StopTrainingRequested
from stepscope.capture.hook_options import HookOptions
from stepscope.capture.phases import BACKWARD_BEGIN, FORWARD_BEGIN, OPTIMIZER_END
from stepscope.config import CollectionName
from stepscope.modes import ModeKeys

from .hook import Hook

_LOSS_NAME = "loss_output_0"


class StepscopeCallback(pl.Callback):
    """Same options as `Hook` (see `stepscope.HookOptions`), or one `HookOptions`; pass to
    `Trainer(callbacks=[StepscopeCallback(out_dir, ...)])`."""

    def __init__(self, out_dir: Any = None, *args: Any, **kwargs: Any):
        self.options = HookOptions.of(out_dir, *args, **kwargs)
        # Bad arguments fail here, not inside trainer.fit; the hook itself needs the
        # trainer's rank and is made in setup (in each process, so the callback pickles).
        Hook(self.options, validate_only=True)
        self.hook: Hook | None = None
        self._restored: dict[str, Any] | None = None
        self._train_step = -1  # trainer.global_step when the open TRAIN step began
        self._batch_start_step = -1  # trainer.global_step when the current batch began
        self._metrics_before: dict[str, Any] = {}
        self._eval_metrics: set[str] = set()
        self._manual = False  # the LightningModule optimizes by hand
        self._step_handles: list[Any] = []  # optimizer step post-hooks (manual optimization)
        self._backward_losses: list[torch.Tensor] = []  # losses given to backward in the open step, when due

    @classmethod
    def from_json(cls, path: str | None = None, **overrides: Any) -> StepscopeCallback:
        """A callback configured by smdebug's hook JSON (`debughookconfig.json`); without
        `path`, the file named by STEPSCOPE_HOOK_CONFIG. Keyword arguments override it."""
        return cls(HookOptions.from_json(path, **overrides))

    # --- lifecycle ------------------------------------------------------------------------

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if self.hook is None:
            self.hook = Hook(self.options, rank=trainer.global_rank, world_size=trainer.world_size, local_rank=trainer.local_rank)
            self.hook.register_module(pl_module, drive_steps=False)
            self.hook.claim_names([_LOSS_NAME])
            if self._restored is not None:
                self.hook.load_state_dict(self._restored)
                self._restored = None

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        hook = self.hook
        if hook is None or not hook.enabled:
            return
        self._manual = not pl_module.automatic_optimization
        for optimizer in trainer.optimizers:
            hook.register_optimizer(optimizer, drive_steps=False)
        if len(trainer.optimizers) > 1:  # several networks in one module (a GAN): each its own scope
            hook.split_scope(pl_module)
        if self._manual and not self._step_handles:
            # Lightning has no callback after an optimizer step: torch's post-hook says it.
            self._step_handles = [optimizer.register_step_post_hook(self._manual_step_ended) for optimizer in trainer.optimizers]

    def _manual_step_ended(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        hook = self.hook
        if hook is not None and hook.train_step_open:
            hook.optimizer_step_ends(optimizer, step_goes_on=True)  # saves its state when due
            hook.phase_event(FORWARD_BEGIN)  # what manual optimization runs next is forward work

    def __getstate__(self) -> dict[str, Any]:
        # ddp_spawn pickles callbacks into the workers; each worker makes its own hook.
        return {**self.__dict__, "hook": None, "_step_handles": [], "_backward_losses": []}

    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if self.hook is not None:
            self.hook.flush()  # what this stage recorded is readable when fit/test returns

    def on_exception(self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException) -> None:
        if self.hook is not None and isinstance(exception, Exception):  # the black box first (docs/pytorch.md)
            from .blackbox import BlackBox

            box = getattr(self.hook, "_black_box", None) or BlackBox(self.hook)  # (once per exception: the excepthook skips it then)
            box.record(exception)
        self.close()

    def close(self) -> None:
        """End the job: publish the rest and write its end marker."""
        while self._step_handles:
            self._step_handles.pop().remove()
        if self.hook is not None:
            self.hook.close()

    def state_dict(self) -> dict[str, Any]:
        if self.hook is not None:
            return self.hook.state_dict()
        return dict(self._restored or {})

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        if self.hook is not None:
            self.hook.load_state_dict(state_dict)
        else:
            self._restored = dict(state_dict)

    @property
    def _live(self) -> bool:
        return self.hook is not None and self.hook.enabled

    # --- training ---------------------------------------------------------------------------

    def on_train_batch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int) -> None:
        self._batch_start_step = trainer.global_step
        self._backward_losses = []
        hook = self.hook
        if hook is None or not hook.enabled:
            return
        if hook.train_step_open:  # another batch of an accumulated step
            hook.phase_event(FORWARD_BEGIN)
        else:
            self._train_step = trainer.global_step
            hook.begin_step(ModeKeys.TRAIN, FORWARD_BEGIN)

    def on_before_backward(self, trainer: pl.Trainer, pl_module: pl.LightningModule, loss: torch.Tensor) -> None:
        hook = self.hook
        if hook is not None:
            hook.phase_event(BACKWARD_BEGIN)
            if self._manual and hook.due and isinstance(loss, torch.Tensor) and loss.numel() == 1:
                self._backward_losses.append(loss.detach())

    def on_before_optimizer_step(self, trainer: pl.Trainer, pl_module: pl.LightningModule, optimizer: torch.optim.Optimizer) -> None:
        if self.hook is not None:
            self.hook.optimizer_step_begins(getattr(optimizer, "_optimizer", optimizer))  # (a LightningOptimizer's own)

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int) -> None:
        hook = self.hook
        if hook is None:
            return
        # The optimizer stepped in this batch: a TRAIN step ended. Counted on every rank,
        # even with the hook off, so that DDP ranks agree on the step to stop at
        # (Lightning 2.6 does not reduce `should_stop` across ranks itself).
        if trainer.global_step != self._batch_start_step and hook.train_step_ended():
            trainer.should_stop = True
            box = getattr(hook, "_black_box", None)
            if box is not None:  # the stop's black box, on every rank (they agreed on this step)
                request = hook.stop_poller.request if hook.stop_poller is not None else None
                box.on_stop(StopTrainingRequested(f"stepscope: a rule asked to stop training ({request})"))
        if not hook.enabled or trainer.global_step == self._train_step:
            return  # an accumulation batch: the step goes on
        hook.finish_step_timing()
        if not self._manual:
            hook.phase_event(OPTIMIZER_END)  # saves optimizer state when due (manual: at each optimizer's step)
        if hook.due:
            if not hook.failsafe.call(self._save_loss, outputs) and self._manual:
                hook.failsafe.call(self._save_manual_losses, trainer)
            hook.failsafe.call(self._save_metrics, trainer, self._eval_metrics)
            if hook.is_due(CollectionName.METRICS):
                hook.failsafe.call(hook.save_value, "trainer/global_step", float(trainer.global_step), (CollectionName.METRICS,))
        hook.end_step(raise_on_stop=False)

    # --- evaluation and prediction -----------------------------------------------------------

    def _loop_start(self, trainer: pl.Trainer) -> None:
        if not trainer.sanity_checking:
            self._metrics_before = dict(trainer.callback_metrics)

    def _eval_batch_start(self, trainer: pl.Trainer, mode: ModeKeys) -> None:
        if self._live and not trainer.sanity_checking:
            assert self.hook is not None
            self.hook.begin_step(mode, FORWARD_BEGIN)

    def _eval_batch_end(self, trainer: pl.Trainer, outputs: Any) -> None:
        # The step stays open: the loop's reduced metrics arrive in its last step.
        hook = self.hook
        if hook is None or not hook.enabled or trainer.sanity_checking or hook.current_step is None:
            return
        hook.finish_step_timing()
        if hook.due:
            hook.failsafe.call(self._save_loss, outputs)

    def _eval_end(self, trainer: pl.Trainer, with_metrics: bool = True) -> None:
        hook = self.hook
        if hook is None or trainer.sanity_checking:
            return
        # Metrics this loop logged (Lightning reduced them at its end): never TRAIN metrics.
        logged = {n for n, v in trainer.callback_metrics.items() if self._metrics_before.get(n) is not v} if with_metrics else set()
        self._eval_metrics |= logged
        if hook.enabled and hook.current_step is not None:
            if logged:
                hook.make_due(CollectionName.METRICS)
                hook.failsafe.call(self._save_metrics, trainer, set(), logged)
            hook.end_step(raise_on_stop=False)

    def on_validation_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._loop_start(trainer)

    def on_validation_batch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None:
        self._eval_batch_start(trainer, ModeKeys.EVAL)

    def on_validation_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None:
        self._eval_batch_end(trainer, outputs)

    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._eval_end(trainer)

    # The test loop is an evaluation loop like validation's: the same callbacks.
    on_test_start = on_validation_start
    on_test_batch_start = on_validation_batch_start
    on_test_batch_end = on_validation_batch_end
    on_test_end = on_validation_end

    def on_predict_batch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None:
        self._eval_batch_start(trainer, ModeKeys.PREDICT)

    def on_predict_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None:
        self._eval_batch_end(trainer, None)

    def on_predict_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._eval_end(trainer, with_metrics=False)

    # --- values -----------------------------------------------------------------------------

    def _save_loss(self, outputs: Any) -> bool:
        """Save the loss `training_step` returned; False when it returned none."""
        loss = outputs.get("loss") if isinstance(outputs, dict) else outputs
        if isinstance(loss, torch.Tensor) and loss.numel() == 1 and self.hook is not None:
            self.hook.save_value(_LOSS_NAME, loss, (CollectionName.LOSSES,))
            return True
        return False

    def _save_manual_losses(self, trainer: pl.Trainer) -> None:
        """Manual optimization with nothing returned: the losses the step logged, else the
        ones it gave to `manual_backward`."""
        assert self.hook is not None
        logged = {
            name: value for name, value in trainer.callback_metrics.items()
            if "loss" in name.lower() and name not in self._eval_metrics and isinstance(value, torch.Tensor) and value.numel() == 1
        }
        for name, value in logged.items():
            self.hook.save_value(name, value, (CollectionName.LOSSES,))
        if not logged:
            for i, loss in enumerate(self._backward_losses):
                self.hook.save_value(f"loss_output_{i}", loss, (CollectionName.LOSSES,))
        self._backward_losses = []

    def _save_metrics(self, trainer: pl.Trainer, skip: set[str], only: set[str] | None = None) -> None:
        assert self.hook is not None
        for name, value in trainer.callback_metrics.items():
            if name not in skip and (only is None or name in only):
                self.hook.save_value(name, value, (CollectionName.METRICS,))
