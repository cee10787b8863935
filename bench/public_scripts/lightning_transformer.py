"""Mirrors Lightning-AI/pytorch-lightning `examples/pytorch/basics/transformer.py`: a
LightningModule around `lightning.pytorch.demos.Transformer` (embedding, positional
encoding, `nn.Transformer` encoder-decoder, linear decoder, log-softmax), `F.nll_loss`
returned by `training_step` and `validation_step`, SGD with lr 0.1, `Trainer(gradient_clip_val=0.25)`,
batch 20 of `block_size` tokens with the target shifted by one. Scaled for CPU seconds:
model width 32, 2 heads, feed-forward 32, 1 encoder and 1 decoder layer instead of
200/2/200/2, blocks of 16 tokens from a 50-token Markov chain instead of WikiText-2,
3 epochs of 80 batches.

The demo model feeds the target sequence to its decoder, so it can copy what it predicts;
it learns on any labels, which is why this program's faults are not label faults.

Faults: `lr_zero`, `divergence` (lr 100)."""

from __future__ import annotations

from pathlib import Path

from .capture import lightning_callback
from .synthetic import markov_tokens


def train(out_dir: Path, config: str, fault: str | None = None) -> None:
    import lightning.pytorch as pl
    import torch
    import torch.nn.functional as F
    from lightning.pytorch.demos import Transformer

    torch.set_num_threads(1)
    pl.seed_everything(42, verbose=False)
    vocab, block = 50, 16

    class LanguageModel(pl.LightningModule):
        def __init__(self, lr: float):
            super().__init__()
            self.lr = lr
            self.model = Transformer(vocab_size=vocab, ninp=32, nhead=2, nhid=32, nlayers=1)

        def training_step(self, batch, batch_idx):
            inputs, target = batch
            loss = F.nll_loss(self.model(inputs, target), target.view(-1))
            self.log("train_loss", loss, prog_bar=True)
            return loss

        def validation_step(self, batch, batch_idx):
            inputs, target = batch
            loss = F.nll_loss(self.model(inputs, target), target.view(-1))
            self.log("val_loss", loss, prog_bar=True)
            return loss

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=self.lr)

    def blocks(n: int, seed: int):
        stream = torch.from_numpy(markov_tokens(n * block + 1, vocab, seed=seed))
        return [(stream[i * block : (i + 1) * block], stream[i * block + 1 : (i + 1) * block + 1]) for i in range(n)]

    train_loader = torch.utils.data.DataLoader(blocks(1600, 41), batch_size=20, shuffle=True)
    val_loader = torch.utils.data.DataLoader(blocks(200, 42), batch_size=20, shuffle=False)
    lr = {"lr_zero": 0.0, "divergence": 100.0}.get(fault or "", 0.1)
    callback = lightning_callback(out_dir, config)
    trainer = pl.Trainer(
        accelerator="cpu", devices=1, max_epochs=3, gradient_clip_val=0.25, callbacks=[callback],
        default_root_dir=str(Path(out_dir) / "lightning"), enable_progress_bar=False, enable_model_summary=False,
    )
    trainer.fit(LanguageModel(lr), train_loader, val_loader)
    callback.close()
