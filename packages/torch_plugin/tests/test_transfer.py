"""HostTransfer.capture_many (a save step's tensors snapshotted in one pass) against
capture (one by one): the same values, dtypes and shapes, snapshots the training loop can
no longer change, reductions equal to numpy's, and what it cannot batch left for the
one-by-one path."""

from __future__ import annotations

import crc32c
import numpy as np
import pytest
import torch

from stepscope import reductions
from stepscope.capture import host_arena
from stepscope.capture.host_arena import Scanned
from stepscope.capture.tensor_saver import TensorPlan
from stepscope_torch.transfer import HostTransfer, host_tensor, saveable


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


def _large_tensors() -> dict[str, torch.Tensor]:
    """Tensors over ARENA_FROM, which the arena's reused memory takes (host_arena.py)."""
    g = torch.Generator().manual_seed(5)
    weight = torch.nn.Parameter(torch.randn(256, 300, generator=g))
    weight.grad = torch.randn(256, 300, generator=g)
    return {
        "weight": weight,
        "grad": weight.grad,
        "transposed": torch.randn(300, 200, generator=g).t(),
        "bf16": torch.randn(200, 300, generator=g).to(torch.bfloat16),
        "int": torch.arange(40000, dtype=torch.int64).reshape(200, 200),
    }


def test_large_snapshots_in_reused_memory_equal_the_tensors_and_stay_put():
    tensors = _large_tensors()
    transfer = HostTransfer()
    saves = []
    for save in range(4):  # four saves of a training loop, each after an in-place update
        expected = {n: t.detach().float().numpy().copy() if t.dtype == torch.bfloat16 else t.detach().numpy().copy() for n, t in tensors.items()}
        found: dict[str, tuple] = {}
        plans = [(TensorPlan(n, True, (), False), t) for n, t in tensors.items()]
        half = len(plans) // 2  # half batched, half one by one (gradients' hooks)
        transfer.capture_many(plans[:half], _record_into(found))
        for plan, t in plans[half:]:
            found[plan.name] = transfer.capture(plan, t)
        for name, (raw, _, _) in found.items():
            if type(raw) is Scanned:  # the copy took the CRC of the bytes it copied
                assert raw.scan[0] == ~crc32c.crc32c(raw.array, 0xFFFFFFFF) & 0xFFFFFFFF, name
                raw = raw.array
            elif tensors[name].is_contiguous():  # (a strided one is copied by numpy)
                assert host_arena._copy_scan is None, f"{name}: copied without its CRC"
            assert not raw.flags.owndata, f"{name}: not in the arena's memory"
            got = raw.astype(np.float32) if name == "bf16" else raw
            np.testing.assert_array_equal(got, expected[name], err_msg=f"save {save}, {name}")
        saves.append((expected, found))
        with torch.no_grad():
            for t in tensors.values():
                t.add_(1)
    # Every save's snapshots are still what they were: none was reused while held.
    for save, (expected, found) in enumerate(saves):
        for name, (raw, _, _) in found.items():
            raw = np.asarray(raw)
            got = raw.astype(np.float32) if name == "bf16" else raw
            np.testing.assert_array_equal(got, expected[name], err_msg=f"save {save}, {name}, after later saves")


def test_a_dropped_save_leaves_its_memory_for_the_next():
    tensors = _large_tensors()
    transfer = HostTransfer()
    plans = [(TensorPlan(n, True, (), False), t) for n, t in tensors.items()]
    addresses = []
    for _ in range(3):
        found: dict[str, tuple] = {}
        transfer.capture_many(plans, _record_into(found))
        addresses.append(np.asarray(found["weight"][0]).__array_interface__["data"][0])
        del found  # the writer has published the step
    assert addresses[0] == addresses[1] == addresses[2]
    assert transfer._arena.kept_bytes <= 8 << 20


def test_a_listener_that_keeps_snapshots_sees_them_unchanged(tmp_path):
    """Snapshots a step listener keeps past its call (the writer's reused memory must not
    be reused under it) equal what was written for that step, save after save."""
    import stepscope
    from stepscope.config import ProfilerConfig, SaveConfig
    from stepscope_torch import Hook

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(128, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10))  # 128 KiB weights
    loss_fn = torch.nn.CrossEntropyLoss()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    hook = Hook(str(tmp_path), save_config=SaveConfig(save_interval=2), include_collections=["weights", "gradients"],
                profiler_config=ProfilerConfig.disabled())  # fmt: skip
    hook.register_module(model)
    hook.register_loss(loss_fn)
    kept: dict[int, dict[str, np.ndarray]] = {}
    hook._runtime.writer.step_listeners.append(lambda step, mode, mode_step, arrays: kept.__setitem__(step, dict(arrays)))
    x, y = torch.randn(32, 128), torch.randint(0, 10, (32,))
    for _ in range(12):
        optimizer.zero_grad()
        loss_fn(model(x), y).backward()
        optimizer.step()
    hook.close()
    trial = stepscope.create_trial(str(tmp_path))
    name = next(n for n in kept[0] if n.endswith("0.weight") and "grad" not in n)
    assert kept[0][name].nbytes >= 64 * 1024 and not kept[0][name].flags.owndata  # in the arena's memory
    assert sorted(kept) == list(range(0, 12, 2))
    for step, arrays in kept.items():
        for tensor_name, array in arrays.items():
            np.testing.assert_array_equal(array, trial.tensor(tensor_name).value(step), err_msg=f"{tensor_name} at step {step}")
    assert not np.array_equal(kept[0][name], kept[10][name])  # the weights moved between saves


@pytest.mark.filterwarnings("ignore:.*(quantized|nested) tensor")
def test_what_a_gradient_hook_snapshots_directly_is_what_saveable_keeps_as_it_is():
    # host_tensor() lets a gradient hook skip saveable(): it must say yes only where
    # saveable would return the tensor unchanged, and capture_host must then give what
    # capture gives.
    g = torch.Generator().manual_seed(5)
    complex_ = torch.randn(3, 2, dtype=torch.complex64, generator=g)
    tensors = dict(_tensors())
    tensors.update({
        "f64": torch.randn(4, generator=g, dtype=torch.float64),
        "f16": torch.randn(4, generator=g).half(),
        "u8": torch.arange(5, dtype=torch.uint8),
        "complex": complex_,
        "conj": complex_.conj(),  # a conjugate view: saveable resolves it
        "neg": torch._neg_view(torch.randn(3, generator=g)),
        "sparse": torch.eye(3).to_sparse(),
        "quantized": torch.quantize_per_tensor(torch.randn(4, generator=g), 0.1, 0, torch.qint8),
        "meta": torch.empty(2, device="meta"),
        "nested": torch.nested.nested_tensor([torch.ones(2), torch.ones(3)]),
        # A gradient backward made with create_graph=True (a gradient penalty's) has a graph.
        "with_graph": torch.randn(3, generator=g, requires_grad=True) * 2,
    })
    direct = {name for name, t in tensors.items() if host_tensor(t)}
    assert direct == {"grad", "transposed", "bf16", "int", "scalar", "empty", "bool", "f64", "f16", "u8", "complex", "with_graph"}
    assert not host_tensor(tensors["weight"])  # a Parameter: a subclass, left to the general path
    for name in direct:
        tensor = tensors[name]
        assert saveable(tensor.detach()).data_ptr() == tensor.data_ptr() and saveable(tensor.detach()).dtype == tensor.dtype, name
        plan = TensorPlan(name, True, (("mean", False),) if tensor.numel() and not tensor.is_complex() and tensor.dtype != torch.bool else (), True)
        raw, reduced, shape = HostTransfer().capture_host(plan, tensor)
        one_raw, one_reduced, one_shape = HostTransfer().capture(plan, tensor)
        assert shape == one_shape, name
        np.testing.assert_array_equal(np.asarray(raw), np.asarray(one_raw), err_msg=name)
        assert {k: np.asarray(v.resolve()) for k, v in reduced.items()} == {k: np.asarray(v.resolve()) for k, v in one_reduced.items()}, name
