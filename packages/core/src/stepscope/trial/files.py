"""What the parts of a trial share about reading a job's files: the files found unreadable
(each skipped and named once, with the reason) and reading many files at once."""

from __future__ import annotations

import logging
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

from ..exceptions import CorruptRecord
from ..store import Store

logger = logging.getLogger("stepscope")

_In = TypeVar("_In")
_Out = TypeVar("_Out")


class Problems:
    """The files a trial could not read and skipped: file -> why, logged the first time."""

    def __init__(self, store: Store):
        self._store = store
        self._found: dict[str, str] = {}

    def skip(self, key: str, exc: BaseException, what: str, then: str = "") -> None:
        where = self._store.describe(key)
        reason = exc.reason if isinstance(exc, CorruptRecord) else str(exc)
        if where not in self._found:
            logger.warning("stepscope: skipping unreadable %s %s: %s%s", what, where, reason, f" ({then})" if then else "")
        self._found[where] = reason

    def listed(self) -> list[str]:
        return [f"{where}: {why}" for where, why in self._found.items()]


def read_all(store: Store, read: Callable[[_In], _Out], items: list[_In]) -> list[_Out]:
    """`read` of every item, in order; concurrently where the store gains from it (S3)."""
    if store.concurrent_reads and len(items) > 1:
        with ThreadPoolExecutor(max_workers=16) as pool:
            return list(pool.map(read, items))
    return [read(item) for item in items]
