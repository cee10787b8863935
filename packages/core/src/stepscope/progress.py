"""A progress bar on stderr for long commands (`stepscope export`, `stepscope report`):
one redrawn line on a terminal, nothing when disabled. Callers pass it as a plain
`progress(done, total)` callable, so library code never depends on it."""

from __future__ import annotations

import sys
import time
from typing import TextIO

from .closing import ClosedOnExit


class ProgressBar(ClosedOnExit):
    """`bar(done, total)` redraws `label [#####.....] done/total` at most every `every` s."""

    def __init__(self, label: str, enabled: bool | None = None, stream: TextIO | None = None, every: float = 0.1, width: int = 30):
        self.stream = stream or sys.stderr
        # On by default on a terminal only: a log file would fill with redrawn lines.
        self.enabled = self.stream.isatty() if enabled is None else enabled
        self.label, self.every, self.width = label, every, width
        self._last = 0.0
        self._drawn = False

    def __call__(self, done: int, total: int | None) -> None:
        if not self.enabled:
            return
        now = time.monotonic()
        if now - self._last < self.every and (total is None or done < total):
            return
        self._last = now
        if total:
            filled = int(self.width * min(done, total) / total)
            bar = "#" * filled + "." * (self.width - filled)
            text = f"\r{self.label} [{bar}] {done}/{total}"
        else:
            text = f"\r{self.label} {done}"
        self.stream.write(text)
        self.stream.flush()
        self._drawn = True

    def close(self) -> None:
        if self.enabled and self._drawn:
            self.stream.write("\n")
            self.stream.flush()
            self._drawn = False

