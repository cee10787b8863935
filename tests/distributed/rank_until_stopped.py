"""One rank of a multi-rank job that trains until a rule stops it (run as a script):
prints "step N at T" after each step and "stopped at N" when the hook stops training."""

from __future__ import annotations

import sys
import time

import torch
from torch import nn

from stepscope.config import ProfilerConfig, SaveConfig
from stepscope_torch import Hook, StopTrainingRequested


def main(out_dir: str, rank: int, world_size: int, nan_step: int) -> None:
    torch.manual_seed(rank)
    model = nn.Linear(4, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    hook = Hook(out_dir, rank=rank, world_size=world_size, save_config=SaveConfig(save_interval=1), include_collections=["weights", "default"],
                include_workers="all", profiler_config=ProfilerConfig.disabled())
    hook.register_module(model)
    hook.register_optimizer(optimizer)
    step = 0
    try:
        while step < 2000:
            loss = model(torch.randn(8, 4)).pow(2).mean()
            loss.backward()
            # The planted fault: rank 0's value turns NaN at nan_step (ExplodingTensor fires).
            hook.save_tensor("signal", torch.tensor(float("nan") if rank == 0 and step >= nan_step else 1.0))
            time.sleep(0.05)
            optimizer.step()
            optimizer.zero_grad()
            print(f"step {step} at {time.time():.3f}", flush=True)
            step += 1
    except StopTrainingRequested:
        print(f"stopped at {step} at {time.time():.3f}", flush=True)
    finally:
        hook.close()


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]))
