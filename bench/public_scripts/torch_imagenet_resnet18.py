"""Mirrors pytorch/examples `imagenet/main.py` with `--arch resnet18 --dummy`: torchvision's
ResNet-18 layout (7x7 stride-2 stem, BatchNorm, max-pool, four stages of two basic residual
blocks, global average pool, linear head; Kaiming init, BatchNorm scale 1 / shift 0),
`nn.CrossEntropyLoss`, SGD with lr 0.1, momentum 0.9, weight decay 1e-4, a validation pass
after each epoch. Scaled for CPU seconds (torchvision is not a dependency, so the network is
written out here): stage widths 16-32-64-128 instead of 64-512, 32x32 inputs instead of
224x224, 10 classes instead of 1000, batch 32 instead of 256, 2 epochs of 2,560 synthetic
images whose class is a colour template (the script's --dummy data is random, which no
model can learn).

Faults: `divergence` (lr 10), `lr_zero`, `nan_input` (one training batch holds a NaN)."""

from __future__ import annotations

from pathlib import Path

from .capture import torch_hook
from .synthetic import class_images


def _resnet18(width: int = 16, classes: int = 10):
    import torch.nn as nn

    class BasicBlock(nn.Module):
        def __init__(self, inplanes: int, planes: int, stride: int):
            super().__init__()
            self.conv1 = nn.Conv2d(inplanes, planes, 3, stride, 1, bias=False)
            self.bn1 = nn.BatchNorm2d(planes)
            self.relu = nn.ReLU(inplace=True)
            self.conv2 = nn.Conv2d(planes, planes, 3, 1, 1, bias=False)
            self.bn2 = nn.BatchNorm2d(planes)
            self.downsample = None
            if stride != 1 or inplanes != planes:
                self.downsample = nn.Sequential(nn.Conv2d(inplanes, planes, 1, stride, bias=False), nn.BatchNorm2d(planes))

        def forward(self, x):
            identity = x if self.downsample is None else self.downsample(x)
            out = self.relu(self.bn1(self.conv1(x)))
            return self.relu(self.bn2(self.conv2(out)) + identity)

    class ResNet(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv1 = nn.Conv2d(3, width, 7, 2, 3, bias=False)
            self.bn1 = nn.BatchNorm2d(width)
            self.relu = nn.ReLU(inplace=True)
            self.maxpool = nn.MaxPool2d(3, 2, 1)
            stages, inplanes = [], width
            for i, planes in enumerate((width, width * 2, width * 4, width * 8)):
                stride = 1 if i == 0 else 2
                stages.append(nn.Sequential(BasicBlock(inplanes, planes, stride), BasicBlock(planes, planes, 1)))
                inplanes = planes
            self.layer1, self.layer2, self.layer3, self.layer4 = stages
            self.avgpool = nn.AdaptiveAvgPool2d(1)
            self.fc = nn.Linear(inplanes, classes)
            for m in self.modules():
                if isinstance(m, nn.Conv2d):
                    nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
                elif isinstance(m, nn.BatchNorm2d):
                    nn.init.constant_(m.weight, 1)
                    nn.init.constant_(m.bias, 0)

        def forward(self, x):
            x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
            x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
            return self.fc(self.avgpool(x).flatten(1))

    return ResNet()


def train(out_dir: Path, config: str, fault: str | None = None) -> None:
    import torch
    import torch.nn as nn

    torch.set_num_threads(1)
    torch.manual_seed(0)
    images, labels = class_images(2560, 10, (3, 32, 32), seed=11, noise=1.0)
    val_images, val_labels = class_images(320, 10, (3, 32, 32), seed=12, noise=1.0)
    mean = images.mean(axis=(0, 2, 3), keepdims=True)
    std = images.std(axis=(0, 2, 3), keepdims=True)
    x, y = torch.from_numpy((images - mean) / std), torch.from_numpy(labels)
    vx, vy = torch.from_numpy((val_images - mean) / std), torch.from_numpy(val_labels)

    model = _resnet18()
    criterion = nn.CrossEntropyLoss()
    lr = {"divergence": 10.0, "lr_zero": 0.0}.get(fault or "", 0.1)
    optimizer = torch.optim.SGD(model.parameters(), lr, momentum=0.9, weight_decay=1e-4)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=30, gamma=0.1)
    generator = torch.Generator().manual_seed(0)
    step = 0
    with torch_hook(out_dir, config) as hook:
        hook.register_module(model)
        hook.register_loss(criterion)
        hook.register_optimizer(optimizer)
        for _epoch in range(2):
            model.train()
            order = torch.randperm(len(x), generator=generator)
            for start in range(0, len(x), 32):
                images_batch, target = x[order[start : start + 32]], y[order[start : start + 32]]
                if fault == "nan_input" and step == 137:
                    images_batch = images_batch.clone()
                    images_batch[3, 1, 5, 7] = float("nan")
                loss = criterion(model(images_batch), target)
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
                step += 1
            model.eval()
            with torch.no_grad():
                for start in range(0, len(vx), 64):
                    criterion(model(vx[start : start + 64]), vy[start : start + 64])
            scheduler.step()
