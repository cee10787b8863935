"""One deadline for closing: STEPSCOPE_CLOSE_TIMEOUT_S bounds a whole `close()` (writer,
status file, step timeline, system monitor, cost file together, not each) and the exit of
the process (every stepscope exit handler shares one deadline)."""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from typing import Any

from ..exceptions import ConfigError

logger = logging.getLogger("stepscope")

CLOSE_TIMEOUT_ENV = "STEPSCOPE_CLOSE_TIMEOUT_S"
DEFAULT_CLOSE_TIMEOUT_S = 60.0


def close_timeout_from_env(default: float = DEFAULT_CLOSE_TIMEOUT_S) -> float:
    raw = os.environ.get(CLOSE_TIMEOUT_ENV, "").strip()
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not value > 0 or value != value or value == float("inf"):
        raise ConfigError(f"{CLOSE_TIMEOUT_ENV} must be a positive number of seconds, got {raw!r}")
    return value


class Deadline:
    """A point on the monotonic clock, `seconds` from now."""

    __slots__ = ("seconds", "end")

    def __init__(self, seconds: float):
        self.seconds = float(seconds)
        self.end = time.monotonic() + self.seconds

    def left(self) -> float:
        return max(0.0, self.end - time.monotonic())

    @property
    def passed(self) -> bool:
        return time.monotonic() >= self.end

    def earlier(self, seconds: float) -> Deadline:
        """This deadline moved `seconds` sooner (time kept for what must come after)."""
        sooner = Deadline(0.0)
        sooner.seconds, sooner.end = max(0.0, self.seconds - seconds), self.end - seconds
        return sooner

    def within(self, seconds: float) -> Deadline:
        """The sooner of this deadline and `seconds` from now."""
        other = Deadline(seconds)
        return self if self.end <= other.end else other

    def __repr__(self) -> str:
        return f"Deadline({self.seconds:g} s, {self.left():.2f} s left)"


# The one piece of global state here, forced by the interpreter: exit handlers run one after
# another, and the first stepscope handler to run starts the deadline they all share.
_exit_deadline: Deadline | None = None
_exit_lock = threading.Lock()


def exit_deadline() -> Deadline:
    """The deadline of the process's exit, started by the first caller (an exit handler)."""
    global _exit_deadline
    with _exit_lock:
        if _exit_deadline is None:
            _exit_deadline = Deadline(close_timeout_from_env())
        return _exit_deadline


def start_within(fn: Callable[[], Any], name: str) -> threading.Thread:
    """Start `fn` on a daemon thread (a part that hangs on a silent store then holds neither
    close() nor the process's exit); join it with `finish_within`."""
    def run() -> None:
        try:
            fn()
        except Exception as exc:  # closing never raises
            logger.warning("stepscope: %s failed while closing: %s", name, exc)

    thread = threading.Thread(target=run, name=f"stepscope-close-{name}", daemon=True)
    thread.start()
    return thread


def finish_within(thread: threading.Thread, deadline: Deadline) -> bool:
    """Whether the part on `thread` ended before `deadline`."""
    thread.join(deadline.left())
    return not thread.is_alive()


def run_within(fn: Callable[[], Any], deadline: Deadline, name: str) -> bool:
    """Run `fn` on a daemon thread; True when it ended before `deadline`, else False (it
    goes on, harmlessly, on its own thread). Never raises."""
    return finish_within(start_within(fn, name), deadline)
