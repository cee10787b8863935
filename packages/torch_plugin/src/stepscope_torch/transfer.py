"""Getting a step's tensors to the host without stalling the training thread.

CUDA tensors are reduced on the device, then copied with non-blocking copies into pinned
host memory; one CUDA event per step fences the copies and the writer thread waits on it
(`PendingValue.resolve`). CPU tensors are snapshotted (the optimizer updates them in
place right after) and reduced by `stepscope.reductions` on the writer thread, so a step
pays for one memcpy per tensor."""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

import ml_dtypes
import numpy as np
import torch

from stepscope import reductions
from stepscope.capture.hook import TensorPlan
from stepscope.capture.host_arena import HostArena, Scanned
from stepscope.capture.writer import Deferred
from stepscope.exceptions import UnsupportedValue

from .reductions import reduce_on_device

# Sparse tensors are saved dense up to this many elements (a 16 MiB float32 tensor).
MAX_DENSE_ELEMENTS = 1 << 22
# Dtypes the record format has no code for, widened to float32 (the values are exact in it).
_WIDENED = frozenset(
    getattr(torch, name)
    for name in ("float8_e4m3fn", "float8_e4m3fnuz", "float8_e5m2", "float8_e5m2fnuz", "float8_e8m0fnu")
    if hasattr(torch, name)
)
_CHALF = getattr(torch, "complex32", None)
# The whole-byte integer dtypes numpy has (not the sub-byte `uint1`..`int7` ones).
_INTEGERS = frozenset((torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.uint16, torch.uint32, torch.uint64))
_FLOAT4_PACKED = getattr(torch, "float4_e2m1fn_x2", None)


def saveable(tensor: torch.Tensor) -> torch.Tensor:
    """`tensor` (detached) as a dense strided tensor of a dtype the record format holds, or
    UnsupportedValue saying why not. Converted, since the conversion is faithful: a quantized
    tensor to its real values (`dequantize`), a sparse one (COO, CSR, CSC, BSR, BSC) to
    dense up to MAX_DENSE_ELEMENTS, float8 to float32, complex32 to complex64, conjugate
    and negative views resolved. Refused: meta tensors (no data), nested tensors (no one
    shape), bit and sub-byte dtypes, larger sparse tensors."""
    if tensor.device.type == "meta":
        raise UnsupportedValue("a meta tensor has no data")
    if tensor.is_nested:
        raise UnsupportedValue("a nested tensor has no single shape; save its components (tensor.unbind()) instead")
    if tensor.is_quantized:
        tensor = tensor.dequantize()
    if tensor.layout != torch.strided:
        if tensor.numel() > MAX_DENSE_ELEMENTS:
            raise UnsupportedValue(f"a {tensor.layout} tensor of {tensor.numel()} elements is over the {MAX_DENSE_ELEMENTS} saved dense")
        try:
            tensor = tensor.to_dense()
        except (RuntimeError, NotImplementedError, TypeError) as exc:
            raise UnsupportedValue(f"a {tensor.layout} tensor cannot be made dense: {exc}") from None
    dtype = tensor.dtype
    if dtype == _FLOAT4_PACKED:
        raise UnsupportedValue(f"dtype {dtype} packs two 4-bit values in a byte; unpack it to a float dtype first")
    if dtype in _WIDENED:
        return tensor.float()
    if dtype == _CHALF:
        return tensor.to(torch.complex64)
    if not (dtype.is_floating_point or dtype.is_complex or dtype == torch.bool or dtype in _INTEGERS):
        raise UnsupportedValue(f"dtype {dtype} has no numeric values to save")
    return tensor.resolve_conj().resolve_neg()


# Dtypes `saveable` returns unchanged (for a dense, strided tensor that is neither a
# conjugate nor a negative view): what `host_tensor` checks instead of calling it.
_HELD_AS_IS = frozenset((torch.float64, torch.float32, torch.float16, torch.bfloat16, torch.complex128, torch.complex64, torch.bool)) | _INTEGERS


def host_tensor(tensor: Any) -> bool:
    """Whether `tensor` is a plain CPU tensor `saveable` would return as it is: a gradient
    hook then snapshots it without the general path's checks (`HostTransfer.capture_host`).
    Exactly torch.Tensor (not a subclass: a DTensor's device is its local shard's)."""
    return (
        type(tensor) is torch.Tensor
        and tensor.dtype in _HELD_AS_IS
        and tensor.layout is torch.strided
        and tensor.device.type == "cpu"
        and not tensor.is_nested
        and not tensor.is_conj()
        and not tensor.is_neg()
    )


def _to_numpy(tensor: torch.Tensor) -> np.ndarray:
    """A host tensor's values; bfloat16 stays bfloat16 (ml_dtypes, which the format holds)."""
    if tensor.dtype == torch.bfloat16:
        return tensor.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    return tensor.numpy()


def _host_values(plan: TensorPlan, snapshot: np.ndarray | Scanned, wanted: tuple[tuple[str, bool], ...]) -> tuple[Any, dict[tuple[str, bool], Any]]:
    """(raw value or None, reductions) of a host snapshot: the reductions are computed on
    the writer thread."""
    if not wanted:
        return (snapshot if plan.save_raw else None), {}
    array = snapshot.array if isinstance(snapshot, Scanned) else snapshot
    # The snapshot's bytes ride on the first reduction so the writer's queue bound sees them.
    values: dict[tuple[str, bool], Any] = {
        key: Deferred(functools.partial(reductions.compute, array, *key), nbytes=array.nbytes if i == 0 else 8)
        for i, key in enumerate(wanted)
    }
    return (snapshot if plan.save_raw else None), values


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
        return _to_numpy(self.host)


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
        self._arena = HostArena()  # where CPU snapshots go (host_arena.py: no fresh pages per save)

    def capture(self, plan: TensorPlan, tensor: torch.Tensor) -> tuple[Any, dict[tuple[str, bool], Any], tuple[int, ...]]:
        """(raw value or None, reduction values, shape) for `plan`, each a numpy array or a
        PendingValue the writer thread resolves."""
        tensor = saveable(tensor.detach())
        shape = tuple(tensor.shape)
        wanted = plan.reductions if tensor.numel() and not tensor.is_complex() else ()
        if tensor.device.type == "cuda":
            return self._capture_cuda(plan, tensor, wanted) + (shape,)
        if tensor.device.type == "cpu":
            return self.capture_host(plan, tensor)
        # (Another device's `cpu()` is a fresh copy already.)
        return _host_values(plan, _to_numpy(tensor.cpu()), wanted) + (shape,)

    def capture_host(self, plan: TensorPlan, tensor: torch.Tensor) -> tuple[Any, dict[tuple[str, bool], Any], tuple[int, ...]]:
        """What `capture` gives for a CPU tensor that `saveable` returned, or would return
        unchanged (`host_tensor`): its snapshot in the arena (one saved raw takes its CRC
        in the copy's pass: `HostArena.copy_of`), its reductions, its shape. A gradient
        hook runs this inside backward, whose data has the caches: it asks the tensor
        nothing its numpy view already says."""
        source = _to_numpy(tensor.detach())
        snapshot = self._arena.copy_of(source, scan=plan.save_raw)
        if not plan.reductions:
            return (snapshot if plan.save_raw else None), {}, source.shape
        wanted = plan.reductions if source.size and source.dtype.kind != "c" else ()
        return _host_values(plan, snapshot, wanted) + (source.shape,)

    def capture_many(self, items: Sequence[tuple[TensorPlan, Any]], record: Callable[..., None]) -> list[tuple[TensorPlan, Any]]:
        """Snapshot the dense CPU tensors among `items` ((plan, value) pairs) in one pass
        and `record(plan, raw, reductions, shape)` each. One numpy copy per tensor: one
        `torch.cat` of them all measured no faster (the copy is memory-bound either way)
        and its fresh buffer is new pages at every save. Returns the pairs left for
        `capture` one by one (other devices, values that are not tensors or cannot be
        saved: that path says why). DTensors are not for here."""
        batch: list[tuple[TensorPlan, torch.Tensor]] = []
        rest: list[tuple[TensorPlan, Any]] = []
        for plan, value in items:
            if not isinstance(value, torch.Tensor):
                rest.append((plan, value))
                continue
            try:
                tensor = saveable(value.detach())
            except UnsupportedValue:
                rest.append((plan, value))
                continue
            if tensor.device.type != "cpu":
                rest.append((plan, value))
                continue
            batch.append((plan, tensor))
        for plan, tensor in batch:
            record(plan, *self.capture_host(plan, tensor))
        return rest

    def _capture_cuda(self, plan: TensorPlan, tensor: torch.Tensor, wanted: tuple[tuple[str, bool], ...]) -> tuple[Any, dict[tuple[str, bool], Any]]:
        fence = self._fence = self._fence or _StepFence()
        raw = None
        if plan.save_raw:
            host = torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=True)
            host.copy_(tensor, non_blocking=True)
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
