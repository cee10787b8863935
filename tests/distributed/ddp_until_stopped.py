"""One rank of a DDP job (gloo, CPU) that trains until a rule stops it (run as a script):
prints "step N" after each step and "stopped at N" when the hook stops training. Each rank
looks for the stop request on its own timer (`poll_s`): a huge one on a rank means it never
sees the request itself and stops only because its peers agreed to."""

from __future__ import annotations

import sys
import time

import torch
import torch.distributed as dist
from torch import nn

from stepscope.config import ProfilerConfig, SaveConfig
from stepscope_torch import Hook, StopTrainingRequested

MAX_STEPS = 3000


def main(out_dir: str, rank: int, world_size: int, init_file: str, poll_s: float) -> None:
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world_size)
    try:
        torch.manual_seed(0)
        model = nn.parallel.DistributedDataParallel(nn.Linear(4, 2))
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
        hook = Hook(out_dir, control_poll_s=poll_s, save_config=SaveConfig(save_interval=1), include_collections=["default"],
                    include_workers="all", profiler_config=ProfilerConfig.disabled())
        hook.register_module(model)
        hook.register_optimizer(optimizer)
        generator = torch.Generator().manual_seed(rank)
        step = 0
        try:
            while step < MAX_STEPS:
                x = torch.randn(8, 4, generator=generator)
                model(x).pow(2).mean().backward()  # DDP's gradient all-reduce: the ranks go in step
                hook.save_tensor("rank_input", x)
                time.sleep(0.01)
                optimizer.step()
                optimizer.zero_grad()
                print(f"step {step}", flush=True)
                step += 1
        except StopTrainingRequested:
            print(f"stopped at {step} agreed {hook.stop_requested}", flush=True)
        finally:
            hook.close()
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], float(sys.argv[5]))
