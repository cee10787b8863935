"""The "never break training" contract: the opt-out switch, and the fail-safe that turns a
component off after its first error (logged once, recorded in a status file)."""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
import traceback
from collections.abc import Callable
from typing import Any, TypeVar

DISABLE_ENV = "STEPSCOPE_DISABLE"
logger = logging.getLogger("stepscope")
T = TypeVar("T")


def disabled_by_env() -> bool:
    """True when STEPSCOPE_DISABLE is set to anything but "", "0" or "false"."""
    return os.environ.get(DISABLE_ENV, "").strip().lower() not in ("", "0", "false", "no")


class WarnOnce:
    """Logs each kind of problem once as a warning, later repeats at debug level: a
    background part that keeps failing must not flood the training job's log."""

    def __init__(self) -> None:
        self._seen: set[str] = set()

    def __call__(self, what: str, message: str) -> None:
        if what in self._seen:
            logger.debug(message)
            return
        self._seen.add(what)
        logger.warning(message)


def failure_status(component: str, exc: BaseException) -> dict[str, Any]:
    return {
        "state": "failed",
        "component": component,
        "error": f"{type(exc).__name__}: {exc}",
        "traceback": "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)),
        "time": time.time(),
        "host": socket.gethostname(),
        "pid": os.getpid(),
    }


class FailSafe:
    """Runs calls into stepscope on behalf of a training loop. The first exception is
    logged with its traceback, handed to `on_failure` (which writes the status file), and
    the fail-safe disables itself so that every later call is a no-op."""

    __slots__ = ("component", "enabled", "error", "_on_failure", "_lock")  # (compiled hot paths read `enabled`)

    def __init__(self, component: str, on_failure: Callable[[dict[str, Any]], None] | None = None):
        self.component = component
        self.enabled = not disabled_by_env()
        self.error: BaseException | None = None
        self._on_failure = on_failure
        self._lock = threading.Lock()

    def set_on_failure(self, on_failure: Callable[[dict[str, Any]], None] | None) -> None:
        """What runs with the failure's status (`failure_status`) at the first failure, e.g.
        writing the worker's status file once the job's store is open; None: nothing."""
        self._on_failure = on_failure

    def call(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T | None:
        if not self.enabled:
            return None
        try:
            return fn(*args, **kwargs)
        except Exception as exc:  # the contract: nothing escapes into training
            self.fail(exc)
            return None

    def fail(self, exc: BaseException) -> None:
        with self._lock:
            if self.error is not None:
                return
            self.error = exc
            self.enabled = False
        logger.error(
            "stepscope: %s failed and is now disabled for the rest of this run; training continues.\n%s",
            self.component,
            "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)),
        )
        if self._on_failure is not None:
            try:
                self._on_failure(failure_status(self.component, exc))
            except Exception as status_exc:
                logger.error("stepscope: could not record the failure status either: %s", status_exc)


STATUS_WAIT_S = 10.0  # the longest a status write holds its caller (the training thread, on a failure)


def write_status(store, worker: str, status: dict[str, Any], timeout_s: float = STATUS_WAIT_S) -> None:
    """Publish the status file of `worker` in the job's store, waiting at most `timeout_s`:
    the write runs on a daemon thread, so a store that never answers holds no one. Raises
    what the write raised, or StoreUnavailable when it had not ended in time."""
    from ..exceptions import StoreUnavailable
    from ..layout import status_key

    key = status_key(worker)
    data = json.dumps(status, indent=1).encode()
    outcome: list[BaseException | None] = []

    def publish() -> None:
        try:
            store.write(key, data)
            outcome.append(None)
        except BaseException as exc:  # handed to the caller below
            outcome.append(exc)

    thread = threading.Thread(target=publish, name=f"stepscope-status-{worker}", daemon=True)
    thread.start()
    thread.join(max(0.0, timeout_s))
    if not outcome:
        raise StoreUnavailable(f"{store.describe(key)}: the store did not take the status file within {timeout_s:.3g} s")
    if outcome[0] is not None:
        raise outcome[0]
