"""Mirrors Lightning-AI/pytorch-lightning `examples/pytorch/basics/autoencoder.py`: LitAutoEncoder
with an encoder 784-64-3 and a decoder 3-64-784 (ReLU inside), the loss `F.mse_loss` between
the flattened image and its reconstruction, returned by `training_step` and
`validation_step` and logged on every step, Adam with lr 1e-2 (the script's `10e-3`),
batch 32, a validation pass every epoch. Scaled for CPU seconds: 4 epochs of 2,048
synthetic 28x28 "digits" in [0, 1] (MNIST's ink density) instead of MNIST (the script runs 10);
4 (256 optimizer steps) so that the quick start's interval of 100 saves layer outputs three
times, as DeadRelu needs (3 epochs saved them at steps 0 and 100 only).

Faults: `lr_zero`, `dead_relu` (the encoder's first layer bias at -20)."""

from __future__ import annotations

from pathlib import Path

from .capture import lightning_callback
from .synthetic import digits


def train(out_dir: Path, config: str, fault: str | None = None) -> None:
    import lightning.pytorch as pl
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    torch.set_num_threads(1)
    pl.seed_everything(42, verbose=False)

    class LitAutoEncoder(pl.LightningModule):
        def __init__(self, hidden_dim: int = 64, learning_rate: float = 10e-3):
            super().__init__()
            self.save_hyperparameters()
            self.encoder = nn.Sequential(nn.Linear(28 * 28, hidden_dim), nn.ReLU(), nn.Linear(hidden_dim, 3))
            self.decoder = nn.Sequential(nn.Linear(3, hidden_dim), nn.ReLU(), nn.Linear(hidden_dim, 28 * 28))

        def forward(self, x):
            return self.decoder(self.encoder(x))

        def _common_step(self, batch, stage: str):
            x = batch[0].view(batch[0].size(0), -1)
            loss = F.mse_loss(x, self(x))
            self.log(f"{stage}_loss", loss, on_step=True)
            return loss

        def training_step(self, batch, batch_idx):
            return self._common_step(batch, "train")

        def validation_step(self, batch, batch_idx):
            return self._common_step(batch, "val")

        def configure_optimizers(self):
            return torch.optim.Adam(self.parameters(), lr=self.hparams.learning_rate)

    def loader(n: int, seed: int, shuffle: bool):
        images = torch.from_numpy(digits(n, seed=seed)[0])
        return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(images), batch_size=32, shuffle=shuffle)

    model = LitAutoEncoder(learning_rate=0.0 if fault == "lr_zero" else 10e-3)
    if fault == "dead_relu":
        with torch.no_grad():
            model.encoder[0].bias.fill_(-20.0)
    callback = lightning_callback(out_dir, config)
    trainer = pl.Trainer(
        accelerator="cpu", devices=1, max_epochs=4, callbacks=[callback], default_root_dir=str(Path(out_dir) / "lightning"),
        enable_progress_bar=False, enable_model_summary=False,
    )
    trainer.fit(model, loader(2048, 31, True), loader(512, 32, False))
    callback.close()
