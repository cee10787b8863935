"""Mirrors pytorch/examples `vae/main.py`: a fully connected VAE (784-400-20 encoder with a
mean and a log-variance head, 20-400-784 decoder with a sigmoid output, ReLU inside), the
reparameterisation trick, the loss binary cross-entropy plus KL divergence summed over the
batch, Adam with lr 1e-3, batch 128, a test pass after each epoch. Scaled for CPU seconds:
3 epochs (the script's default is 10; 240 steps, so that the quick start's interval of 100
saves tensors three times) of 10,240 synthetic 28x28 "digits" in [0, 1] (10 stroke
patterns, shifted, MNIST's ink density) instead of MNIST. The loss is a function of the script's own, saved with `hook.save_loss` as the
README says for functional losses.

Faults: `zero_init` (every parameter 0), `lr_zero`, `vanishing`
(the encoder's hidden layer replaced by eight 400-unit sigmoid layers)."""

from __future__ import annotations

from pathlib import Path

from .capture import torch_hook
from .synthetic import digits


def train(out_dir: Path, config: str, fault: str | None = None) -> None:
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    torch.set_num_threads(1)
    torch.manual_seed(1)

    class VAE(nn.Module):
        def __init__(self):
            super().__init__()
            if fault == "vanishing":
                layers: list[nn.Module] = [nn.Linear(784, 400), nn.Sigmoid()]
                for _ in range(7):
                    layers += [nn.Linear(400, 400), nn.Sigmoid()]
                self.fc1 = nn.Sequential(*layers)
            else:
                self.fc1 = nn.Sequential(nn.Linear(784, 400), nn.ReLU())
            self.fc21 = nn.Linear(400, 20)
            self.fc22 = nn.Linear(400, 20)
            self.fc3 = nn.Linear(20, 400)
            self.relu3 = nn.ReLU()
            self.fc4 = nn.Linear(400, 784)

        def encode(self, x):
            h1 = self.fc1(x)
            return self.fc21(h1), self.fc22(h1)

        def reparameterize(self, mu, logvar):
            std = torch.exp(0.5 * logvar)
            return mu + torch.randn_like(std) * std

        def decode(self, z):
            return torch.sigmoid(self.fc4(self.relu3(self.fc3(z))))

        def forward(self, x):
            mu, logvar = self.encode(x.view(-1, 784))
            return self.decode(self.reparameterize(mu, logvar)), mu, logvar

    def loss_function(recon_x, x, mu, logvar):
        bce = F.binary_cross_entropy(recon_x, x.view(-1, 784), reduction="sum")
        kld = -0.5 * torch.sum(1 + logvar - mu.pow(2) - logvar.exp())
        return bce + kld

    x = torch.from_numpy(digits(10240, seed=21)[0])
    tx = torch.from_numpy(digits(512, seed=22)[0])
    model = VAE()
    if fault == "zero_init":
        with torch.no_grad():
            for p in model.parameters():
                p.zero_()
    optimizer = torch.optim.Adam(model.parameters(), lr=0.0 if fault == "lr_zero" else 1e-3)
    generator = torch.Generator().manual_seed(1)
    with torch_hook(out_dir, config) as hook:
        hook.register_module(model)
        hook.register_optimizer(optimizer)
        for _epoch in range(3):
            model.train()
            order = torch.randperm(len(x), generator=generator)
            for start in range(0, len(x), 128):
                data = x[order[start : start + 128]]
                optimizer.zero_grad()
                recon, mu, logvar = model(data)
                loss = loss_function(recon, data, mu, logvar)
                hook.save_loss(loss)
                loss.backward()
                optimizer.step()
            model.eval()
            with torch.no_grad():
                for start in range(0, len(tx), 128):
                    data = tx[start : start + 128]
                    recon, mu, logvar = model(data)
                    hook.save_loss(loss_function(recon, data, mu, logvar))
