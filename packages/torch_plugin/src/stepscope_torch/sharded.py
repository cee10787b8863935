"""Sharded tensors (DTensor: FSDP2's `fully_shard` parameters and gradients, tensor
parallelism): reductions computed on each rank's shard and combined exactly across the
ranks that hold the shards, without gathering the tensor.

Each rank reduces its local shard in float64 to partial sums (count, sum, sum of |x|, sum
of squares), extremes and products; one all-reduce per kind (SUM, MIN, MAX, PROD) combines
them over the mesh dimensions the tensor is sharded along (replicated dimensions hold
copies and are not combined), and a second SUM gives the variance about the global mean
(two passes, as numpy computes it). All of it stays on the device until one copy brings
the tensor's statistics to the host. The definitions are those of
`stepscope.reductions.compute` on the whole tensor: an l2 norm is the square root of the
summed squares, never a norm of norms. Every rank must take part in the same collectives
in the same order, so the hook of every rank saves (`include_workers="all"`).

The raw value saved is each rank's own shard (worker_<rank>), with its place in the whole
tensor as `stepscope/shard/<name>` = [dim, offset, length, global length of dim]: the
shards of a tensor sharded along dim d, ordered by offset and concatenated along d, are the
tensor."""

from __future__ import annotations

import math
import sys
from typing import Any

import numpy as np
import torch

from stepscope.exceptions import UnsupportedValue
from stepscope.reductions import normalize_reduction

SHARD_PREFIX = "stepscope/shard/"

# torch.distributed.tensor is not imported here: importing it costs seconds, and a DTensor
# exists only once its module was imported (by FSDP2 or the user), so until then no value
# can be one.
_DTENSOR_MODULE = "torch.distributed.tensor"


def is_sharded(value: Any) -> bool:
    module = sys.modules.get(_DTENSOR_MODULE)
    dtensor = getattr(module, "DTensor", None) if module is not None else None
    return dtensor is not None and isinstance(value, dtensor)


def shard_name(name: str) -> str:
    return f"{SHARD_PREFIX}{name}"


def _groups(tensor: Any) -> list[Any]:
    """The process groups of the mesh dimensions `tensor` is sharded along."""
    from torch.distributed.tensor import Partial, Shard

    mesh = tensor.device_mesh
    groups = []
    for dim, placement in enumerate(tensor.placements):
        if isinstance(placement, Partial):
            raise UnsupportedValue("a DTensor with a Partial placement holds unreduced partial values; redistribute it first")
        if isinstance(placement, Shard):
            groups.append(mesh.get_group(dim))
    return groups


def _all_reduce(values: torch.Tensor, op: Any, groups: list[Any]) -> torch.Tensor:
    for group in groups:
        torch.distributed.all_reduce(values, op=op, group=group)
    return values


def combined_reductions(tensor: Any, wanted: tuple[tuple[str, bool], ...]) -> dict[tuple[str, bool], np.ndarray]:
    """The `wanted` (reduction, abs) values of the whole DTensor `tensor`, as 0-d float64
    arrays, from its shards (a collective: every rank holding a shard calls it)."""
    from .transfer import saveable

    groups = _groups(tensor)
    local = saveable(tensor.to_local().detach())
    if local.is_complex():
        raise UnsupportedValue("reductions of complex sharded tensors are not supported")
    x = local.reshape(-1).to(torch.float64)
    absolute = x.abs()
    empty = x.numel() == 0
    ReduceOp = torch.distributed.ReduceOp
    sums = _all_reduce(torch.stack([
        torch.tensor(float(x.numel()), dtype=torch.float64, device=x.device), x.sum(), absolute.sum(), x.square().sum(),
    ]), ReduceOp.SUM, groups)
    inf = torch.tensor(math.inf, dtype=torch.float64, device=x.device)
    lows = _all_reduce(torch.stack([inf, inf] if empty else [x.min(), absolute.min()]), ReduceOp.MIN, groups)
    highs = _all_reduce(torch.stack([-inf, -inf] if empty else [x.max(), absolute.max()]), ReduceOp.MAX, groups)
    one = torch.tensor(1.0, dtype=torch.float64, device=x.device)
    products = torch.stack([one, one] if empty else [x.prod(), absolute.prod()])
    if any(normalize_reduction(name) == "prod" for name, _ in wanted):  # (the same on every rank)
        _all_reduce(products, ReduceOp.PRODUCT, groups)
    # The global means stay on the device (0-d tensors, the same float64 division as on the
    # host): the whole tensor's statistics come back in one device-to-host copy, one sync.
    deviations = _all_reduce(torch.stack([(x - sums[1] / sums[0]).square().sum(), (absolute - sums[2] / sums[0]).square().sum()]), ReduceOp.SUM, groups)
    host = torch.cat([sums, deviations, lows, highs, products]).cpu().tolist()
    n, total, total_abs, squares, deviation, deviation_abs, low, low_abs, high, high_abs, prod, prod_abs = host
    if n == 0:
        raise UnsupportedValue("cannot reduce an empty tensor")
    mean, mean_abs = total / n, total_abs / n
    variance, variance_abs = deviation / n, deviation_abs / n
    table = {
        False: {"min": low, "max": high, "mean": mean, "std": math.sqrt(variance), "variance": variance, "sum": total,
                "prod": prod, "l1": total_abs, "l2": math.sqrt(squares)},
        True: {"min": low_abs, "max": high_abs, "mean": mean_abs, "std": math.sqrt(variance_abs), "variance": variance_abs,
               "sum": total_abs, "prod": prod_abs, "l1": total_abs, "l2": math.sqrt(squares)},
    }
    return {(name, is_abs): np.asarray(table[is_abs][normalize_reduction(name)], dtype=np.float64) for name, is_abs in wanted}


def shard_place(tensor: Any) -> np.ndarray | None:
    """[dim, offset, length, global length] of this rank's shard of a tensor sharded along
    one dimension over one mesh dimension (FSDP2's Shard(0)); None otherwise."""
    from torch.distributed.tensor import Shard

    sharded = [(mesh_dim, p) for mesh_dim, p in enumerate(tensor.placements) if isinstance(p, Shard)]
    if len(sharded) != 1:
        return None
    mesh_dim, placement = sharded[0]
    dim = placement.dim
    size = tensor.shape[dim]
    ranks = tensor.device_mesh.size(mesh_dim)
    index = tensor.device_mesh.get_local_rank(mesh_dim)
    chunk = -(-size // ranks)  # torch.chunk's sizes, which Shard uses
    offset = min(index * chunk, size)
    length = tensor.to_local().shape[dim]
    return np.asarray([dim, offset, length, size], dtype=np.int64)


__all__ = ["SHARD_PREFIX", "combined_reductions", "is_sharded", "shard_name", "shard_place"]
