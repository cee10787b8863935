"""The TensorFlow hook, on core's `HookBase`: what to save of a Keras model at each step and
the captures inside compiled steps. Custom loops use it directly; `StepscopeCallback`
drives it for `fit`/`evaluate`/`predict` through the same public step driver. Options,
schedules, saving, timeline and fail-safe are core's."""

from __future__ import annotations

import functools
import logging
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

import keras
import numpy as np
import tensorflow as tf

from stepscope.capture.hook import HookBase, TensorPlan
from stepscope.config import ALWAYS_SAVED_COLLECTIONS, ROUTINE_COLLECTIONS, CollectionName
from stepscope.exceptions import ConfigError
from stepscope.modes import ModeKeys

from . import naming
from .capture import GradientCapture, LayerIOCapture
from .distribution import rank_from_tf_config
from .reductions import BatchedReader, record_tensor

logger = logging.getLogger("stepscope")

_not_converted = tf.autograph.experimental.do_not_convert
_MAX_LOG_NAMES = 1024  # log names whose plan is kept per run of steps (a model's logs have a few)
_IO_COLLECTIONS = {"inputs": (CollectionName.INPUTS,), "outputs": (CollectionName.OUTPUTS,)}


def _walk_layers(model: Any) -> Iterator[tuple[str, Any]]:
    """(path relative to the model, layer) of every nested layer, depth first. The path is
    the layer's Keras path (the prefix of its variables' paths) when it has one."""
    seen: set[int] = set()

    def walk(parent: Any, parent_path: str) -> Iterator[tuple[str, Any]]:
        for child in getattr(parent, "layers", None) or ():
            if id(child) in seen or isinstance(child, keras.layers.InputLayer):
                continue
            seen.add(id(child))
            path = f"{parent_path}/{child.name}" if parent_path else child.name
            if getattr(child, "path", None):
                path = naming.relative_path(child.path, model.name)
            yield path, child
            yield from walk(child, path)

    yield from walk(model, "")


class Hook(HookBase):
    """Saves tensors of a TensorFlow/Keras training job into `out_dir` (a folder or s3:// URL).

    Custom loop::

        hook = Hook(out_dir, model=model, optimizer=optimizer)
        for x, y in dataset:
            with hook.step(ModeKeys.TRAIN):
                with hook.phase("forward"), tf.GradientTape() as tape:
                    loss = loss_fn(y, model(x, training=True))
                with hook.phase("backward"):
                    grads = tape.gradient(loss, model.trainable_variables)
                hook.save_gradients(grads, model.trainable_variables)
                hook.save_loss(loss)
                with hook.phase("optimizer"):
                    optimizer.apply(grads, model.trainable_variables)
        hook.close()

    Options: those of `stepscope.HookOptions`, plus `model`, `optimizer` and `strategy`.
    With `optimizer=` the hook also captures the gradients the optimizer receives inside
    a `tf.function` train step (no `save_gradients` call needed there). Weights and
    optimizer variables are saved at the start of a step (the values the step used);
    gradients, layer inputs/outputs and scalars are those of the step."""

    framework = "tensorflow"
    builtin_regexes = naming.BUILTIN_REGEXES

    def __init__(self, out_dir: Any = None, *args: Any, model: Any = None, optimizer: Any = None, strategy: tf.distribute.Strategy | None = None, **kwargs: Any):
        if model is not None and not isinstance(model, keras.layers.Layer):
            raise ConfigError(f"model must be a keras Model or Layer, got {type(model).__name__}")
        if optimizer is not None and not hasattr(optimizer, "apply"):
            raise ConfigError(f"optimizer must be a keras optimizer, got {type(optimizer).__name__}")
        if strategy is not None and not isinstance(strategy, tf.distribute.Strategy):
            raise ConfigError(f"strategy must be a tf.distribute.Strategy, got {type(strategy).__name__}")
        self._strategy = strategy
        self._model: Any = None
        self._optimizer: Any = optimizer
        # (name, collections, components, combine): `BatchedReader` entries before planning.
        self._variables: list[tuple[str, tuple[str, ...], tuple[Any, ...], str]] = []
        self._optimizer_entries: list[tuple[str, tuple[str, ...], tuple[Any, ...], str]] = []
        # due names -> (the variable lists planned, their plans): see _on_step_begin.
        self._default_collection: Any = None  # see _routine
        # (The due names of the steps they are for, {log name: (its plan, whether the plan
        # saves the raw value alone)}): a loss-only step's names are one object for a whole
        # run of such steps (step_driver.py), so the plans are looked up once per run.
        self._log_plans: tuple[frozenset[str] | None, dict[str, tuple[TensorPlan | None, bool]]] = (None, {})
        self._planned_by_due: dict[tuple[frozenset[str], bool], tuple[Any, Any, list[tuple[Any, tuple[Any, ...], str]]]] = {}
        # Keys of _planned_by_due whose steps read nothing and arm no capture (the loss-only
        # steps of the capture defaults): such a step only makes sure the captures are off.
        self._quiet: set[tuple[frozenset[str], bool]] = set()
        self._names: dict[int, str] = {}
        self._gradients: GradientCapture | None = None
        self._gradient_collections: tuple[str, ...] = ()
        self._layer_io: LayerIOCapture | None = None
        self._io_collections: tuple[str, ...] = ()
        self._io_armed = False
        self._gradients_armed = False
        self._gradients_given = False
        self._warned: set[str] = set()
        self._reader = BatchedReader()
        super().__init__(out_dir, *args, **kwargs)
        if model is not None and self.enabled:
            self.failsafe.call(self.attach, model, optimizer)

    # --- the plugin contract ------------------------------------------------------------

    def _detect_rank(self) -> tuple[int, int, int]:
        rank, world_size = rank_from_tf_config()
        return rank, world_size, 0

    def _is_framework_value(self, value: Any) -> bool:
        return isinstance(value, (tf.Tensor, tf.Variable, keras.Variable))

    def _capture(self, plan: TensorPlan, value: Any) -> bool:
        if not self._is_framework_value(value):
            return False
        if tf.is_symbolic_tensor(value):
            self._warn_once(
                "symbolic",
                f"stepscope: {plan.name!r} is a symbolic tensor (inside tf.function); return it from the function and save it "
                "outside, or let the hook capture gradients through its optimizer",
            )
            return True
        record_tensor(self, plan, tf.convert_to_tensor(value))
        return True

    def _on_close(self) -> None:
        self.detach()

    def _make_detailed_profilers(self) -> Any:
        # tf.profiler and cProfile in ProfilerConfig's windows (docs/traces.md).
        if not self.profiler_config.detailed or self.store is None:
            return None
        from .profiling import create_profiling

        return create_profiling(self.profiler_config, self.store, rank=self.rank)

    # --- model --------------------------------------------------------------------------

    @property
    def model_name(self) -> str | None:
        return getattr(self._model, "name", None)

    def attach(self, model: Any, optimizer: Any = None) -> bool:
        """Learn `model`'s variables and install the captures it needs (once each).
        Returns True when something was installed: compiled steps traced before must be
        traced again to include it (the callback does that)."""
        if not self.enabled:
            return False
        if self._model is not None and self._model is not model:
            raise ConfigError("this hook is already attached to another model; use one hook per model")
        self._model = model
        self._optimizer = optimizer or self._optimizer
        if self._strategy is None:
            self._strategy = getattr(model, "distribute_strategy", None) or tf.distribute.get_strategy()
        self._refresh_variables()
        installed = False
        self._quiet.clear()  # (what a step arms depends on the captures installed)
        if self._gradients is None and self._optimizer is not None and model.trainable_weights:
            installed |= self._install_gradient_capture()
        if self._layer_io is None:
            installed |= self._install_layer_io()
        return installed

    def _refresh_variables(self) -> None:
        weights = list(self._model.weights)
        if len(weights) == len(self._variables):
            return
        names = naming.variable_names(weights, self.model_name)
        self._names = {id(v): n for v, n in zip(weights, names)}
        self._variables = [(n, (CollectionName.BIASES,) if naming.is_bias(n) else (CollectionName.WEIGHTS,), (v,), "first") for v, n in zip(weights, names)]
        self.claim_names(names)
        self.claim_names(naming.gradient_name(n) for n in names)
        self._declare_scopes()

    def flush(self, timeout: float | None = None) -> None:
        self._declare_scopes()  # optimizers know what they update once they ran a step
        super().flush(timeout)

    def close(self, timeout: float | None = None, *, deadline: Any = None) -> None:
        self._declare_scopes()
        super().close(timeout, deadline=deadline)

    def _declare_scopes(self) -> None:
        try:
            if self._model is not None and self.enabled:
                self._declare_model_scopes()
        except Exception as exc:  # noqa: BLE001 - scopes only refine the rules; never break training
            logger.warning("stepscope: could not declare the model's scopes: %s", exc)

    def _declare_model_scopes(self) -> None:
        """The model is one scope; each nested model (a GAN's generator and discriminator)
        its own, and each optimizer the model holds (its compiled one, or several kept as
        attributes by a custom train_step) its own, so that rules compare layers only within
        one network (HookBase.declare_scope)."""
        model = self._model
        self.declare_scope(self.model_name or "model", [self._name_of(v) for v in model.weights])
        for path, layer in _walk_layers(model):
            if isinstance(layer, keras.Model) and layer.weights:
                self.declare_scope(path, [self._name_of(v) for v in layer.weights])
        optimizers = {id(o): (name, o) for name, o in vars(model).items() if isinstance(o, keras.optimizers.Optimizer)}
        if self._optimizer is not None:
            optimizers.setdefault(id(self._optimizer), ("optimizer", self._optimizer))
        for name, optimizer in optimizers.values():
            # What a Keras 3 optimizer updates is known once it is built (its first step).
            updated = getattr(optimizer, "_trainable_variables", None) or (model.trainable_weights if optimizer is self._optimizer else ())
            if updated:
                self.declare_scope(name.lstrip("_") or "optimizer", [self._name_of(v) for v in updated], kind="optimizer")

    def _optimizer_variables(self) -> list[tuple[str, tuple[str, ...], tuple[Any, ...], str]]:
        # Named once: an optimizer creates its variables at its first step, then keeps them.
        variables = list(self._optimizer.variables)
        if len(variables) != len(self._optimizer_entries):
            collections = (CollectionName.OPTIMIZER_VARIABLES,)
            self._optimizer_entries = [(naming.optimizer_variable_name(v, self.model_name), collections, (v,), "first") for v in variables]
        return self._optimizer_entries

    def _wanted_by(self, names: Sequence[str], builtin: tuple[str, ...]) -> tuple[str, ...]:
        """Included collections that would ever take one of `names`."""
        return tuple(c.name for c in self.included if c.name in builtin or any(c.matches(n) for n in names))

    def _install_gradient_capture(self) -> bool:
        variables = list(self._model.trainable_weights)
        names = [naming.gradient_name(self._name_of(v)) for v in variables]
        self._gradient_collections = self._wanted_by(names, (CollectionName.GRADIENTS,))
        if not self._gradient_collections:
            return False
        self._gradients = GradientCapture(self._optimizer, variables, names, self._strategy, self._capture_failed)
        return True

    @staticmethod
    def _described(layer: Any, kind: str) -> str:
        """What a layer's saved input/output is, for the rules: an output is its activation's
        ("relu" for Dense(activation="relu")), else the layer class; an input is an
        activation's input only for weightless layers (ReLU, Activation)."""
        activation = getattr(getattr(layer, "activation", None), "__name__", None)
        if activation and activation != "linear" and (kind == "outputs" or not getattr(layer, "weights", None)):
            return activation
        return type(layer).__name__

    def _install_layer_io(self) -> bool:
        self._layer_io = LayerIOCapture(self._strategy, self._capture_failed)
        wanted: set[str] = set()
        for path, layer in _walk_layers(self._model):
            namers = {}
            for kind in ("inputs", "outputs"):
                candidates = [naming.layer_io_name(kind, path, 0, 1), naming.layer_io_name(kind, path, 0, 2)]
                found = self._wanted_by(candidates, _IO_COLLECTIONS[kind])
                # `inputs`/`outputs` in include_collections mean every layer; regexes pick some.
                if found:
                    wanted.update(found)
                    namers[kind] = functools.partial(self._layer_io_name, kind, path, self._described(layer, kind))
            if namers:
                self._layer_io.wrap(layer, namers.get("inputs"), namers.get("outputs"))
        self._io_collections = tuple(sorted(wanted))
        return bool(self._io_collections)

    def _layer_io_name(self, kind: str, path: str, layer_class: str, index: int, count: int) -> str:
        """A layer input/output's name; its layer's class goes to the collections metadata
        (rules recognise activations by type)."""
        name = naming.layer_io_name(kind, path, index, count)
        self.note_module_class(name, layer_class)
        return name

    def _capture_failed(self, exc: BaseException) -> None:
        self.failsafe.fail(exc)

    def _name_of(self, variable: Any) -> str:
        name = self._names.get(id(variable))
        if name is None:
            name = naming.relative_path(naming.variable_path(variable), self.model_name)
        return name

    def detach(self) -> None:
        """Remove the captures from the model and optimizer; drop the compiled steps that
        contain them so that later runs trace clean ones."""
        for capture in (self._gradients, self._layer_io):
            if capture is not None:
                capture.remove()
        if (self._gradients or self._layer_io) and self._model is not None:
            for attr in ("train_function", "test_function", "predict_function"):
                if getattr(self._model, attr, None) is not None:
                    setattr(self._model, attr, None)
        self._gradients = self._layer_io = None

    # --- steps --------------------------------------------------------------------------

    def _on_step_begin(self, due: bool) -> None:
        self._gradients_given = False
        if not due:  # the common case: stay cheap
            if self._capturing():
                self._disarm()
            return
        step = self._counters.step
        assert step is not None
        mode = step.mode
        key = (step.due_names, mode == ModeKeys.TRAIN)
        if key in self._quiet and self._model is not None:
            # A loss-only step (every step under the capture defaults): one set lookup
            # instead of planning; it runs after each framework step, on cold caches.
            self._gradients_armed = self._io_armed = False
            if self._capturing():
                self._reader.record(self, [], self._switches(False, False))
            return
        arm_gradients = self._gradients is not None and mode == ModeKeys.TRAIN and any(self.is_due(c) for c in self._gradient_collections)
        arm_io = self._layer_io is not None and any(self.is_due(c) for c in self._io_collections)
        self._gradients_armed, self._io_armed = arm_gradients, arm_io
        entries = []
        if self._model is not None:
            # Under the capture defaults the losses are due at every step: the variables'
            # plans for one set of due collections are the same at each such step (plan()
            # answers by name, collections and due names), so they are made once per set,
            # mode (training plans the optimizer's too) and variable list (a list is
            # replaced, never changed, when variables come).
            cached = self._planned_by_due.get(key)
            if cached is not None and self._routine(step.due_names):
                # Only losses and metrics are due (and the default collection, where it
                # takes no variable by regex): the plans are taken as they were, without
                # asking the model and optimizer for their variables (Keras walks every
                # layer for them: about half of such a step's cost in this hook). Variables
                # that come later are found at the next step where tensors are due, which
                # the default schedule has; only a loss-named variable would be due before.
                entries = cached[2]
            else:
                self._refresh_variables()
                optimizer = self._optimizer_variables() if mode == ModeKeys.TRAIN and self._optimizer is not None else None
                if cached is not None and cached[0] is self._variables and cached[1] is optimizer:
                    entries = cached[2]
                else:
                    entries = self._planned(self._variables) + (self._planned(optimizer) if optimizer is not None else [])
                    self._planned_by_due[key] = (self._variables, optimizer, entries)
            if not entries and not arm_gradients and not arm_io and self._routine(step.due_names):
                self._quiet.add(key)
        # The captures are switched in the same compiled call that reads the weights.
        self._reader.record(self, entries, self._switches(arm_gradients, arm_io))

    def routine_batches_allowed(self, step: Any) -> tuple[Any, ...] | None:
        """Whether steps like the open one `step` may be run by the callback's routine
        batches (stepscope.capture.routine_batches): a step where only losses and metrics
        are due and this hook reads nothing and arms no capture (its key is quiet), or a
        step where nothing is due; the driver does nothing else at them (no profiling
        window, a flat phase log). Returns the captures' switches (such a step must find
        them off), else None."""
        c = self._counters
        log = self._log
        if (
            self._model is None or self._capturing() or c.detailed is not None or (c.now is not None and (log is None or not log.flat))
            or not self.enabled or not self.writes_tensors or self._runtime.writer is None
            or (step is not c.idle and (step.due_names, step.mode == ModeKeys.TRAIN) not in self._quiet)
        ):  # fmt: skip
            return None
        return tuple(switch for switch, _on in self._switches(False, False))

    def _routine(self, due_names: frozenset[str]) -> bool:
        """Whether a step where `due_names` are due saves no variable but those its kept
        plans hold: only the always-saved collections are due, or the default collection
        too while no regex adds variables to it (a save_config of every step makes it due
        at every step)."""
        if due_names <= ALWAYS_SAVED_COLLECTIONS:
            return True
        if not due_names <= ROUTINE_COLLECTIONS:
            return False
        default = self._default_collection
        if default is None:  # (always included: tensor_saver.py; fixed once the hook is made)
            default = self._default_collection = next(c for c in self._saver.included if c.name == CollectionName.DEFAULT)
        return not default.include_regex

    def _switches(self, gradients: bool, io: bool) -> list[tuple[Any, bool]]:
        """(switch, on) of each installed capture."""
        found = []
        if self._gradients is not None:
            found.append((self._gradients.switch, gradients))
        if self._layer_io is not None:
            found.append((self._layer_io.switch, io))
        return found

    def _planned(self, items: Iterable[tuple[str, tuple[str, ...], tuple[Any, ...], str]]) -> list[tuple[Any, tuple[Any, ...], str]]:
        """(plan, components, combine) of the items due at this step."""
        out = []
        for name, collections, components, combine in items:
            plan = self.plan(name, collections)
            if plan is not None:
                out.append((plan, components, combine))
        return out

    def _on_step_end(self) -> None:
        if self._capturing():
            entries = []
            # Gradients handed over by save_gradients win over the capture's copy.
            if self._gradients_armed and self._gradients is not None and not self._gradients_given:
                entries += self._planned((name, (CollectionName.GRADIENTS,), parts, combine) for name, parts, combine in self._gradients.sources())
            if self._io_armed and self._layer_io is not None:
                entries += self._planned(
                    (name, _IO_COLLECTIONS["inputs" if name.startswith(naming.INPUTS_PREFIX) else "outputs"], parts, combine) for name, parts, combine in self._layer_io.sources()
                )
            # Switched off in the call that reads them; the next due step switches them on again.
            self._reader.record(self, entries, self._switches(False, False))
            self._gradients_armed = self._io_armed = False

    def end_step(self, *, raise_on_stop: bool = True) -> None:
        super().end_step(raise_on_stop=raise_on_stop)
        if self._capturing() and not self.enabled:
            self._disarm()  # after a failure the captures must stop copying

    def _capturing(self) -> bool:
        """Whether a capture is switched on (copying in every step until switched off)."""
        return (self._gradients is not None and self._gradients.switch.on) or (self._layer_io is not None and self._layer_io.switch.on)

    def _disarm(self) -> None:
        # After a failure the captures must stop copying: best effort, never raising.
        self._gradients_armed = self._io_armed = False
        for capture in (self._gradients, self._layer_io):
            try:
                if capture is not None:
                    capture.switch.set(False)
            except Exception:  # noqa: BLE001 - disarming is best effort by design
                pass

    # --- values -------------------------------------------------------------------------

    # Called inside a tf.function, these would be converted by autograph, callees included
    # (and its cache of converted functions can confuse one of ours with another): they
    # run as plain Python, where a symbolic value is skipped with a warning.
    @_not_converted
    def save_tensor(self, name: str, value: Any, collections: Iterable[str] | str = CollectionName.DEFAULT) -> None:
        super().save_tensor(name, value, collections)

    @_not_converted
    def save_scalar(self, name: str, value: Any) -> None:
        super().save_scalar(name, value)

    @_not_converted
    def save_loss(self, value: Any, name: str = "loss") -> None:
        super().save_loss(value, name)

    @_not_converted
    def save_value(self, name: str, value: Any, collections: Iterable[str] = ()) -> None:
        super().save_value(name, value, collections)

    @_not_converted
    def save_gradients(self, grads: Sequence[Any], variables: Sequence[Any]) -> None:
        """Save `grads` (eager tensors, e.g. from a GradientTape) of `variables` at this step."""
        if self.enabled and self.due:
            self.failsafe.call(self._save_gradients, grads, variables)

    def _save_gradients(self, grads: Sequence[Any], variables: Sequence[Any]) -> None:
        self._gradients_given = True
        for grad, variable in zip(grads, variables):
            if grad is None:
                continue
            self.save_value(naming.gradient_name(self._name_of(variable)), grad, (CollectionName.GRADIENTS,))

    def save_logs(self, logs: Mapping[str, Any] | None) -> None:
        """Save the scalars of a Keras `logs` dict: losses (`loss`, `*_loss`) in the losses
        collection, the rest in metrics."""
        if not logs or not self.enabled or not self.due:
            return
        try:  # what FailSafe.call does, without its frame (every step under the capture defaults)
            self._save_logs(logs)
        except Exception as exc:
            self.failsafe.fail(exc)

    def _save_logs(self, logs: Mapping[str, Any]) -> None:
        # On every step under the capture defaults, so one frame for all the values: Keras
        # hands batch hooks plain floats (it converts the logs for callbacks that have
        # them), which skip the checks; the plans go straight to the saver (save_value's
        # autograph guard is for calls that could be traced, and this one never is).
        step = self._counters.step  # (due: save_logs checked)
        due, plans = self._log_plans
        if due is not step.due_names:
            due, plans = step.due_names, {}
            self._log_plans = (due, plans)
        tensors = step.tensors
        for name, value in logs.items():
            number = value.__class__ is float
            if not number and not (np.ndim(value) == 0 and isinstance(value, (int, np.number, np.ndarray, tf.Tensor))):
                continue
            planned = plans.get(name)
            if planned is None:
                collections = (CollectionName.LOSSES,) if naming.is_loss_name(name) else (CollectionName.METRICS,)
                found = self._saver.plan(name, collections)
                planned = (found, found is not None and found.raw_only)
                if len(plans) < _MAX_LOG_NAMES:
                    plans[name] = planned
            found, raw_only = planned
            if found is None:
                continue
            if number and raw_only:
                # The value whole, as the Python number it is (the writer frames it as a
                # float64, what np.asarray would make of it): what save() does for it, in
                # one dictionary store instead of a dozen calls.
                tensors[name] = value
            else:
                self._saver.save(found, name, value)

    def _warn_once(self, key: str, message: str) -> None:
        if key not in self._warned:
            self._warned.add(key)
            logger.warning(message)
