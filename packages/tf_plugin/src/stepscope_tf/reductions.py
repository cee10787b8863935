"""Reductions computed with TensorFlow ops where the tensor lives, to the definitions of
`stepscope.reductions` (float64 accumulation, population std/variance, l1 = sum |x|,
l2 = sqrt(sum x^2)), and host copies that finish on the writer thread."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import tensorflow as tf

from stepscope.capture.hook import HookBase, TensorPlan


def reduce(tensor: tf.Tensor, reduction: str, abs: bool = False) -> tf.Tensor:
    """One reduction of `tensor` as a 0-d float64 tensor, on the tensor's device."""
    x = tf.cast(tensor, tf.float64)
    if abs:
        x = tf.abs(x)
    if reduction == "min":
        return tf.reduce_min(x)
    if reduction == "max":
        return tf.reduce_max(x)
    if reduction == "mean":
        return tf.reduce_mean(x)
    if reduction == "std":
        return tf.math.reduce_std(x)  # population (ddof=0), as numpy's default
    if reduction == "variance":
        return tf.math.reduce_variance(x)
    if reduction == "sum":
        return tf.reduce_sum(x)
    if reduction == "prod":
        return tf.reduce_prod(x)
    if reduction == "l1":
        return tf.reduce_sum(tf.abs(x))
    if reduction == "l2":
        return tf.sqrt(tf.reduce_sum(tf.square(x)))
    raise ValueError(f"unknown reduction {reduction!r}")


class HostCopy:
    """A `PendingValue`: an eager tensor (an immutable snapshot) copied to the host only
    when the writer thread asks, so the training thread never waits for the copy."""

    __slots__ = ("tensor", "nbytes")

    def __init__(self, tensor: tf.Tensor):
        if tensor.dtype == tf.bfloat16:
            tensor = tf.cast(tensor, tf.float32)  # numpy has no bfloat16 the writer knows
        self.tensor = tensor
        elements = tensor.shape.num_elements() or 0
        self.nbytes = elements * (tensor.dtype.size if tensor.dtype != tf.string else 1)

    def resolve(self) -> Any:
        return self.tensor.numpy()


def record_tensor(core: HookBase, plan: TensorPlan, tensor: tf.Tensor) -> None:
    """Hand `plan`'s part of an eager `tensor` to the core: reductions on the device, the raw
    value as a pending host copy."""
    values: Mapping[tuple[str, bool], Any] = {}
    numeric = tensor.dtype.is_floating or tensor.dtype.is_integer or tensor.dtype.is_bool
    if plan.reductions and numeric and (tensor.shape.num_elements() or 0) > 0:
        values = {(r, a): HostCopy(reduce(tensor, r, a)) for r, a in plan.reductions}
    core.record(plan, raw=HostCopy(tensor) if plan.save_raw else None, reduction_values=values, shape=tensor.shape.as_list())


class BatchedReader:
    """Reads (and reduces) many variables in one compiled call. An eager op costs tens of
    microseconds, and a due step may read hundreds of variables; one `tf.function` per
    distinct set of plans (usually the same at every due step) costs one call.

    An entry is (plan, components, combine): `components` are variables (several for the
    per-replica parts of a distributed variable), `combine` is "first", "sum" or "concat".
    `switches` are (switch, on) pairs for the captures' on/off flags (objects with a boolean
    `variable` and a Python `on`): they are set in the same call, since an eager assign
    between two steps costs about as much as the whole read."""

    def __init__(self) -> None:
        self._functions: dict[tuple[Any, ...], _CompiledRead] = {}

    def record(self, core: HookBase, entries: Sequence[tuple[TensorPlan, Sequence[Any], str]], switches: Sequence[tuple[Any, bool]] = ()) -> None:
        switches = [(switch, on) for switch, on in switches if switch.on != on]
        if not entries:
            for switch, on in switches:
                switch.set(on)
            return
        key = (tuple((plan, tuple(id(c) for c in components), combine) for plan, components, combine in entries), tuple((id(s), on) for s, on in switches))
        function = self._functions.get(key)
        if function is None:
            function = self._functions[key] = _CompiledRead(list(entries), [(switch.variable, on) for switch, on in switches])
        outputs = function()
        for switch, on in switches:
            switch.on = on
        for (plan, _, _), static_shape, (raw, reduced, shape) in zip(entries, function.static_shapes, outputs):
            shape = static_shape if static_shape is not None else [int(d) for d in shape.numpy()]  # type: ignore[union-attr]
            values = {}
            if reduced and int(np.prod(shape)) > 0:
                values = {wanted: HostCopy(value) for wanted, value in zip(plan.reductions, reduced)}
            core.record(plan, raw=HostCopy(raw) if plan.save_raw else None, reduction_values=values, shape=shape)


def _combine(components: Sequence[Any], combine: str) -> tf.Tensor:
    values = [tf.convert_to_tensor(c) for c in components]
    if len(values) == 1 or combine == "first":
        return values[0]
    if combine == "sum":
        return tf.add_n(values)
    return tf.concat(values, axis=0)


class _QuietBatchedReads(logging.Filter):
    """TF warns about "retracing" when several functions share one Python body; ours do by
    design (one per set of due tensors, each traced once), so that warning is dropped."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "stepscope_batched_read" not in record.getMessage()


# The one global change this plugin makes, and only to TF's logger: see _QuietBatchedReads.
tf.get_logger().addFilter(_QuietBatchedReads())


class _CompiledRead:
    """One traced read of a fixed set of entries. Shapes known when tracing (all variables
    but layer inputs/outputs) are kept here instead of leaving the function: each output
    turned into numpy costs an eager call."""

    def __init__(self, entries: list[tuple[TensorPlan, Sequence[Any], str]], assigns: Sequence[tuple[tf.Variable, bool]] = ()):
        self.static_shapes: list[list[int] | None] = []
        self._entries = entries
        self._assigns = list(assigns)
        # Traced now (filling static_shapes); a concrete function is called without the
        # dispatch on arguments a `tf.function` does: tens of microseconds less per call.
        self._function = tf.function(self.stepscope_batched_read, autograph=False).get_concrete_function()

    def stepscope_batched_read(self) -> list[tuple[tf.Tensor, list[tf.Tensor], tf.Tensor | None]]:
        out = []
        self.static_shapes.clear()
        for plan, components, combine in self._entries:
            tensor = _combine(components, combine)
            numeric = tensor.dtype.is_floating or tensor.dtype.is_integer or tensor.dtype.is_bool
            reduced = [reduce(tensor, r, a) for r, a in plan.reductions] if numeric else []
            known = tensor.shape.is_fully_defined()
            self.static_shapes.append(tensor.shape.as_list() if known else None)
            # The raw value leaves the function as a tensor of its own (variables may change).
            out.append((tf.identity(tensor) if plan.save_raw else tf.zeros([0]), reduced, None if known else tf.shape(tensor)))
        for variable, on in self._assigns:
            variable.assign(on, read_value=False)
        return out

    def __call__(self) -> list[tuple[tf.Tensor, list[tf.Tensor], tf.Tensor | None]]:
        return self._function()

