"""Mirrors Lightning-AI/pytorch-lightning `examples/pytorch/domain_templates/generative_adversarial_net.py`:
a LightningModule with `automatic_optimization = False` holding an MLP generator (blocks of
Linear, BatchNorm1d(out, 0.8), LeakyReLU 0.2; Tanh output) and an MLP discriminator
(LeakyReLU 0.2, one logit), `binary_cross_entropy_with_logits`, two Adam optimizers (lr
2e-4, betas (0.5, 0.999)) returned by `configure_optimizers`; each batch updates the
generator (with `toggle_optimizer`), then the discriminator on real and fake images, and
logs d_loss and g_loss. Scaled for CPU seconds: hidden widths 32-64-128-256 instead of
128-1024 (generator) and 128-64 instead of 512-256 (discriminator), batch 32 instead of
64, 6 epochs (300 batches) of 1,600 synthetic 28x28 "digits" scaled to [-1, 1] instead of MNIST.

Faults: `exploding_one_network` (the discriminator's lr 2.0, 1e4 times the script's),
`nan_input` (one real batch holds a NaN)."""

from __future__ import annotations

import math
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
    img_shape, latent_dim = (1, 28, 28), 100

    class Generator(nn.Module):
        def __init__(self):
            super().__init__()

            def block(in_feat, out_feat, normalize=True):
                layers = [nn.Linear(in_feat, out_feat)]
                if normalize:
                    layers.append(nn.BatchNorm1d(out_feat, 0.8))
                layers.append(nn.LeakyReLU(0.2, inplace=True))
                return layers

            self.model = nn.Sequential(
                *block(latent_dim, 32, normalize=False), *block(32, 64), *block(64, 128), *block(128, 256),
                nn.Linear(256, math.prod(img_shape)), nn.Tanh(),
            )

        def forward(self, z):
            return self.model(z).view(z.size(0), *img_shape)

    class Discriminator(nn.Module):
        def __init__(self):
            super().__init__()
            self.model = nn.Sequential(
                nn.Linear(math.prod(img_shape), 128), nn.LeakyReLU(0.2, inplace=True), nn.Linear(128, 64), nn.LeakyReLU(0.2, inplace=True), nn.Linear(64, 1),
            )

        def forward(self, img):
            return self.model(img.view(img.size(0), -1))

    class GAN(pl.LightningModule):
        def __init__(self, lr: float = 0.0002, b1: float = 0.5, b2: float = 0.999, d_lr_factor: float = 1.0):
            super().__init__()
            self.save_hyperparameters()
            self.automatic_optimization = False
            self.generator = Generator()
            self.discriminator = Discriminator()

        def forward(self, z):
            return self.generator(z)

        def training_step(self, batch):
            (imgs,) = batch
            opt_g, opt_d = self.optimizers()
            z = torch.randn(imgs.shape[0], latent_dim).type_as(imgs)
            self.toggle_optimizer(opt_g)
            g_loss = F.binary_cross_entropy_with_logits(self.discriminator(self(z)), torch.ones(imgs.size(0), 1).type_as(imgs))
            opt_g.zero_grad()
            self.manual_backward(g_loss)
            opt_g.step()
            self.untoggle_optimizer(opt_g)
            self.toggle_optimizer(opt_d)
            real_loss = F.binary_cross_entropy_with_logits(self.discriminator(imgs), torch.ones(imgs.size(0), 1).type_as(imgs))
            fake_loss = F.binary_cross_entropy_with_logits(self.discriminator(self(z).detach()), torch.zeros(imgs.size(0), 1).type_as(imgs))
            d_loss = (real_loss + fake_loss) / 2
            opt_d.zero_grad()
            self.manual_backward(d_loss)
            opt_d.step()
            self.untoggle_optimizer(opt_d)
            self.log_dict({"d_loss": d_loss, "g_loss": g_loss})

        def configure_optimizers(self):
            hp = self.hparams
            opt_g = torch.optim.Adam(self.generator.parameters(), lr=hp.lr, betas=(hp.b1, hp.b2))
            opt_d = torch.optim.Adam(self.discriminator.parameters(), lr=hp.lr * hp.d_lr_factor, betas=(hp.b1, hp.b2))
            return opt_g, opt_d

    images = torch.from_numpy(digits(1600, seed=3)[0] * 2 - 1)
    if fault == "nan_input":
        images[700, 0, 10, 10] = float("nan")
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(images), batch_size=32, shuffle=True)
    callback = lightning_callback(out_dir, config)
    trainer = pl.Trainer(
        accelerator="cpu", devices=1, max_epochs=6, callbacks=[callback],
        default_root_dir=str(Path(out_dir) / "lightning"), enable_progress_bar=False, enable_model_summary=False,
    )
    trainer.fit(GAN(d_lr_factor=1e4 if fault == "exploding_one_network" else 1.0), loader)
    callback.close()
