"""Reductions computed where a tensor lives (on the GPU), so that a step copies k numbers
to the host instead of the whole tensor. Definitions are exactly those of
`stepscope.reductions.compute` (population std/variance, l1 = sum|x|, l2 = sqrt(sum x^2)),
computed in float64 as numpy does; tests hold the two together."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from stepscope.reductions import normalize_reduction

_REDUCE: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "min": torch.amin,
    "max": torch.amax,
    "mean": torch.mean,
    "std": lambda x: torch.std(x, correction=0),
    "variance": lambda x: torch.var(x, correction=0),
    "sum": torch.sum,
    "prod": torch.prod,
    "l1": lambda x: x.abs().sum(),
    "l2": lambda x: x.square().sum().sqrt(),
}


def reduce_on_device(tensor: torch.Tensor, wanted: Sequence[tuple[str, bool]]) -> torch.Tensor:
    """The requested (reduction, abs) values of a non-empty tensor as one float64 vector on
    the tensor's device (one device-to-host copy fetches them all)."""
    if tensor.numel() == 0:
        raise ValueError("cannot reduce an empty tensor")
    # numpy reduces floats with a float64 accumulator; converting first gives the same numbers.
    x = tensor.detach().to(torch.float64)
    absolute: torch.Tensor | None = None
    values = []
    for name, is_abs in wanted:
        source = x
        if is_abs:
            absolute = source = x.abs() if absolute is None else absolute
        values.append(_REDUCE[normalize_reduction(name)](source))
    return torch.stack(values)
