"""Built-in rules over layer activations: DeadRelu, SaturatedActivation,
PoorWeightInitialization. They need raw activation tensors (batch first)."""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..health import IO_SUFFIX as _IO
from ..health import InactiveTracker, Series, activation_kind, activation_layers, inactive_unit_series, inactive_units, io_side, mode_name
from ..health import activation_input as _activation_input
from ..trial import Trial
from .base import Rule, RuleParams, TensorRequest, require
from .params import ranged
from .tensors import GRADIENT_REGEX, TRAINING_MODES

# Module classes whose output is an affine map with a bias (a ReLU's input when the ReLU is a function).
_AFFINE = re.compile(r"^(Lazy)?(Linear|Conv(Transpose)?[123]d)$")  # torch names: `<module>_output_0`


def _parent(module: str) -> str:
    """The enclosing module of a torch module name ("fc1.0" -> "fc1", "fc1" -> "")."""
    return module.rsplit(".", 1)[0] if "." in module else ""


@dataclass(frozen=True)
class _LayerParams(RuleParams):
    tensor_regex: tuple[str, ...] = ()
    threshold_inactivity: float = ranged(1.0, "percent")
    threshold_layer: float = ranged(50.0, "percent")
    # A unit counts only when it was inactive at each of the layer's last `persistence`
    # saved steps (each a different batch): 1 is SageMaker's one-batch judgement.
    persistence: int = ranged(1, "positive_int")
    # Also inspect tensors the hook recorded as a ReLU's output / a tanh's or sigmoid's input.
    by_module_class: bool = False


class _InactiveUnits(Rule):
    """Shared by DeadRelu and SaturatedActivation: per inspected layer, the share of units
    active in less than `threshold_inactivity` % of the batch, against `threshold_layer`."""

    state: str  # "dead", "saturated": names the finding in messages and details
    params: _LayerParams

    # Which activations (ACTIVATION_CLASSES keys) and which side of them this rule reads
    # when `by_module_class` is on.
    kinds: tuple[str, ...] = ()
    side: str = "output"

    def __init__(self, base_trial: Trial, **kwargs: Any):
        super().__init__(base_trial, **kwargs)
        # Per layer and mode: the inactive-unit masks of its last `persistence` saved steps.
        self._recent = InactiveTracker(self.params.persistence)
        self._affine: tuple[int, dict[str, str]] | None = None

    def finish(self) -> None:
        self.need(self.params.persistence, self._recent.longest(), "saved steps of a layer")

    def layers(self) -> list[str]:
        """The layers this rule inspects (the app charts the same ones)."""
        return self._layers()

    def active_units(self, name: str, value: np.ndarray, step: int) -> np.ndarray | None:
        """Which elements of `value` (layer `name` at global `step`) are active; None: not
        judged at this step. The app's dead / saturated shares use the same."""
        return self._active(name, value, step)

    def _layers(self) -> list[str]:
        chosen = self.select_tensors((), self.params.tensor_regex, all_when_empty=False)
        if self.params.by_module_class:
            by_class = [n for kind in self.kinds for n in activation_layers(self.trial, kind, self.side)]
            chosen = sorted(set(chosen) | set(by_class))
        return chosen

    def has_inputs(self) -> bool:
        return bool(self._layers())

    def _active(self, name: str, value: np.ndarray, step: int) -> np.ndarray | None:
        """Which elements of `value` are active; None: not judged at this step."""
        raise NotImplementedError

    def _read_as(self, name: str) -> str:
        """How a layer's tensor was read, when it is not the activation's own (for messages)."""
        return ""

    def required_tensors(self, step: int):
        return [TensorRequest(n, step) for n in self._layers() if self.has_raw(n, step)]

    def invoke_at_step(self, step: int) -> bool:
        p = self.params
        fired = False
        for name in self._layers():
            value = self.value(name, step) if self.has_raw(name, step) else None
            if value is None or value.size == 0:
                continue
            active = self._active(name, value, step)
            if active is None:
                continue
            # stepscope.health: the share of units inactive at each of the last `persistence`
            # saved steps of this mode (a chain never joins TRAIN and EVAL batches)
            inactive = self._recent.add(name, mode_name(self.trial, step), inactive_units(value, active, p.threshold_inactivity))
            if inactive is None:
                continue
            if inactive > p.threshold_layer:
                over = f" at each of its last {p.persistence} saved steps" if p.persistence > 1 else ""
                message = f"{name}: {inactive:.1f}% of units {self.state}{over} > {p.threshold_layer:g}%{self._read_as(name)}"
                extra: dict[str, Any] = {f"percent_{self.state}": inactive}
                self.violation(step, message, tensor=name, value=inactive, threshold=p.threshold_layer, **extra)
                fired = True
        return fired


# Module classes (lower case) of activations whose every input passes a gradient (a
# slope below zero, or smooth): none of their units can be dead.
NEVER_DEAD = frozenset({"leakyrelu", "prelu", "rrelu", "elu", "celu", "selu", "gelu", "silu", "mish", "softplus"})


@dataclass(frozen=True)
class DeadReluParams(_LayerParams):
    tensor_regex: tuple[str, ...] = (".*relu_output",)


class DeadRelu(_InactiveUnits):
    """Fires when more than `threshold_layer` percent (default 50) of a layer's ReLUs are
    dead: a unit is dead when it is active (> 0) in less than `threshold_inactivity`
    percent (default 1) of the batch at each of the layer's last `persistence` saved steps
    (1: SageMaker's judgement of one batch; the default set uses 3). Inspects tensors
    matching `tensor_regex` (default `.*relu_output`): save ReLU outputs under such names.

    With `by_module_class` (the default set) it also inspects the outputs of ReLU modules
    (and Keras layers with a relu activation), and sees ReLUs applied as functions
    (`F.relu`, no module to hook) through the layer before them: a torch Linear or Conv
    output saved at a step whose bias gradient was saved too, where a unit is off when its
    output is <= 0 on the batch and its bias gradient is exactly 0 (no gradient passed the
    unit, which for a unit <= 0 on every sample only a ReLU-like zero slope does). Layers
    beside a ReLU module (same parent module) are left to that module's output. Outputs of
    modules whose every input passes a gradient (LeakyReLU, PReLU, ELU, GELU, ...:
    `NEVER_DEAD`) are not judged, even when their names match `tensor_regex`."""

    params: DeadReluParams
    min_saved_steps = 1
    # (Named precisely: a job that saved every layer output, pytorch/examples' GCN with its
    # own GraphConv and F.relu, still gives this rule nothing, and "layer outputs" misled.)
    to_save = "outputs of ReLU layers (for F.relu: the Linear/Conv output before it and its bias gradient)"
    # A unit silent on one batch is not yet dead (a healthy MLP autoencoder showed 95 % of
    # its units off on one batch, alive on others): dead means off at three saved steps in a
    # row. Half or more of a layer off on every batch is a finding even while the loss falls
    # (pytorch/examples' VAE: docs/rules.md, "Dead ReLUs over time").
    preset = {"by_module_class": True, "persistence": 3}

    state = "dead"
    kinds = ("relu",)
    side = "output"

    def _layers(self) -> list[str]:
        chosen = super()._layers()
        if self.params.by_module_class:
            chosen = sorted(set(chosen) | set(self._pre_activations()))
        # The default regex `.*relu_output` also matches a LeakyReLU named `leakyrelu` (as
        # pytorch/examples' GAT names its attention scores' one): half its outputs are
        # negative by design and each passes a gradient, so a module of such a class is
        # never judged dead, whatever it is called.
        return [n for n in chosen if (self.trial.module_class(n) or "").lower() not in NEVER_DEAD]

    def _pre_activations(self) -> dict[str, str]:
        """Outputs of torch affine layers (Linear, Conv) whose bias gradient was saved:
        {output name: bias gradient name}. A ReLU applied as a function (`F.relu`, no module
        to hook) is seen through them: its input is such an output (see `_active`)."""
        names = self.trial.tensor_names()
        if self._affine is None or self._affine[0] != len(names):  # a job being followed gains tensors
            known, found = set(names), {}
            # Modules whose ReLUs are modules (their outputs are judged as such): the layers
            # beside them feed those, not a functional ReLU, and are not judged twice.
            with_relu_modules = {_parent(_IO.sub("", n)) for n in activation_layers(self.trial, "relu", "output") if _IO.search(n)}
            for name in names:
                if io_side(name) == "output" and _IO.search(name) and _AFFINE.match(self.trial.module_class(name) or ""):
                    module = _IO.sub("", name)
                    bias = f"gradient/{module}.bias"
                    if bias in known and _parent(module) not in with_relu_modules:
                        found[name] = bias
            self._affine = (len(names), found)
        return self._affine[1]

    def required_tensors(self, step: int):
        requests = list(super().required_tensors(step))
        return requests + [TensorRequest(g, step) for n, g in self._pre_activations().items() if self.has_raw(g, step)]

    def _read_as(self, name: str) -> str:
        if name in self._pre_activations():
            return " (read as a functional ReLU's input: <= 0 on the whole batch and no gradient through the unit)"
        return ""

    def _active(self, name: str, value: np.ndarray, step: int) -> np.ndarray | None:
        bias = self._pre_activations().get(name)
        if bias is None:
            return value > 0
        # An affine layer's output read as a ReLU's input: a unit is off where its
        # pre-activation is <= 0, and counts as dead only when it also passed no gradient
        # (its bias gradient exactly 0 at the same step): a ReLU's zero slope below 0 is the
        # only way a unit <= 0 on the whole batch gets none, so logits, means and
        # log-variances (<= 0 but with a gradient) are never counted.
        gradient = self.value(bias, step) if self.has_raw(bias, step) else None
        if gradient is None or value.ndim < 2:
            return None
        flowing = np.asarray(gradient).reshape(-1) != 0
        # The unit axis: channels (axis 1) for torch convolutions, the last one for a Linear
        # (over (batch, ..., features)).
        axis = 1 if (self.trial.module_class(name) or "").startswith("Conv") else value.ndim - 1
        if value.shape[axis] != flowing.size:
            return None
        shape = [1] * value.ndim
        shape[axis] = flowing.size
        return (value > 0) | flowing.reshape(shape)


@dataclass(frozen=True)
class SaturatedActivationParams(_LayerParams):
    tensor_regex: tuple[str, ...] = (".*tanh_input", ".*sigmoid_input")
    threshold_tanh: tuple[float, ...] = (-9.4999, 9.4999)
    threshold_sigmoid: tuple[float, ...] = (-23.0, 16.99999)

    def validate(self, owner: str) -> None:
        super().validate(owner)
        for name in ("threshold_tanh", "threshold_sigmoid"):
            bounds = getattr(self, name)
            require(owner, name, bounds, len(bounds) == 2 and bounds[0] < bounds[1], "(min, max) with min < max")


class SaturatedActivation(_InactiveUnits):
    """Fires when more than `threshold_layer` percent (50) of a tanh or sigmoid layer's
    units are saturated: a unit is saturated when its input lies inside
    (min, max) — `threshold_tanh` (-9.4999, 9.4999), `threshold_sigmoid` (-23, 16.99999) —
    in less than `threshold_inactivity` percent (1) of the batch. Inspects the inputs of
    activations, `tensor_regex` (default `.*tanh_input`, `.*sigmoid_input`); the name says
    which function it is."""

    params: SaturatedActivationParams
    min_saved_steps = 1
    to_save = "outputs of tanh and sigmoid layers"
    # Practical saturation: beyond |x| 4 tanh's slope is under 0.0013, beyond |x| 8
    # sigmoid's under 0.0004; a unit counts as saturated when it is outside that range for
    # 90 % of the batch. Healthy tanh/sigmoid MLPs stay at 0 % of units, unscaled inputs at 100 %.
    preset = {"by_module_class": True, "threshold_tanh": (-4.0, 4.0), "threshold_sigmoid": (-8.0, 8.0), "threshold_inactivity": 10.0}

    state = "saturated"
    kinds = ("tanh", "sigmoid")
    side = "input"

    def _bounds(self, name: str) -> tuple[float, ...] | None:
        kind = activation_kind(self.trial.module_class(name))
        lowered = kind or name.lower()
        if "tanh" in lowered:
            return self.params.threshold_tanh
        if "sigmoid" in lowered:
            return self.params.threshold_sigmoid
        return None

    def _layers(self) -> list[str]:
        layers = [n for n in super()._layers() if self._bounds(n) is not None]
        if self.params.by_module_class:
            # Jobs that saved layer outputs but not inputs: judge the outputs, mapped back to
            # the input the activation saw (arctanh / logit; exact ±1 or 0/1 map to ±inf).
            inputs = set(layers)
            for kind in self.kinds:
                for name in activation_layers(self.trial, kind, "output"):
                    if _IO.sub("_input_0", name) not in inputs and name.replace("outputs/", "inputs/", 1) not in inputs:
                        layers.append(name)
        return sorted(set(layers))

    def _active(self, name: str, value: np.ndarray, step: int) -> np.ndarray | None:
        bounds = self._bounds(name)
        if bounds is None:
            return np.ones(value.shape, dtype=bool)
        low, high = bounds
        if io_side(name) == "output" and activation_kind(self.trial.module_class(name)) is not None:
            value = _activation_input(activation_kind(self.trial.module_class(name)), value)
        return (value > low) & (value < high)


def default_inactive_series(trial: Trial) -> tuple[list[Series], dict[str, int]]:
    """The dead / saturated unit shares the default set's DeadRelu and SaturatedActivation
    judge, as stepscope.health series (one per layer they inspect and mode, named
    "layer (dead, TRAIN)"), with each rule's `persistence`: what the app and the report show."""
    rows: list[Series] = []
    persistence = {}
    for rule in (DeadRelu(trial, **DeadRelu.preset), SaturatedActivation(trial, **SaturatedActivation.preset)):
        persistence[rule.state] = rule.params.persistence
        for name in rule.layers():
            for series in inactive_unit_series(trial, name, functools.partial(rule.active_units, name), rule.params.threshold_inactivity, rule.params.persistence):
                series.name = f"{name} ({rule.state}, {series.mode})"
                rows.append(series)
    return rows, persistence


@dataclass(frozen=True)
class PoorWeightInitializationParams(RuleParams):
    activation_inputs_regex: tuple[str, ...] = (".*relu_input",)
    threshold: float = 10.0
    distribution_range: float = ranged(0.001, "non_negative")
    patience: int = ranged(5, "positive_int")
    steps: int = ranged(10, "positive_int")

    def validate(self, owner: str) -> None:
        require(owner, "threshold", self.threshold, self.threshold >= 1, ">= 1")


class PoorWeightInitialization(Rule):
    """Looks at the first `steps` (10) saved training steps and fires when
    (1) the variances of activation inputs (`activation_inputs_regex`, default
    `.*relu_input`) differ across layers by more than a factor `threshold` (10),
    (2) some gradient's 5th-to-95th percentile spread is below `distribution_range`
    (0.001), or (3) the loss did not reach a new minimum for `patience` (5) saved steps."""

    params: PoorWeightInitializationParams
    to_save = "layer outputs, gradients and losses at the start"

    def finish(self) -> None:
        self.need(self.params.steps, self._seen, "saved TRAIN steps at the start")

    def __init__(self, base_trial: Trial, **kwargs: Any):
        super().__init__(base_trial, **kwargs)
        self._seen = 0
        self._best_loss: float | None = None
        self._since_best = 0

    def _activations(self) -> list[str]:
        return self.select_tensors((), self.params.activation_inputs_regex, all_when_empty=False)

    def _gradients(self) -> list[str]:
        return self.select_tensors(("gradients",), GRADIENT_REGEX)

    def _losses(self) -> list[str]:
        return self.select_tensors(("losses",), () if "losses" in self.trial.collections() else ("[Ll]oss",))

    def _in_window(self, step: int) -> bool:
        return self.mode_of(step)[0] in TRAINING_MODES and self._seen < self.params.steps

    def required_tensors(self, step: int):
        if not self._in_window(step):
            return []
        names = self._activations() + self._gradients() + self._losses()
        return [TensorRequest(n, step) for n in names if self.has_raw(n, step)]

    def invoke_at_step(self, step: int) -> bool:
        if not self._in_window(step):
            return False
        self._seen += 1
        fired = self._check_variances(step)
        fired = self._check_gradients(step) or fired
        fired = self._check_loss(step) or fired
        return fired

    def _check_variances(self, step: int) -> bool:
        variances = {}
        for name in self._activations():
            value = self.value(name, step) if self.has_raw(name, step) else None
            if value is not None and value.size:
                variances[name] = float(np.var(value.astype(np.float64)))
        if len(variances) < 2:
            return False
        low, high = min(variances.values()), max(variances.values())
        ratio = np.inf if low == 0 else high / low
        if ratio > self.params.threshold:
            self.violation(step, f"activation input variances differ across layers by {ratio:.3g}x > {self.params.threshold:g}", variances=variances, ratio=ratio)
            return True
        return False

    def _check_gradients(self, step: int) -> bool:
        fired = False
        for name in self._gradients():
            value = self.value(name, step) if self.has_raw(name, step) else None
            if value is None or value.size < 2 or value.dtype.kind not in "fc":
                continue
            low, high = np.percentile(value.astype(np.float64), [5, 95])
            spread = float(high - low)
            if spread < self.params.distribution_range:
                self.violation(step, f"{name}: gradient 5-95 percentile spread {spread:.3g} < {self.params.distribution_range:g}", tensor=name, spread=spread)
                fired = True
        return fired

    def _check_loss(self, step: int) -> bool:
        arrays = [self.value(n, step) for n in self._losses() if self.has_raw(n, step)]
        values = [float(np.mean(v)) for v in arrays if v is not None and v.size]
        if not values:
            return False
        loss = float(np.mean(values))
        if self._best_loss is None or loss < self._best_loss:
            self._best_loss, self._since_best = loss, 0
            return False
        self._since_best += 1
        if self._since_best >= self.params.patience:
            self.violation(step, f"loss has not improved for {self._since_best} saved steps (best {self._best_loss:.4g})", loss=loss)
            return True
        return False
