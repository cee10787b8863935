"""Fixtures of the torch plugin's tests: small models, synthetic batches, a hook factory."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from stepscope.config import ProfilerConfig


class TinyMLP(nn.Module):
    def __init__(self, n_in: int = 6, hidden: int = 8, n_out: int = 3):
        super().__init__()
        self.fc1 = nn.Linear(n_in, hidden)
        self.relu = nn.ReLU()
        self.fc2 = nn.Linear(hidden, n_out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.relu(self.fc1(x)))


class TinyCNN(nn.Module):
    def __init__(self, n_out: int = 3):
        super().__init__()
        self.conv = nn.Conv2d(1, 4, 3, padding=1)
        self.bn = nn.BatchNorm2d(4)
        self.pool = nn.AdaptiveAvgPool2d(2)
        self.head = nn.Linear(16, n_out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.pool(torch.relu(self.bn(self.conv(x)))).flatten(1))


@pytest.fixture
def mlp():
    """A fresh TinyMLP with fixed initial weights: two calls give identical models."""

    def make(**kwargs) -> TinyMLP:
        torch.manual_seed(0)
        return TinyMLP(**kwargs)

    return make


@pytest.fixture
def cnn():
    def make() -> TinyCNN:
        torch.manual_seed(0)
        return TinyCNN()

    return make


@pytest.fixture
def batches():
    """Synthetic classification batches for TinyMLP: batches(n, shape=(4, 6))."""

    def make(n: int, shape: tuple[int, ...] = (4, 6), classes: int = 3, seed: int = 1):
        generator = torch.Generator().manual_seed(seed)
        return [(torch.randn(*shape, generator=generator), torch.randint(0, classes, (shape[0],), generator=generator)) for _ in range(n)]

    return make


@pytest.fixture
def make_hook(tmp_path):
    """Hook(out_dir=tmp_path/'job', ...) without the profiler side unless asked for."""
    from stepscope_torch import Hook

    made = []

    def make(**kwargs):
        kwargs.setdefault("profiler_config", ProfilerConfig.disabled())
        hook = Hook(str(kwargs.pop("out_dir", tmp_path / "job")), **kwargs)
        made.append(hook)
        return hook

    yield make
    for hook in made:
        hook.close()


@pytest.fixture
def out_dir(tmp_path):
    return str(tmp_path / "job")


@pytest.fixture(params=["compiled", "python"])
def hot_path(request, monkeypatch):
    """Run a test on the compiled hot path (where _fastpath is built) and on the Python
    one: modules whose tests cover the hook's step logic use it for every test."""
    from stepscope_torch import fastpath

    if request.param == "compiled":
        if fastpath.compiled() is None:
            pytest.skip("the _fastpath extension is not built here")
        monkeypatch.delenv(fastpath.PURE_PYTHON_ENV, raising=False)
    else:
        monkeypatch.setenv(fastpath.PURE_PYTHON_ENV, "1")
    return request.param
