"""A training script as a user launches it with `torchrun --nproc_per_node=N`: the hook is
made before the process group, with no rank given; it names its worker from torchrun's
environment."""

from __future__ import annotations

import sys

import torch
import torch.distributed as dist
from torch import nn

from stepscope.config import ProfilerConfig, SaveConfig
from stepscope_torch import Hook


def main(out_dir: str) -> None:
    hook = Hook(out_dir, save_config=SaveConfig(save_interval=1), include_collections=["gradients"], include_workers="all",
                profiler_config=ProfilerConfig.disabled())
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = nn.parallel.DistributedDataParallel(nn.Linear(4, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    hook.register_module(model)
    hook.register_optimizer(optimizer)
    generator = torch.Generator().manual_seed(dist.get_rank())
    for _ in range(3):
        loss = model(torch.randn(3, 4, generator=generator)).square().mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        hook.save_scalar("rank", float(dist.get_rank()))
    hook.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])
