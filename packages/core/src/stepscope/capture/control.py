"""Control objects a rule process leaves in the job's store for the training process:
today only "stop training". Hooks poll for them off the training thread."""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from ..layout import STOP_KEY
from ..store import Store

logger = logging.getLogger("stepscope")


def request_stop(store: Store, rule: str, reason: str = "", **details: Any) -> None:
    """Ask every hook of the job to stop training at the end of its current step."""
    body = {"action": "StopTraining", "rule": rule, "reason": reason, "time": time.time(), **details}
    store.write(STOP_KEY, json.dumps(body).encode())


def read_stop(store: Store) -> dict[str, Any] | None:
    try:
        return json.loads(store.read(STOP_KEY))
    except FileNotFoundError:
        return None
    except ValueError:
        return {"action": "StopTraining", "reason": "unreadable stop request"}


class StopPoller:
    """Checks for a stop request every `interval_s` on a daemon thread, so a training
    step only reads a flag. The check costs one stat (local) or HEAD (S3) per interval."""

    def __init__(self, store: Store, interval_s: float = 2.0, on_request: Callable[[], None] | None = None):
        """`on_request` runs (on the poller's thread) once `request` is set. A request already
        in the job when the poller starts is an earlier run's (a rule's stop, a black box's)
        and is passed over: a new run in the same folder must not start stopped. Any request
        written after that, even by the same rule, differs in its bytes (its time) and counts."""
        self.store = store
        self.interval_s = interval_s
        self.on_request = on_request
        self.request: dict[str, Any] | None = None
        self._stale = self._read_bytes()
        if self._stale is not None:
            earlier = read_stop(store) or {}
            logger.warning("stepscope: a stop request from an earlier run (rule %s) is in %s; this run ignores it",
                           earlier.get("rule"), store.describe(STOP_KEY))
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="stepscope-stop-poller", daemon=True)
        self._thread.start()

    @property
    def stop_requested(self) -> bool:
        return self.request is not None

    def _read_bytes(self) -> bytes | None:
        try:
            return self.store.read(STOP_KEY) if self.store.exists(STOP_KEY) else None
        except (FileNotFoundError, OSError):
            return None

    def check_now(self) -> bool:
        if self.request is None and self.store.exists(STOP_KEY):
            if self._stale is not None and self._read_bytes() == self._stale:
                return False  # the earlier run's request, still there
            self.request = read_stop(self.store) or {"action": "StopTraining"}
            logger.warning("stepscope: stop requested by rule %s: %s", self.request.get("rule"), self.request.get("reason"))
            if self.on_request is not None:
                self.on_request()
        return self.request is not None

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                if self.check_now():
                    return
            except Exception as exc:  # a flaky store must not end the poller
                logger.debug("stepscope: stop poll failed: %s", exc)

    def close(self) -> None:
        self._stop.set()
