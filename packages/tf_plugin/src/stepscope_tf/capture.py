"""Getting tensors out of a compiled train step without patching any class.

Both captures replace one method on one *instance* (the model's optimizer `apply`, a
chosen layer's `call`) by a wrapper that, when armed, copies the tensors it sees into
variables; the hook reads those variables after the step. The wrapper is traced into
`tf.function`/XLA graphs like any other code, so it works in graph mode and with
`run_eagerly=True`. Disarmed, a graph pays one `tf.cond` on a boolean variable per
wrapper; eager code pays a Python `if`.

Under a `tf.distribute` strategy the variables are per replica (ON_READ); readers take
the local replicas' values and combine them on this host, never with a collective (a
collective that only one worker joins would hang a multi-worker job)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

import keras
import tensorflow as tf

logger = logging.getLogger("stepscope")

_ON_READ = tf.VariableSynchronization.ON_READ


def _tf_variable(variable: Any) -> Any:
    return variable.value if isinstance(variable, keras.Variable) else variable


class _Switch:
    """An on/off flag readable both by graphs (a variable) and by eager code (a bool)."""

    def __init__(self, strategy: tf.distribute.Strategy, name: str):
        with strategy.scope():
            self.variable = tf.Variable(False, trainable=False, name=name)
        self.on = False
        # Constants made once and an assign that reads nothing back: half the eager cost.
        self._values = {True: tf.constant(True), False: tf.constant(False)}

    def set(self, on: bool) -> None:
        if on != self.on:  # an eager assign costs tens of microseconds: only on changes
            self.variable.assign(self._values[on], read_value=False)
            self.on = on

    def run_if_on(self, fn: Callable[[], None]) -> None:
        if tf.inside_function():

            def branch() -> tf.Tensor:
                fn()
                return tf.constant(True)

            tf.cond(self.variable, branch, lambda: tf.constant(False))
        elif self.on:
            fn()


class GradientCapture:
    """Wraps `optimizer.apply` (which `apply_gradients` calls too) of one optimizer instance.

    The gradients kept are those handed to the optimizer: before its own clipping, weight
    decay and loss-scale handling; per replica, summed over the local replicas on read
    (what a MirroredStrategy optimizer applies)."""

    def __init__(self, optimizer: Any, variables: Sequence[Any], names: Sequence[str], strategy: tf.distribute.Strategy, on_error: Callable[[BaseException], None]):
        # A LossScaleOptimizer hands unscaled gradients to its inner optimizer.
        self.optimizer = getattr(optimizer, "inner_optimizer", None) or optimizer
        self.strategy = strategy
        self.names = list(names)
        self.switch = _Switch(strategy, "stepscope_gradients_armed")
        self._on_error = on_error
        self._slots: dict[int, tuple[str, tf.Variable]] = {}
        self._sources: list[tuple[str, tuple[Any, ...], str]] | None = None
        with strategy.scope():
            for variable, name in zip(variables, names):
                slot = tf.Variable(
                    tf.zeros(variable.shape, variable.dtype),
                    trainable=False,
                    name="stepscope_gradient",
                    synchronization=_ON_READ,
                    aggregation=tf.VariableAggregation.SUM,
                )
                self._slots[id(variable)] = (name, slot)
                self._slots[id(_tf_variable(variable))] = (name, slot)
        self._original = self.optimizer.apply
        self.optimizer.apply = self._apply  # an instance attribute: the class is untouched

    def _apply(self, grads: Sequence[Any], trainable_variables: Sequence[Any] | None = None) -> Any:
        try:
            self._capture(grads, trainable_variables)
        except Exception as exc:  # capture must never stand between training and its update
            self._on_error(exc)
        return self._original(grads, trainable_variables)

    def _capture(self, grads: Sequence[Any], variables: Sequence[Any] | None) -> None:
        if variables is None:
            variables = getattr(self.optimizer, "_trainable_variables", ())
        pairs = []
        for grad, variable in zip(grads, variables):
            found = self._slots.get(id(variable)) or self._slots.get(id(_tf_variable(variable)))
            if grad is not None and found is not None:
                pairs.append((found[1], grad))
        if not pairs:
            return

        def store() -> None:
            for slot, grad in pairs:
                slot.assign(tf.cast(tf.convert_to_tensor(grad), slot.dtype))

        self.switch.run_if_on(store)

    def sources(self) -> list[tuple[str, tuple[Any, ...], str]]:
        """(name, per-replica variables, "sum") of each gradient kept at the last armed step."""
        if self._sources is None:  # the slots are fixed at construction
            unique = dict(self._slots.values())
            self._sources = [(name, tuple(self.strategy.experimental_local_results(slot)), "sum") for name, slot in unique.items()]
        return self._sources

    def remove(self) -> None:
        if self.optimizer.__dict__.get("apply") == self._apply:
            del self.optimizer.apply


class LayerIOCapture:
    """Wraps `call` of chosen layers and keeps their inputs and/or outputs of armed steps.

    Only the first positional argument counts as the layer's input (nested structures are
    flattened). Variables are created the first time a graph is traced (their shape left
    open: the last batch may be smaller); under a strategy each replica keeps its slice and
    the reader concatenates them along the batch axis in replica order."""

    def __init__(self, strategy: tf.distribute.Strategy, on_error: Callable[[BaseException], None]):
        self.strategy = strategy
        self.switch = _Switch(strategy, "stepscope_layer_io_armed")
        self._on_error = on_error
        self._slots: dict[str, tf.Variable] = {}
        self._wrapped: list[tuple[Any, Callable[..., Any]]] = []

    def wrap(self, layer: Any, inputs_name: Callable[[int, int], str] | None, outputs_name: Callable[[int, int], str] | None) -> None:
        original = layer.call

        def call(*args: Any, **kwargs: Any) -> Any:
            if inputs_name is not None and args:
                self._guarded(inputs_name, args[0])
            outputs = original(*args, **kwargs)
            if outputs_name is not None:
                self._guarded(outputs_name, outputs)
            return outputs

        layer.call = call  # an instance attribute: the class is untouched
        self._wrapped.append((layer, call))

    def _guarded(self, namer: Callable[[int, int], str], structure: Any) -> None:
        try:
            tensors = [t for t in tf.nest.flatten(structure) if isinstance(t, (tf.Tensor, tf.Variable))]
            names = [namer(i, len(tensors)) for i in range(len(tensors))]
            slots = [self._slot(name, tensor.dtype) for name, tensor in zip(names, tensors)]

            def store() -> None:
                for slot, tensor in zip(slots, tensors):
                    slot.assign(tensor)

            self.switch.run_if_on(store)
        except Exception as exc:
            self._on_error(exc)

    def _slot(self, name: str, dtype: tf.DType) -> tf.Variable:
        slot = self._slots.get(name)
        if slot is not None:
            return slot

        def create(_strategy: Any = None) -> tf.Variable:
            with tf.init_scope(), self.strategy.scope():
                return tf.Variable(
                    tf.zeros([0], dtype),
                    shape=tf.TensorShape(None),
                    trainable=False,
                    name="stepscope_layer_io",
                    synchronization=_ON_READ,
                    aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA,
                )

        context = tf.distribute.get_replica_context()
        # Inside a replica function variables may only be created in cross-replica context.
        slot = context.merge_call(create) if context is not None and tf.distribute.has_strategy() else create()
        self._slots[name] = slot
        return slot

    def sources(self) -> list[tuple[str, tuple[Any, ...], str]]:
        """(name, per-replica variables, "concat") of each tensor kept at the last armed step."""
        return [(name, tuple(self.strategy.experimental_local_results(slot)), "concat") for name, slot in self._slots.items()]

    def remove(self) -> None:
        for layer, call in self._wrapped:
            if layer.__dict__.get("call") is call:
                del layer.call
        self._wrapped.clear()
