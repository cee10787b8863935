"""`StepscopeCallback`: stepscope for Lightning. A thin callback: Lightning says when a step
starts and ends; the `Hook` does the saving.

- TRAIN steps are optimizer steps (`trainer.global_step`); with accumulate_grad_batches the
  batches before an optimizer step belong to it, and gradients are saved in
  `on_before_optimizer_step`, i.e. accumulated, before clipping and the update.
- validation and test batches are EVAL steps, predict batches PREDICT steps; the sanity
  check is not recorded.
- `trainer.callback_metrics` are saved as scalars (metrics collection) at TRAIN step ends
  and, for validation and test, in the last step of the loop, once Lightning has reduced
  the epoch's metrics.
- Each trainer stage (fit, validate, test, predict) ends with everything published; the
  job is closed (end marker written) by `close()`, on an exception, or at interpreter exit,
  so that `fit` followed by `test` lands in one job with one step numbering.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch

try:
    import lightning.pytorch as pl
except ImportError:  # the older distribution name
    import pytorch_lightning as pl  # type: ignore[no-redef]

from stepscope.config import Collection, CollectionName, ProfilerConfig, ReductionConfig, SaveConfig
from stepscope.modes import ModeKeys

from .hook import Hook

_LOSS_NAME = "loss_output_0"


class StepscopeCallback(pl.Callback):
    """Same options as `Hook`; pass to `Trainer(callbacks=[StepscopeCallback(out_dir, ...)])`."""

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
    ):
        self._options = dict(
            out_dir=out_dir,
            save_config=save_config,
            reduction_config=reduction_config,
            include_collections=include_collections,
            include_regex=include_regex,
            save_all=save_all,
            include_workers=include_workers,
            profiler_config=profiler_config,
            collections=list(collections),
        )
        # Bad arguments fail here, not inside trainer.fit; the hook itself needs the
        # trainer's rank and is made in setup (in each process, so the callback pickles).
        Hook.validate_options(**self._options)
        self.hook: Hook | None = None
        self._train_global_step = -1

    # --- lifecycle ------------------------------------------------------------------------

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if self.hook is None:
            self.hook = Hook(**self._options, rank=trainer.global_rank, world_size=trainer.world_size, local_rank=trainer.local_rank)
            self.hook.attach(pl_module, drive_steps=False)

    def __getstate__(self) -> dict[str, Any]:
        # ddp_spawn pickles callbacks into the workers; each worker makes its own hook.
        return {**self.__dict__, "hook": None}

    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if self._live:
            self._call(self.hook._end)
            self.hook.core.flush()

    def on_exception(self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException) -> None:
        self.close()

    def close(self) -> None:
        """End the job: publish the rest and write its end marker."""
        if self.hook is not None:
            self.hook.close()

    @property
    def _live(self) -> bool:
        return self.hook is not None and self.hook.enabled

    def _call(self, fn: Any, *args: Any) -> Any:
        return self.hook.core.failsafe.call(fn, *args)

    # --- training ---------------------------------------------------------------------------

    def on_train_batch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int) -> None:
        if not self._live:
            return
        if self.hook._open_mode != ModeKeys.TRAIN or not self.hook._train_active:
            self._train_global_step = trainer.global_step
            self._call(self.hook._begin, ModeKeys.TRAIN)
        elif self.hook._timer is not None:
            self._call(self.hook._forward_starts, False)  # another batch of an accumulated step

    def on_before_backward(self, trainer: pl.Trainer, pl_module: pl.LightningModule, loss: torch.Tensor) -> None:
        if self._live and self.hook._timer is not None:
            self.hook._fwd_end = self.hook._timer.mark()

    def on_before_optimizer_step(self, trainer: pl.Trainer, pl_module: pl.LightningModule, optimizer: torch.optim.Optimizer) -> None:
        if self._live:
            self._call(self.hook._optimizer_starts)

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int) -> None:
        if not self._live:
            return
        if trainer.global_step == self._train_global_step:
            return  # an accumulation batch: the step goes on
        self._call(self._end_train_step, trainer, outputs)
        if self.hook.core.stop_requested:
            trainer.should_stop = True

    def _end_train_step(self, trainer: pl.Trainer, outputs: Any) -> None:
        hook = self.hook
        if hook._due:
            for optimizer in trainer.optimizers:
                hook._save_optimizer_state(optimizer)
            self._save_loss(outputs)
            self._save_metrics(trainer)
        hook._finish_work()
        hook._end()

    # --- evaluation and prediction -----------------------------------------------------------

    def _eval_batch_start(self, trainer: pl.Trainer, mode: ModeKeys) -> None:
        if self._live and not trainer.sanity_checking:
            self._call(self.hook._begin, mode)

    def _eval_batch_end(self, trainer: pl.Trainer, outputs: Any) -> None:
        # The step stays open: the loop's reduced metrics arrive in its last step.
        if self._live and not trainer.sanity_checking and self.hook._open_mode is not None:
            if self.hook._timer is not None:
                self.hook._fwd_end = self.hook._timer.mark()
            if self.hook._due:
                self._call(self._save_loss, outputs)

    def _eval_end(self, trainer: pl.Trainer) -> None:
        if self._live and not trainer.sanity_checking and self.hook._open_mode is not None:
            if self.hook._due:
                self._call(self._save_metrics, trainer)
            self._call(self.hook._end)

    def on_validation_batch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None:
        self._eval_batch_start(trainer, ModeKeys.EVAL)

    def on_validation_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None:
        self._eval_batch_end(trainer, outputs)

    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._eval_end(trainer)

    def on_test_batch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None:
        self._eval_batch_start(trainer, ModeKeys.EVAL)

    def on_test_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None:
        self._eval_batch_end(trainer, outputs)

    def on_test_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._eval_end(trainer)

    def on_predict_batch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None:
        self._eval_batch_start(trainer, ModeKeys.PREDICT)

    def on_predict_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None:
        self._eval_batch_end(trainer, None)

    def on_predict_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._eval_end(trainer)

    # --- values -----------------------------------------------------------------------------

    def _save_loss(self, outputs: Any) -> None:
        loss = outputs.get("loss") if isinstance(outputs, dict) else outputs
        if isinstance(loss, torch.Tensor) and loss.numel() == 1:
            self.hook._capture(_LOSS_NAME, loss, (CollectionName.LOSSES,))

    def _save_metrics(self, trainer: pl.Trainer) -> None:
        for name, value in trainer.callback_metrics.items():
            self.hook._capture(name, value, (CollectionName.METRICS,))
