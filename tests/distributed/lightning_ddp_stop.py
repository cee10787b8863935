"""A Lightning fit with DDP on 2 CPU ranks (gloo, ddp_spawn) where only rank 0 ever sees a
stop request (run as a script): `python lightning_ddp_stop.py OUT_DIR RESULT_PREFIX`.
Each rank writes the global step it stopped at to RESULT_PREFIX.<rank>."""

from __future__ import annotations

import sys
import warnings

import lightning.pytorch as pl
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from stepscope.capture.control import request_stop
from stepscope.config import ProfilerConfig, SaveConfig
from stepscope_torch.lightning import StepscopeCallback

REQUEST_AT = 3  # rank 0's batch index at which the request is written and seen


class _Model(pl.LightningModule):
    def __init__(self, result_prefix: str):
        super().__init__()
        self.layer = nn.Linear(4, 1)
        self.result_prefix = result_prefix

    def training_step(self, batch, batch_idx):
        if self.global_rank == 0 and batch_idx == REQUEST_AT:
            callback = next(c for c in self.trainer.callbacks if isinstance(c, StepscopeCallback))
            request_stop(callback.hook.store, rule="ExplodingTensor", reason="planted")
            callback.hook.stop_poller.check_now()  # this rank sees it now; rank 1's poller never looks
        x, y = batch
        return nn.functional.mse_loss(self.layer(x), y)

    def on_train_end(self):
        with open(f"{self.result_prefix}.{self.global_rank}", "w") as f:
            f.write(str(self.trainer.global_step))

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


def main(out_dir: str, result_prefix: str) -> None:
    warnings.filterwarnings("ignore")
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(400, 4), torch.randn(400, 1))
    callback = StepscopeCallback(out_dir, save_config=SaveConfig(save_interval=1), include_collections=["losses"],
                                 include_workers="all", profiler_config=ProfilerConfig.disabled())
    trainer = pl.Trainer(accelerator="cpu", devices=2, strategy="ddp_spawn", max_epochs=1, callbacks=[callback], logger=False,
                         enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0)
    trainer.fit(_Model(result_prefix), DataLoader(data, batch_size=4))
    callback.close()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
