"""Reductions of a tensor to one number, and the names they are saved under.

Definitions (the plugins compute the same on the device; tests hold them to these):
std and variance are population statistics (ddof=0); l1 = sum |x|, l2 = sqrt(sum x^2);
the abs_ variants apply to |x|. Empty tensors have no reductions."""

from __future__ import annotations

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
