"""HostTransfer.capture_many (a save step's tensors snapshotted in one pass) against
capture (one by one): the same values, dtypes and shapes, snapshots the training loop can
no longer change, reductions equal to numpy's, and what it cannot batch left for the
one-by-one path."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from stepscope import reductions
from stepscope.capture.tensor_saver import TensorPlan
from stepscope_torch.transfer import HostTransfer


def _tensors() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(3)
    weight = torch.nn.Parameter(torch.randn(5, 7, generator=g))
    weight.grad = torch.randn(5, 7, generator=g)
    out = {
        "weight": weight,
        "grad": weight.grad,
        "transposed": torch.randn(4, 6, generator=g).t(),  # not contiguous
        "bf16": torch.randn(3, 3, generator=g).to(torch.bfloat16),
        "int": torch.arange(12, dtype=torch.int64).reshape(3, 4),
        "scalar": torch.tensor(2.5),
        "empty": torch.zeros(0, 3),
        "bool": torch.tensor([True, False, True]),
    }
    if hasattr(torch, "float8_e4m3fn"):
        out["f8"] = torch.tensor([0.5, -1.0, 2.0]).to(torch.float8_e4m3fn)
    return out


def _record_into(found: dict[str, tuple]):
    def record(plan, raw, reduced, shape):
        found[plan.name] = (raw, reduced, shape)

    return record


def test_capture_many_equals_capture_one_by_one():
    tensors = _tensors()
    plans = [(TensorPlan(name, True, (), True), t) for name, t in tensors.items()]
    found: dict[str, tuple] = {}
    rest = HostTransfer().capture_many(plans, _record_into(found))
    assert rest == []
    assert set(found) == set(tensors)
    for plan, tensor in plans:
        raw, reduced, shape = found[plan.name]
        one_raw, one_reduced, one_shape = HostTransfer().capture(plan, tensor)
        assert shape == one_shape == tuple(tensor.shape), plan.name
        assert raw.dtype == one_raw.dtype and raw.shape == one_raw.shape, plan.name
        np.testing.assert_array_equal(raw, one_raw, err_msg=plan.name)
        assert reduced == one_reduced == {}


def test_the_batch_is_a_snapshot():
    tensors = _tensors()
    plans = [(TensorPlan(n, True, (), False), t) for n, t in tensors.items()]
    expected = {plan.name: HostTransfer().capture(plan, t)[0] for plan, t in plans}
    found: dict[str, tuple] = {}
    HostTransfer().capture_many(plans, _record_into(found))
    with torch.no_grad():  # what the optimizer and zero_grad do right after a save
        for t in tensors.values():
            if t.numel():
                t.zero_()
    for name, (raw, _, _) in found.items():
        np.testing.assert_array_equal(raw, expected[name], err_msg=name)
    assert np.any(found["weight"][0] != 0)


def test_reductions_from_the_batch_equal_numpy():
    tensors = _tensors()
    wanted = (("mean", False), ("l2", False), ("max", True))
    found: dict[str, tuple] = {}
    plans = [(TensorPlan(n, False, wanted, False), tensors[n]) for n in ("weight", "grad", "transposed", "int")]
    HostTransfer().capture_many(plans, _record_into(found))
    for plan, tensor in plans:
        raw, reduced, _ = found[plan.name]
        assert raw is None
        array = tensor.detach().numpy()
        for (name, is_abs), value in reduced.items():
            assert float(value.resolve()) == pytest.approx(float(reductions.compute(array, name, is_abs)), rel=1e-12), (plan.name, name)
        # The snapshot's bytes are counted once, on the first reduction (the writer's queue bound).
        assert sum(v.nbytes for v in reduced.values()) == array.nbytes + 8 * (len(wanted) - 1)


def test_what_cannot_be_batched_is_left_one_by_one():
    meta = torch.empty(3, device="meta")
    items = [
        (TensorPlan("array", True, (), False), np.ones(3)),
        (TensorPlan("meta", True, (), False), meta),
        (TensorPlan("ok", True, (), False), torch.ones(2)),
    ]
    found: dict[str, tuple] = {}
    rest = HostTransfer().capture_many(items, _record_into(found))
    assert [plan.name for plan, _ in rest] == ["array", "meta"]
    assert list(found) == ["ok"]
