"""A sharded tensor's statistics reach the host in one device-to-host copy per tensor (one
sync on a GPU, not one per kind of statistic), and equal numpy's on the whole tensor. One
process (a one-rank gloo group); tests/distributed/test_fsdp2.py has the 2- and 4-rank runs."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")
tensor_api = pytest.importorskip("torch.distributed.tensor")

from stepscope_torch import sharded  # noqa: E402

WANTED = tuple((name, is_abs) for name in ("min", "max", "mean", "std", "variance", "sum", "prod", "l1", "l2") for is_abs in (False, True))


@pytest.fixture
def one_rank(tmp_path):
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'init'}", rank=0, world_size=1)
    try:
        yield tensor_api.init_device_mesh("cpu", (1,))
    finally:
        dist.destroy_process_group()


def test_one_copy_to_the_host_per_sharded_tensor(one_rank, monkeypatch):
    whole = torch.linspace(-2.0, 3.0, 24, dtype=torch.float32).reshape(6, 4)
    value = tensor_api.distribute_tensor(whole, one_rank, [tensor_api.Shard(0)])
    assert sharded.is_sharded(value)
    copies = []
    real_cpu = torch.Tensor.cpu

    def counting_cpu(self, *args, **kwargs):
        copies.append(tuple(self.shape))
        return real_cpu(self, *args, **kwargs)

    monkeypatch.setattr(torch.Tensor, "cpu", counting_cpu)
    reduced = sharded.combined_reductions(value, WANTED)
    monkeypatch.undo()
    assert len(copies) == 1, copies

    x = whole.numpy().astype(np.float64).ravel()
    for is_abs in (False, True):
        v = np.abs(x) if is_abs else x
        expected = {"min": v.min(), "max": v.max(), "mean": v.mean(), "std": v.std(), "variance": v.var(), "sum": v.sum(), "prod": v.prod(), "l1": np.abs(x).sum(), "l2": np.sqrt((x * x).sum())}
        for name, number in expected.items():
            np.testing.assert_allclose(reduced[(name, is_abs)], number, rtol=1e-12, atol=1e-300, err_msg=f"{name} abs={is_abs}")


def test_importing_the_plugin_leaves_dtensor_unimported():
    # torch.distributed.tensor takes seconds to import; a job without FSDP2 never needs it.
    import subprocess
    import sys

    code = "import sys, torch, stepscope_torch; print('torch.distributed.tensor' in sys.modules)"
    reply = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert reply.stdout.strip() == "False"
    assert not sharded.is_sharded(torch.ones(2))
