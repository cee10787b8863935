"""Mirrors pytorch/examples `dcgan/main.py`: a transposed-convolution generator (BatchNorm,
ReLU, Tanh output) and a convolutional discriminator (LeakyReLU 0.2, BatchNorm, Sigmoid
output), both initialised N(0, 0.02) (BatchNorm scales N(1, 0.02)), `nn.BCELoss`, two Adam
optimizers with lr 2e-4 and betas (0.5, 0.999); each iteration updates the discriminator on
a real and a fake batch, then the generator with real labels. Scaled for CPU seconds: 32x32
images (one transposed convolution fewer than the 64x64 script), 8 filters instead of 64,
batch 32, 100 iterations over synthetic images in [-1, 1] (mixtures of smooth components)
instead of a photo data set.

Both networks are registered by name as docs/pytorch.md says for several models
(`register_module(net, name=...)`), and both optimizers (each `optimizer.step()` is one
TRAIN step); the
losses are saved by hand (`hook.save_loss`) as the script prints them, Loss_D and Loss_G.

Faults: `exploding_one_network` (the discriminator's lr 2.0, 1e4 times the script's),
`zero_init` (every parameter initialised to 0 instead of `weights_init`; a NaN batch does
not fit here: `nn.BCELoss` raises on a NaN probability, so the run stops with an error)."""

from __future__ import annotations

from pathlib import Path

from .capture import torch_hook
from .synthetic import generated_images


def train(out_dir: Path, config: str, fault: str | None = None) -> None:
    import torch
    import torch.nn as nn

    torch.set_num_threads(1)
    torch.manual_seed(999)
    nz, ngf, ndf, nc, batch = 100, 8, 8, 3, 32

    def weights_init(m):
        if isinstance(m, (nn.Conv2d, nn.ConvTranspose2d)):
            nn.init.normal_(m.weight, 0.0, 0.02)
        elif isinstance(m, nn.BatchNorm2d):
            nn.init.normal_(m.weight, 1.0, 0.02)
            nn.init.zeros_(m.bias)

    class Generator(nn.Module):
        def __init__(self):
            super().__init__()
            self.main = nn.Sequential(
                nn.ConvTranspose2d(nz, ngf * 4, 4, 1, 0, bias=False), nn.BatchNorm2d(ngf * 4), nn.ReLU(True),
                nn.ConvTranspose2d(ngf * 4, ngf * 2, 4, 2, 1, bias=False), nn.BatchNorm2d(ngf * 2), nn.ReLU(True),
                nn.ConvTranspose2d(ngf * 2, ngf, 4, 2, 1, bias=False), nn.BatchNorm2d(ngf), nn.ReLU(True),
                nn.ConvTranspose2d(ngf, nc, 4, 2, 1, bias=False), nn.Tanh(),
            )

        def forward(self, z):
            return self.main(z)

    class Discriminator(nn.Module):
        def __init__(self):
            super().__init__()
            self.main = nn.Sequential(
                nn.Conv2d(nc, ndf, 4, 2, 1, bias=False), nn.LeakyReLU(0.2, inplace=True),
                nn.Conv2d(ndf, ndf * 2, 4, 2, 1, bias=False), nn.BatchNorm2d(ndf * 2), nn.LeakyReLU(0.2, inplace=True),
                nn.Conv2d(ndf * 2, ndf * 4, 4, 2, 1, bias=False), nn.BatchNorm2d(ndf * 4), nn.LeakyReLU(0.2, inplace=True),
                nn.Conv2d(ndf * 4, 1, 4, 1, 0, bias=False), nn.Sigmoid(),
            )

        def forward(self, x):
            return self.main(x).view(-1, 1).squeeze(1)

    netG, netD = Generator(), Discriminator()
    netG.apply(weights_init)
    netD.apply(weights_init)
    if fault == "zero_init":
        with torch.no_grad():
            for p in list(netG.parameters()) + list(netD.parameters()):
                p.zero_()
    criterion = nn.BCELoss()
    optimizerD = torch.optim.Adam(netD.parameters(), lr=2.0 if fault == "exploding_one_network" else 2e-4, betas=(0.5, 0.999))
    optimizerG = torch.optim.Adam(netG.parameters(), lr=2e-4, betas=(0.5, 0.999))
    data = torch.from_numpy(generated_images(1600, (nc, 32, 32), seed=5))
    generator = torch.Generator().manual_seed(5)
    with torch_hook(out_dir, config) as hook:
        hook.register_module(netG, name="netG")
        hook.register_module(netD, name="netD")
        hook.register_optimizer(optimizerD)
        hook.register_optimizer(optimizerG)
        for _epoch in range(2):
            order = torch.randperm(len(data), generator=generator)
            for start in range(0, len(data), batch):
                real = data[order[start : start + batch]]
                # (1) the discriminator: maximise log D(x) + log(1 - D(G(z)))
                netD.zero_grad()
                label = torch.full((real.size(0),), 1.0)
                errD_real = criterion(netD(real), label)
                errD_real.backward()
                fake = netG(torch.randn(real.size(0), nz, 1, 1))
                label.fill_(0.0)
                errD_fake = criterion(netD(fake.detach()), label)
                errD_fake.backward()
                hook.save_loss(errD_real + errD_fake, "loss_D")  # the script prints Loss_D and Loss_G
                optimizerD.step()
                # (2) the generator: maximise log D(G(z)), real labels for the fake batch
                netG.zero_grad()
                label.fill_(1.0)
                errG = criterion(netD(fake), label)
                errG.backward()
                hook.save_loss(errG, "loss_G")
                optimizerG.step()
