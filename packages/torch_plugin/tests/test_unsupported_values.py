"""Every dtype and layout torch has, through `save_tensor`: saved as its values (converted
where the conversion is faithful) or dropped with one warning naming it, never turning the
hook off and never touching training or later steps."""

from __future__ import annotations

import logging

import numpy as np
import torch

import stepscope
from stepscope.config import SaveConfig
from stepscope.modes import ModeKeys
from stepscope_torch import transfer

ALL_DTYPES = sorted({v for v in vars(torch).values() if isinstance(v, torch.dtype)}, key=str)
QUANTIZED = {torch.qint8, torch.quint8, torch.qint32, torch.quint4x2, torch.quint2x4}
VALUES = torch.tensor([0.0, 1.0, 2.0, 3.0, 4.0, 5.0])


def make_tensor(dtype: torch.dtype) -> torch.Tensor | None:
    """A small tensor of `dtype`, or None when torch cannot make one."""
    makers = [lambda: torch.quantize_per_tensor(VALUES, 0.5, 1, dtype)] if dtype in QUANTIZED else [
        lambda: VALUES.to(dtype),
        lambda: torch.zeros(6, dtype=torch.uint8).view(dtype),
        lambda: torch.empty(6, dtype=dtype),
    ]
    for make in makers:
        try:
            return make()
        except Exception:  # noqa: BLE001 - this torch cannot make that dtype this way
            continue
    return None


def expected_values(tensor: torch.Tensor) -> np.ndarray | None:
    """The values a faithful save holds, computed without stepscope; None: not saveable."""
    if tensor.is_quantized:
        return tensor.dequantize().double().numpy()
    if tensor.dtype.is_complex:
        return tensor.to(torch.complex128).numpy()
    if tensor.dtype.is_floating_point and tensor.dtype != getattr(torch, "float4_e2m1fn_x2", None):
        return tensor.double().numpy()
    if tensor.dtype == torch.bool or tensor.dtype in (torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.uint16, torch.uint32, torch.uint64):
        return tensor.to(torch.int64).double().numpy() if tensor.dtype != torch.uint64 else tensor.numpy().astype(np.float64)
    return None


def layouts() -> dict[str, torch.Tensor]:
    dense = torch.tensor([[0.0, 1.5, 0.0, 0.0], [2.0, 0.0, 0.0, -3.0], [0.0, 0.0, 4.0, 0.0], [0.0, 0.0, 0.0, 0.0]])
    return {
        "sparse_coo": dense.to_sparse(),
        "sparse_csr": dense.to_sparse_csr(),
        "sparse_csc": dense.to_sparse_csc(),
        "sparse_bsr": dense.to_sparse_bsr((2, 2)),
        "sparse_bsc": dense.to_sparse_bsc((2, 2)),
        "conj_view": torch.tensor([1 + 2j, 3 - 1j]).conj(),
    }


def run(make_hook, out_dir, values: dict[str, torch.Tensor], model, batches) -> stepscope.Trial:
    hook = make_hook(save_config=SaveConfig(save_interval=1), include_collections=["weights"])
    hook.register_module(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    hook.register_optimizer(optimizer)
    for i, (x, y) in enumerate(batches(3)):
        loss = torch.nn.functional.cross_entropy(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if i < 2:
            for name, value in values.items():
                hook.save_tensor(name, value)
        hook.save_tensor("after", torch.full((2,), float(i)))
        assert hook.enabled
    hook.close()
    return stepscope.create_trial(out_dir)


def test_every_dtype_is_saved_faithfully_or_dropped_with_one_warning(make_hook, out_dir, mlp, batches, caplog):
    tensors = {str(d).removeprefix("torch."): t for d in ALL_DTYPES if (t := make_tensor(d)) is not None}
    assert len(tensors) >= 30  # torch 2.13 makes most of its 46 dtypes
    with caplog.at_level(logging.WARNING, logger="stepscope"):
        trial = run(make_hook, out_dir, tensors, mlp(), batches)
    warned = [r.getMessage() for r in caplog.records if "is not saved" in r.getMessage()]
    saved = set(trial.tensor_names())
    for name, tensor in tensors.items():
        expected = expected_values(tensor)
        if expected is None:
            assert name not in saved, name
            assert sum(f"'{name}'" in m for m in warned) == 1, (name, warned)  # once, not per step
        else:
            for step in (0, 1):
                np.testing.assert_array_equal(np.asarray(trial.tensor(name).value(step, mode=ModeKeys.TRAIN), dtype=expected.dtype), expected, err_msg=name)
    # bfloat16 and float16 keep their dtype.
    assert trial.tensor("bfloat16").value(0, mode=ModeKeys.TRAIN).dtype.name == "bfloat16"
    assert trial.tensor("float16").value(0, mode=ModeKeys.TRAIN).dtype == np.float16
    assert trial.tensor("after").values(mode=ModeKeys.TRAIN).keys() == {0, 1, 2}  # later steps unaffected
    assert trial.status().get("worker_0", {}).get("state", "degraded") == "degraded"


def test_layouts_are_saved_dense_and_meta_nested_and_huge_sparse_are_dropped(make_hook, out_dir, mlp, batches, caplog, monkeypatch):
    values = layouts()
    values["meta"] = torch.empty(3, device="meta")
    values["nested"] = torch.nested.nested_tensor([torch.ones(2), torch.ones(3)])
    monkeypatch.setattr(transfer, "MAX_DENSE_ELEMENTS", 100)
    values["huge_sparse"] = torch.sparse_coo_tensor(torch.tensor([[0], [0]]), torch.tensor([1.0]), (20, 20))
    with caplog.at_level(logging.WARNING, logger="stepscope"):
        trial = run(make_hook, out_dir, values, mlp(), batches)
    warned = [r.getMessage() for r in caplog.records if "is not saved" in r.getMessage()]
    for name in ("sparse_coo", "sparse_csr", "sparse_csc", "sparse_bsr", "sparse_bsc", "conj_view"):
        expected = values[name].to_dense().numpy() if name != "conj_view" else values[name].resolve_conj().numpy()
        np.testing.assert_array_equal(trial.tensor(name).value(1, mode=ModeKeys.TRAIN), expected, err_msg=name)
    for name, reason in (("meta", "meta tensor has no data"), ("nested", "nested tensor"), ("huge_sparse", "over the 100")):
        assert name not in trial.tensor_names()
        assert [m for m in warned if f"'{name}'" in m and reason in m], (name, warned)
    status = trial.status()["worker_0"]
    assert status["state"] == "degraded" and any(n.startswith("meta (") for n in status["dropped_tensors"])


def test_a_sparse_embedding_gradient_is_saved_dense_and_training_is_unchanged(make_hook, out_dir):
    def train(hook=None):
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Embedding(10, 3, sparse=True), torch.nn.Flatten(), torch.nn.Linear(6, 1))
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        if hook is not None:
            hook.register_module(model)
            hook.register_optimizer(optimizer)
        grads = []
        for i in range(3):
            loss = model(torch.tensor([[i, i + 1]])).sum()
            optimizer.zero_grad()
            loss.backward()
            grads.append(model[0].weight.grad.to_dense().clone())
            optimizer.step()
        return model, grads

    hook = make_hook(save_config=SaveConfig(save_interval=1), include_collections=["gradients"])
    hooked, grads = train(hook)
    hook.close()
    plain, _ = train()
    assert all(torch.equal(a, b) for a, b in zip(hooked.parameters(), plain.parameters()))
    trial = stepscope.create_trial(out_dir)
    for step, grad in enumerate(grads):
        np.testing.assert_array_equal(trial.tensor("gradient/0.weight").value(step, mode=ModeKeys.TRAIN), grad.numpy())
