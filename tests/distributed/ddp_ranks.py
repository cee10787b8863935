"""One rank of the distributed tests (a module of its own so torch.multiprocessing.spawn can
import it): DDP on CPU with gloo, every rank saving (include_workers="all")."""

from __future__ import annotations

import time

import torch
import torch.distributed as dist
from torch import nn

from stepscope.config import ProfilerConfig, SaveConfig

STEPS = 10
STRAGGLER_STEPS = (4, 7)
STRAGGLER_SLEEP_S = 0.4


def train_rank(rank: int, world_size: int, init_file: str, out_dir: str, seen_file: str) -> None:
    from stepscope_torch import Hook

    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world_size)
    try:
        torch.manual_seed(0)
        model = nn.parallel.DistributedDataParallel(nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 3)))
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        hook = Hook(
            out_dir,
            save_config=SaveConfig(save_interval=1),
            include_collections=["weights", "gradients", "default"],
            include_workers="all",
            profiler_config=ProfilerConfig(system_monitor=False, step_timeline=True),
        )
        hook.register_module(model)
        hook.register_optimizer(optimizer)
        straggler = rank == world_size - 1
        generator = torch.Generator().manual_seed(100 + rank)  # each rank its own data
        seen = {"inputs": [], "grads": [], "weights": []}
        for step in range(STEPS):
            x, y = torch.randn(4, 6, generator=generator), torch.randint(0, 3, (4,), generator=generator)
            optimizer.zero_grad()
            if straggler and step in STRAGGLER_STEPS:
                time.sleep(STRAGGLER_SLEEP_S)  # a slow data loader on this rank only
            nn.functional.cross_entropy(model(x), y).backward()
            hook.save_tensor("rank_input", x)  # inside the step (between forward and optimizer)
            seen["inputs"].append(x.clone())
            seen["grads"].append(model.module[0].weight.grad.clone())
            optimizer.step()
        hook.close()
        torch.save(seen, f"{seen_file}.{rank}")
    finally:
        dist.destroy_process_group()
