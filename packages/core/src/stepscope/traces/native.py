"""The trace reader's compiled fast path: `_kineto.c` parses a region of Kineto's event
array straight into columns, about five times faster per core than pyarrow's JSON reader
plus the separator pass it needs. Where the extension is not built (no C compiler at
install time, an unusual platform) or `STEPSCOPE_PURE_PYTHON=1` is set, the reader uses
its pyarrow path alone; where the extension declines a region (anything but plain,
well-typed JSON: see _kineto.c), that region goes to the pyarrow path too, so the tables
are the same either way (tests/traces/test_native.py checks it)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ..compiled import PURE_PYTHON_ENV as PURE_PYTHON_ENV  # (the switch, where callers found it)
from ..compiled import load_extension
from .schema import CATEGORY_KIND, KIND_CODE

# The extension's int64 columns, in its order: times in nanoseconds, then the `args` fields.
# The integer args of an event both parsers read (Kineto writes `bytes` and `Bytes` apart).
ARG_INTS = ("External id", "correlation", "device", "stream", "bytes", "Bytes", "Total Allocated", "Device Id", "Total Reserved", "Addr", "Device Type")
INT_COLUMNS = ("ts", "dur", "pid", "tid", *ARG_INTS)
_KNOWN = tuple((category, KIND_CODE[kind]) for category, kind in CATEGORY_KIND.items())


def compiled() -> Any:
    """The `_kineto` extension module, or None (not built, or $STEPSCOPE_PURE_PYTHON)."""
    return load_extension(__package__, "_kineto")


@dataclass
class Scanned:
    """The kept events of one region (reader._columns' rule), before the Kineto-specific
    columns are derived (reader._kineto_columns): kinds, names and categories coded
    against the region's own lists, and the raw integer columns (MISSING where absent)."""

    kind: np.ndarray
    codes: np.ndarray
    names: list[str]
    category_codes: np.ndarray
    categories: list[str]
    ints: dict[str, np.ndarray]


@dataclass
class Declined:
    """Why the extension left a region to the pyarrow path, and the byte (in the text) where it saw it."""

    reason: str
    position: int


def scan(module: Any, text: bytearray, start: int, end: int) -> Scanned | Declined:
    """`text[start:end]` (whole events separated by commas) parsed by the extension."""
    result = module.scan(text, start, end, _KNOWN, KIND_CODE["other"])
    if result[0] is None:
        return Declined(result[1], result[2])
    _, kind, codes, names, category_codes, categories, ints = result
    return Scanned(
        np.frombuffer(kind, dtype=np.int8),
        np.frombuffer(codes, dtype=np.int32),
        names,
        np.frombuffer(category_codes, dtype=np.int32),
        categories,
        {name: np.frombuffer(column, dtype=np.int64) for name, column in zip(INT_COLUMNS, ints)},
    )
