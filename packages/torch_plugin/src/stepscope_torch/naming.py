"""Stable, readable tensor names for PyTorch models, and the built-in collection regexes.

Names do not depend on how the model is wrapped: DistributedDataParallel, DataParallel and
torch.compile add `module.` / `_orig_mod.` to parameter names, and a job must read the same
whether or not it ran distributed or compiled."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch
from torch import nn

from stepscope.config import CollectionName

# smdebug's PyTorch regexes (REFERENCE.md), with one change: optimizer state is named
# `optimizer/<param>/<state>` and must not fall into weights/biases because the parameter
# name inside it ends in "weight"/"bias".
BUILTIN_REGEXES: dict[str, list[str]] = {
    CollectionName.WEIGHTS: [r"^(?!gradient|optimizer/).*weight"],
    CollectionName.BIASES: [r"^(?!gradient|optimizer/).*bias"],
    CollectionName.GRADIENTS: [r"^gradient"],
    CollectionName.LOSSES: [r"[Ll]oss_(?!input).*output"],
    CollectionName.INPUTS: [r"_input_\d+$"],
    CollectionName.OUTPUTS: [r"_output_\d+$"],
}

_COMPILE_SEGMENT = "_orig_mod"


def parameter_collections(name: str) -> tuple[str, ...]:
    """The collections parameter `name` belongs to whatever it is called: every parameter
    but a bias is a weight. smdebug's regexes (above) go by the name alone, and a module's
    own parameters often have other names (a graph attention layer's `W` and `a`, a
    transformer's `cls_token`, a norm's `scale`), which its "weights" then missed; a name
    with "bias" in it is left to the biases regex."""
    return () if "bias" in name else (CollectionName.WEIGHTS,)


def unwrap(model: nn.Module) -> nn.Module:
    """The user's module inside DDP / DataParallel / torch.compile wrappers."""
    wrappers: tuple[type, ...] = (nn.parallel.DistributedDataParallel, nn.DataParallel)
    while True:
        if isinstance(model, wrappers):
            model = model.module  # type: ignore[assignment]  # always a Module in these wrappers
        elif isinstance(getattr(model, _COMPILE_SEGMENT, None), nn.Module):
            model = getattr(model, _COMPILE_SEGMENT)
        else:
            return model


def clean_name(name: str) -> str:
    """Drop `_orig_mod` segments that torch.compile adds to compiled submodules' names."""
    if _COMPILE_SEGMENT not in name:
        return name
    return ".".join(part for part in name.split(".") if part != _COMPILE_SEGMENT)


def prefixed(model_name: str | None, name: str) -> str:
    """`name` of a model registered as `model_name` (one hook, several models): `<model>.<name>`."""
    return f"{model_name}.{name}" if model_name else name


def named_parameters(model: nn.Module, prefix: str | None = None) -> list[tuple[str, nn.Parameter]]:
    """Parameters by qualified name, each starting with `prefix.` when the model has a name."""
    return [(prefixed(prefix, clean_name(name)), p) for name, p in unwrap(model).named_parameters()]


def named_modules(model: nn.Module, prefix: str | None = None) -> list[tuple[str, nn.Module]]:
    """Submodules by qualified name; the top-level module goes by the model's name, else its
    class name."""
    base = unwrap(model)
    named = []
    for name, module in base.named_modules():
        if isinstance(getattr(module, _COMPILE_SEGMENT, None), nn.Module):
            continue  # a compiled wrapper: its inner module is listed under the same name
        named.append((prefixed(prefix, clean_name(name)) if name else prefix or type(base).__name__, module))
    return named


def gradient_name(param_name: str) -> str:
    return f"gradient/{param_name}"


def optimizer_state_name(param_name: str, state_key: str) -> str:
    return f"optimizer/{param_name}/{state_key}"


def activation_name(module_name: str, kind: str, index: int) -> str:
    """`<module>_output_<i>` / `<module>_input_<i>` (kind is "output" or "input")."""
    return f"{module_name}_{kind}_{index}"


def flatten_tensors(value: Any) -> Iterator[torch.Tensor]:
    """Tensors in a module's inputs or outputs, in a stable order (nested tuples, lists, dicts)."""
    if value.__class__ is tuple and all(item.__class__ is torch.Tensor for item in value):
        yield from value  # a module's usual arguments (a loss's (output, target)): no recursion
    elif isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, (tuple, list)):
        for item in value:
            yield from flatten_tensors(item)
    elif isinstance(value, dict):
        for item in value.values():
            yield from flatten_tensors(item)
