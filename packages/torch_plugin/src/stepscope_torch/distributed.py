"""The torch hook's multi-rank part: the ranks (torch.distributed, else torchrun's
environment), the ranks' agreement on the step to stop at (one all-reduce), and sharded
tensors (DTensor, FSDP2) saved from their shards."""

from __future__ import annotations

import os
from typing import Any

import torch

from stepscope.capture.hook import HookBase, TensorPlan
from stepscope.exceptions import UnsupportedValue

from . import sharded
from .transfer import HostTransfer


def distributed_rank() -> tuple[int, int, int]:
    """(rank, world size, local rank) from torch.distributed, else torchrun's environment."""
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_rank(), torch.distributed.get_world_size(), local_rank
    return int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1)), local_rank


class DistributedParts(HookBase):
    """What `Hook` does for multi-rank jobs (the plugin contract's rank and stop-agreement
    methods, and the capture of sharded tensors)."""

    _transfer: HostTransfer

    def _detect_rank(self) -> tuple[int, int, int]:
        return distributed_rank()

    def _can_agree_on_stop(self) -> bool:
        dist = torch.distributed
        return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1

    def _agree_on_stop(self, local: bool) -> bool:
        # One integer, MAX over the default group: 1 on every rank once any rank saw the
        # request. NCCL reduces device tensors only; gloo (and "cpu:gloo,cuda:nccl") CPU ones.
        dist = torch.distributed
        device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else torch.device("cpu")
        flag = torch.tensor([1 if local else 0], dtype=torch.int32, device=device)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        return bool(flag.item())

    def _capture_sharded(self, plan: TensorPlan, value: Any) -> None:
        """A DTensor (FSDP2): reductions of the whole tensor combined from the shards,
        raw values per shard with their place (sharded.py)."""
        if self.world_size > 1 and self.options.include_workers != "all":
            raise UnsupportedValue(
                "a sharded tensor (DTensor, FSDP2): pass include_workers='all' so that every rank takes part in "
                "combining the statistics of its shard"
            )
        reduced = sharded.combined_reductions(value, plan.reductions) if plan.reductions and value.numel() else {}
        raw = None
        if plan.save_raw:
            raw = self._transfer.capture(TensorPlan(plan.name, True, (), False), value.to_local())[0]
            place = sharded.shard_place(value)
            if place is not None:
                self.record(TensorPlan(sharded.shard_name(plan.name), True, (), False), place)
        self.record(plan, raw, reduced, tuple(value.shape))


__all__ = ["DistributedParts", "distributed_rank"]
