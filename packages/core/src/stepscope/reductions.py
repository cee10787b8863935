"""Reductions of a tensor to one number, and the names they are saved under.

Definitions (the plugins compute the same on the device; tests hold them to these):
std and variance are population statistics (ddof=0); l1 = sum |x|, l2 = sqrt(sum x^2)
over all elements (vector norms of the flattened tensor, whatever its shape); the abs_
variants apply to |x|. Empty tensors have no reductions. A saved reduction is read back as
it was written, whatever definition its writer used (smdebug reduced numpy arrays with
np.linalg.norm: matrix norms for 2-D arrays); see docs/reading.md."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from .config import NORMS, REDUCTIONS

REDUCTION_PREFIX = "smdebug/reductions/"


def reduction_tensor_name(tensor_name: str, reduction: str, abs: bool = False) -> str:
    return f"{REDUCTION_PREFIX}{'abs_' if abs else ''}{reduction}/{tensor_name}"


def parse_reduction_tensor_name(name: str) -> tuple[str, str, bool] | None:
    """(tensor name, reduction, abs) of a reduction tensor name, else None."""
    if not name.startswith(REDUCTION_PREFIX):
        return None
    reduction, _, tensor = name[len(REDUCTION_PREFIX) :].partition("/")
    is_abs = reduction.startswith("abs_")
    base = reduction[4:] if is_abs else reduction
    return tensor, normalize_reduction(base), is_abs


def normalize_reduction(name: str) -> str:
    """Accept smdebug's spellings ("l2_norm") as well as ours ("l2")."""
    base = name[: -len("_norm")] if name.endswith("_norm") else name
    if base not in REDUCTIONS and base not in NORMS:
        raise ValueError(f"unknown reduction {name!r}; valid: {', '.join(REDUCTIONS + NORMS)}")
    return base


def compute(value: np.ndarray, reduction: str, abs: bool = False) -> np.ndarray:
    """The reduction of `value` as a 0-d float64 array (numpy's own definitions)."""
    reduction = normalize_reduction(reduction)
    array = np.asarray(value)
    if array.size == 0:
        raise ValueError(f"cannot compute {reduction} of an empty tensor")
    if array.dtype.kind in "biu" or array.dtype.itemsize < 4:
        array = array.astype(np.float64)
    if abs:
        array = np.abs(array)
    if reduction == "l1":
        result = np.sum(np.abs(array), dtype=np.float64)
    elif reduction == "l2":
        result = np.sqrt(np.sum(np.square(array, dtype=np.float64)))
    elif reduction in ("sum", "prod", "mean", "std", "variance"):
        func: Any = {"sum": np.sum, "prod": np.prod, "mean": np.mean, "std": np.std, "variance": np.var}[reduction]
        result = func(array, dtype=np.float64)
    else:
        result = getattr(np, reduction)(array)
    return np.asarray(result, dtype=np.float64)


def saved_names(tensor_name: str, reduction: str, abs: bool = False) -> tuple[str, ...]:
    """The names a saved reduction of `tensor_name` may have (smdebug spelled the norms
    `l1_norm`/`l2_norm` in some versions, `l1`/`l2` in others)."""
    base = normalize_reduction(reduction)
    spellings = (base, f"{base}_norm") if base in NORMS else (base,)
    return tuple(reduction_tensor_name(tensor_name, s, abs) for s in spellings)


def saved_or_computed(read: Callable[[str], np.ndarray | None], tensor_name: str, reduction: str, abs: bool = False) -> float | None:
    """The reading rule every reader (Trial, the rule engine) shares: the reduction the job
    saved, when it saved one (its value as written, whatever definition the writer used:
    see docs/reading.md on legacy norms), else the reduction computed here from the raw
    tensor. `read(name)` returns a value saved at the step in question, or None. None when
    neither was saved."""
    for name in saved_names(tensor_name, reduction, abs):
        saved = read(name)
        if saved is not None:
            return float(np.asarray(saved).reshape(-1)[0])
    raw = read(tensor_name)
    if raw is None or np.asarray(raw).size == 0:
        return None
    return float(compute(raw, reduction, abs))
