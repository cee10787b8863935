"""One rank of the DDP test (a module of its own so torch.multiprocessing.spawn can import it)."""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from stepscope.config import ProfilerConfig, SaveConfig


def train_rank(rank: int, world_size: int, init_file: str, out_dirs: dict[str, str], seen_file: str) -> None:
    from stepscope_torch import Hook

    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world_size)
    try:
        seen = {}
        for include_workers, out_dir in out_dirs.items():
            torch.manual_seed(0)
            model = nn.parallel.DistributedDataParallel(nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 3)))
            optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
            hook = Hook(out_dir, save_config=SaveConfig(save_interval=1), include_collections=["weights", "gradients"],
                        include_workers=include_workers, profiler_config=ProfilerConfig.disabled())
            hook.register_module(model)
            hook.register_optimizer(optimizer)
            generator = torch.Generator().manual_seed(10 + rank)  # each rank its own data
            grads = []
            for _ in range(3):
                x, y = torch.randn(4, 6, generator=generator), torch.randint(0, 3, (4,), generator=generator)
                optimizer.zero_grad()
                nn.functional.cross_entropy(model(x), y).backward()
                grads.append({n: p.grad.clone() for n, p in model.module.named_parameters()})
                optimizer.step()
            hook.close()
            seen[include_workers] = grads
        torch.save(seen, f"{seen_file}.{rank}")
    finally:
        dist.destroy_process_group()
