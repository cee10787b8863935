"""Tensor names for Keras objects: layer path + variable name, relative to the model so that
they read like `dense_1/kernel` and do not depend on the model's own auto-generated name."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

GRADIENTS_PREFIX = "gradients/"
OPTIMIZER_PREFIX = "optimizer/"
INPUTS_PREFIX = "inputs/"
OUTPUTS_PREFIX = "outputs/"

# Prefixed names belong to their own collection; everything else with a "/" is a variable.
_NOT_PREFIXED = r"^(?!(gradients|optimizer|inputs|outputs|smdebug)/)"

# Built-in collection regexes for TensorFlow. The plugin also tells the core which
# collection each tensor belongs to, so these matter for names it does not know about
# (custom tensors) and for readers of a running job.
BUILTIN_REGEXES: dict[str, list[str]] = {
    "weights": [_NOT_PREFIXED + r"[^/].*/(?!bias$)[^/]+$"],
    "biases": [_NOT_PREFIXED + r"[^/].*/bias$"],
    "gradients": ["^" + GRADIENTS_PREFIX],
    "optimizer_variables": ["^" + OPTIMIZER_PREFIX],
    "inputs": ["^" + INPUTS_PREFIX],
    "outputs": ["^" + OUTPUTS_PREFIX],
    "losses": [r"^(val_)?loss$", r"_loss$"],
}


def is_loss_name(name: str) -> bool:
    """Keras names its total loss `loss` and per-output losses `<output>_loss`."""
    return name in ("loss", "val_loss") or name.endswith("_loss")


def _strip_tf_suffix(name: str) -> str:
    # tf.Variable names carry the output index (":0"); Keras variables do not.
    head, sep, tail = name.rpartition(":")
    return head if sep and tail.isdigit() else name


def relative_path(path: str, model_name: str | None) -> str:
    """`path` without the leading model name (`sequential/dense/kernel` -> `dense/kernel`)."""
    if model_name and path.startswith(model_name + "/"):
        return path[len(model_name) + 1 :]
    return path


def variable_path(variable: Any) -> str:
    """Keras 3 variables know their path; plain tf.Variables only their (scoped) name."""
    path = getattr(variable, "path", None) or getattr(variable, "name", None) or "variable"
    return _strip_tf_suffix(str(path))


def variable_names(variables: Iterable[Any], model_name: str | None = None) -> list[str]:
    """Readable, unique names of `variables`, in order; a clash gets `_1`, `_2`, ..."""
    names: list[str] = []
    seen: dict[str, int] = {}
    for variable in variables:
        name = relative_path(variable_path(variable), model_name)
        count = seen.get(name, 0)
        seen[name] = count + 1
        names.append(name if count == 0 else f"{name}_{count}")
    return names


def is_bias(name: str) -> bool:
    return name.rsplit("/", 1)[-1] == "bias"


def gradient_name(variable_name: str) -> str:
    return GRADIENTS_PREFIX + variable_name


def optimizer_variable_name(variable: Any, model_name: str | None = None) -> str:
    """`optimizer/dense_kernel_momentum`, `optimizer/iteration`. The optimizer's own name
    (`adam`, `adam_1`: a process-wide counter) is dropped, and so is the model name Keras
    puts in slot names (it names them after the variable path with "/" replaced by "_")."""
    path = variable_path(variable)
    rest = path.split("/", 1)[1] if "/" in path else path
    if model_name and rest.startswith(model_name + "_"):
        rest = rest[len(model_name) + 1 :]
    return OPTIMIZER_PREFIX + rest


def layer_io_name(kind: str, layer_path: str, index: int, count: int) -> str:
    """`outputs/dense_1`; layers with several tensors get `outputs/lstm/0`, `outputs/lstm/1`."""
    prefix = INPUTS_PREFIX if kind == "inputs" else OUTPUTS_PREFIX
    return f"{prefix}{layer_path}" if count == 1 else f"{prefix}{layer_path}/{index}"
