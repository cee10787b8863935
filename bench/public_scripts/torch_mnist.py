"""Mirrors pytorch/examples `mnist/main.py`: two 3x3 convolutions with ReLU, max-pool,
dropout 0.25, a hidden linear layer with ReLU (functional `F.relu`), dropout 0.5, log-softmax
and the functional NLL loss; Adadelta with lr 1.0 and a StepLR schedule (gamma 0.7 per
epoch); a test pass after every epoch. Scaled for CPU seconds: 8 and 16 filters instead of
32 and 64, a 64-unit hidden layer instead of 128, 4,800 synthetic 28x28 "digits" (10 stroke
patterns, shifted, MNIST's ink density) instead of MNIST, 3 epochs.

Faults: `chance_level` (shuffled training labels), `dead_relu` (the hidden layer's bias
at -20), `divergence` (Adadelta lr 1000)."""

from __future__ import annotations

from pathlib import Path

from .capture import torch_hook
from .synthetic import digits, shuffled


def train(out_dir: Path, config: str, fault: str | None = None) -> None:
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    torch.set_num_threads(1)
    torch.manual_seed(1)

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv1 = nn.Conv2d(1, 8, 3, 1)
            self.conv2 = nn.Conv2d(8, 16, 3, 1)
            self.dropout1 = nn.Dropout(0.25)
            self.dropout2 = nn.Dropout(0.5)
            self.fc1 = nn.Linear(16 * 12 * 12, 64)
            self.fc2 = nn.Linear(64, 10)

        def forward(self, x):
            x = F.relu(self.conv1(x))
            x = F.max_pool2d(F.relu(self.conv2(x)), 2)
            x = torch.flatten(self.dropout1(x), 1)
            x = self.dropout2(F.relu(self.fc1(x)))
            return F.log_softmax(self.fc2(x), dim=1)

    images, labels = digits(4800, seed=1)
    test_images, test_labels = digits(500, seed=2)
    if fault == "chance_level":
        labels = shuffled(labels)
    mean, std = images.mean(), images.std()  # the script's Normalize((0.1307,), (0.3081,)), for this data
    x, y = torch.from_numpy((images - mean) / std), torch.from_numpy(labels)
    tx, ty = torch.from_numpy((test_images - mean) / std), torch.from_numpy(test_labels)

    model = Net()
    if fault == "dead_relu":
        with torch.no_grad():
            model.fc1.bias.fill_(-20.0)
    optimizer = torch.optim.Adadelta(model.parameters(), lr=1000.0 if fault == "divergence" else 1.0)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.7)
    generator = torch.Generator().manual_seed(1)
    with torch_hook(out_dir, config) as hook:
        hook.register_module(model)
        hook.register_optimizer(optimizer)
        for _epoch in range(3):
            model.train()
            order = torch.randperm(len(x), generator=generator)
            for start in range(0, len(x), 64):
                idx = order[start : start + 64]
                optimizer.zero_grad()
                loss = F.nll_loss(model(x[idx]), y[idx])
                hook.save_loss(loss)
                loss.backward()
                optimizer.step()
            model.eval()
            with torch.no_grad():
                for start in range(0, len(tx), 250):
                    hook.save_loss(F.nll_loss(model(tx[start : start + 250]), ty[start : start + 250]))
            scheduler.step()
