"""Device reductions hold to stepscope.reductions' numpy definitions."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from stepscope import reductions
from stepscope.config import NORMS, REDUCTIONS
from stepscope_torch.reductions import reduce_on_device

ALL = [(name, is_abs) for name in REDUCTIONS + NORMS for is_abs in (False, True)]
DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(
    "tensor",
    [
        torch.randn(5, 7, generator=torch.Generator().manual_seed(0)),
        torch.randn(33, generator=torch.Generator().manual_seed(1)).to(torch.float16),
        torch.randn(4, 4, generator=torch.Generator().manual_seed(2)).to(torch.float64) * 1e3,
        torch.arange(-3, 5, dtype=torch.int32),
        torch.tensor([True, False, True]),
        torch.tensor(2.5),
    ],
    ids=["float32", "float16", "float64", "int32", "bool", "scalar"],
)
def test_reduce_on_device_matches_numpy(tensor, device):
    values = reduce_on_device(tensor.to(device), ALL).cpu().numpy()
    assert values.dtype == np.float64
    for value, (name, is_abs) in zip(values, ALL):
        expected = reductions.compute(tensor.numpy(), name, is_abs)
        assert value == pytest.approx(float(expected), rel=1e-12, abs=1e-300), (name, is_abs)


def test_population_std_and_variance():
    x = torch.tensor([1.0, 2.0, 3.0, 4.0])
    std, var = reduce_on_device(x, [("std", False), ("variance", False)]).tolist()
    assert var == pytest.approx(1.25) and std == pytest.approx(1.25**0.5)


def test_bfloat16_is_reduced_like_its_float32_widening():
    x = torch.randn(10, generator=torch.Generator().manual_seed(3)).to(torch.bfloat16)
    got = reduce_on_device(x, [("mean", False), ("l2", False)]).tolist()
    wide = x.float().numpy()
    assert got == pytest.approx([float(reductions.compute(wide, "mean")), float(reductions.compute(wide, "l2"))], rel=1e-12)


def test_empty_tensor_has_no_reductions():
    with pytest.raises(ValueError):
        reduce_on_device(torch.empty(0), [("mean", False)])
