"""Getting a step's tensors to the host without stalling the training thread.

CUDA tensors are reduced on the device, then copied with non-blocking copies into pinned
host memory; one CUDA event per step fences the copies and the writer thread waits on it
(`PendingValue.resolve`). CPU tensors are snapshotted (the optimizer updates them in
place right after) and reduced by `stepscope.reductions` on the writer thread, so a step
pays for one memcpy per tensor."""

from __future__ import annotations

import functools
from typing import Any

import numpy as np
import torch

from stepscope import reductions
from stepscope.hook import TensorPlan
from stepscope.writer import Deferred

from .reductions import reduce_on_device

_NUMPY_UNSUPPORTED = (torch.bfloat16,)


def _host_dtype(tensor: torch.Tensor) -> torch.Tensor:
    """numpy has no bfloat16: widen such tensors (on their device) first."""
    return tensor.float() if tensor.dtype in _NUMPY_UNSUPPORTED else tensor


class _StepFence:
    """The CUDA event after a step's copies, and the step's reductions gathered into one copy."""

    def __init__(self) -> None:
        self.event: torch.cuda.Event | None = None
        self.reduction_parts: list[torch.Tensor] = []
        self.reductions_host: torch.Tensor | None = None

    def add_reductions(self, values: torch.Tensor) -> int:
        offset = sum(p.numel() for p in self.reduction_parts)
        self.reduction_parts.append(values)
        return offset

    def close(self) -> None:
        if self.reduction_parts:
            gathered = torch.cat(self.reduction_parts)
            self.reductions_host = torch.empty(gathered.shape, dtype=gathered.dtype, pin_memory=True)
            self.reductions_host.copy_(gathered, non_blocking=True)
            self.reduction_parts = []
        self.event = torch.cuda.Event()
        self.event.record()

    def wait(self) -> None:
        assert self.event is not None, "a step's values were resolved before the step ended"
        self.event.synchronize()


class _PinnedCopy:
    """PendingValue: a tensor in flight to pinned host memory."""

    def __init__(self, host: torch.Tensor, fence: _StepFence):
        self.host, self.fence, self.nbytes = host, fence, host.numel() * host.element_size()

    def resolve(self) -> np.ndarray:
        self.fence.wait()
        return self.host.numpy()


class _PinnedReduction:
    """PendingValue: one number of the step's gathered reductions."""

    nbytes = 8

    def __init__(self, fence: _StepFence, index: int):
        self.fence, self.index = fence, index

    def resolve(self) -> np.ndarray:
        self.fence.wait()
        assert self.fence.reductions_host is not None
        return self.fence.reductions_host[self.index].numpy().copy()


class HostTransfer:
    """Turns the tensors of one step into values for `HookBase.record`."""

    def __init__(self) -> None:
        self._fence: _StepFence | None = None

    def capture(self, plan: TensorPlan, tensor: torch.Tensor) -> tuple[Any, dict[tuple[str, bool], Any], tuple[int, ...]]:
        """(raw value or None, reduction values, shape) for `plan`, each a numpy array or a
        PendingValue the writer thread resolves."""
        tensor = tensor.detach()
        shape = tuple(tensor.shape)
        wanted = plan.reductions if tensor.numel() and not tensor.is_complex() else ()
        if tensor.device.type == "cuda":
            return self._capture_cuda(plan, tensor, wanted) + (shape,)
        array = _host_dtype(tensor).cpu().numpy().copy()
        if not wanted:
            return (array if plan.save_raw else None), {}, shape
        # The snapshot's bytes ride on the first reduction so the writer's queue bound sees them.
        values: dict[tuple[str, bool], Any] = {
            key: Deferred(functools.partial(reductions.compute, array, *key), nbytes=array.nbytes if i == 0 else 8)
            for i, key in enumerate(wanted)
        }
        return (array if plan.save_raw else None), values, shape

    def _capture_cuda(self, plan: TensorPlan, tensor: torch.Tensor, wanted: tuple[tuple[str, bool], ...]) -> tuple[Any, dict[tuple[str, bool], Any]]:
        fence = self._fence = self._fence or _StepFence()
        raw = None
        if plan.save_raw:
            source = _host_dtype(tensor)
            host = torch.empty(source.shape, dtype=source.dtype, pin_memory=True)
            host.copy_(source, non_blocking=True)
            raw = _PinnedCopy(host, fence)
        values: dict[tuple[str, bool], Any] = {}
        if wanted:
            offset = fence.add_reductions(reduce_on_device(tensor, wanted))
            values = {key: _PinnedReduction(fence, offset + i) for i, key in enumerate(wanted)}
        return raw, values

    def end_step(self) -> None:
        """Fence this step's copies; call before handing the step to the writer."""
        if self._fence is not None:
            self._fence.close()
            self._fence = None
