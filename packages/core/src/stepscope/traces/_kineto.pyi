"""Types of the trace reader's compiled fast path (_kineto.c; native.py says what it is for)."""

from collections.abc import Sequence
from typing import Any

INT_COLUMNS: int

def scan(text: Any, start: int, end: int, categories: Sequence[tuple[str, int]], other: int, /) -> tuple[Any, ...]: ...
