"""One rank of the FSDP2 test (a module of its own so torch.multiprocessing.spawn can import
it): a model sharded with `fully_shard` on CPU with gloo, every rank saving. Rank 0 also
writes the whole tensors (gathered by the test, not by stepscope) and the data of every
rank, for the unsharded reference."""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from stepscope.config import ProfilerConfig, ReductionConfig, SaveConfig

STEPS = 4
REDUCTIONS = ["min", "max", "mean", "std", "variance", "sum"]
NORMS = ["l1", "l2"]


def make_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 10), nn.ReLU(), nn.Linear(10, 3))


def batch(rank: int, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(1000 * step + rank)
    return torch.randn(4, 6, generator=generator), torch.randint(0, 3, (4,), generator=generator)


def train_rank(rank: int, world_size: int, init_file: str, out_dir: str, seen_file: str) -> None:
    from torch.distributed.fsdp import fully_shard

    from stepscope_torch import Hook

    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world_size)
    try:
        model = make_model()
        for layer in (model[0], model[2]):
            fully_shard(layer)
        fully_shard(model)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        hook = Hook(
            out_dir, save_config=SaveConfig(save_interval=1), include_collections=["weights", "biases", "gradients"],
            include_workers="all", reduction_config=ReductionConfig(reductions=REDUCTIONS, abs_reductions=["max"], norms=NORMS, save_raw_tensor=True),
            profiler_config=ProfilerConfig.disabled(),
        )
        hook.register_module(model)
        hook.register_optimizer(optimizer)
        seen = {"weights": [], "grads": []}
        for step in range(STEPS):
            seen["weights"].append({n: p.full_tensor().clone() for n, p in model.named_parameters()})
            x, y = batch(rank, step)
            loss = nn.functional.cross_entropy(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            seen["grads"].append({n: p.grad.full_tensor().clone() for n, p in model.named_parameters()})
            optimizer.step()
        hook.close()
        if rank == 0:
            torch.save(seen, seen_file)
    finally:
        dist.destroy_process_group()
