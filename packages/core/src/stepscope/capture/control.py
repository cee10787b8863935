"""Control objects left in the job's store for the training process: "stop training" (a
rule's, a black box's) and on-demand requests (`stepscope memory snapshot JOB`: each worker
writes an allocator snapshot; a peer's black box: each worker writes its own), each answered
per worker under `stepscope-control/responses/<id>/`. Hooks poll for them off the training
thread and act on a request at their next TRAIN step end."""

from __future__ import annotations

import json
import logging
import secrets
import threading
import time
from collections.abc import Callable
from typing import Any

import psutil

from ..layout import REQUEST_KEY, RESPONSE_DIR, STOP_KEY, safe_file_name
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


# What a request may ask of every hook of the job.
MEMORY_SNAPSHOT = "memory_snapshot"  # write an allocator snapshot now
BLACK_BOX = "black_box"  # write your black box (a peer found a NaN)
REQUEST_ACTIONS = (MEMORY_SNAPSHOT, BLACK_BOX)
MAX_REQUEST_BYTES = 64 << 10


def send_request(store: Store, action: str, reason: str = "", **details: Any) -> str:
    """Ask every hook of the job to do `action` at its next TRAIN step end; returns the
    request's id (its answers: `read_responses`). A later request replaces an earlier one
    that no hook has seen yet."""
    if action not in REQUEST_ACTIONS:
        raise ValueError(f"unknown request action {action!r}; actions: {', '.join(REQUEST_ACTIONS)}")
    request_id = f"{int(time.time() * 1000):013d}-{secrets.token_hex(4)}"
    body = {"id": request_id, "action": action, "reason": reason, "time": time.time(), **details}
    store.write(REQUEST_KEY, json.dumps(body).encode())
    return request_id


def response_key(request_id: str, worker: str) -> str:
    return f"{RESPONSE_DIR}/{safe_file_name(request_id)}/{safe_file_name(worker)}.json"


def write_response(store: Store, request: dict[str, Any], worker: str, **answer: Any) -> None:
    body = {"id": request.get("id"), "action": request.get("action"), "worker": worker, "time": time.time(), **answer}
    store.write(response_key(str(request.get("id")), worker), json.dumps(body, default=str).encode())


def read_responses(store: Store, request_id: str) -> list[dict[str, Any]]:
    """The answers of the workers that handled request `request_id` so far (unreadable
    ones are skipped: a worker may be writing its answer)."""
    out = []
    for key in store.list(f"{RESPONSE_DIR}/{safe_file_name(request_id)}/"):
        try:
            out.append(json.loads(store.read(key, max_size=MAX_REQUEST_BYTES)))
        except (FileNotFoundError, ValueError, OSError):
            continue
    return sorted(out, key=lambda body: str(body.get("worker")))


def _parse_request(data: bytes) -> dict[str, Any] | None:
    body = _parse_json(data)
    if body is None or body.get("action") not in REQUEST_ACTIONS or not isinstance(body.get("id"), str):
        return None
    return body


_pollers_started = 0
_pollers_lock = threading.Lock()


def _note_poller_started() -> bool:
    """True for the first poller of this process."""
    global _pollers_started
    with _pollers_lock:
        _pollers_started += 1
        return _pollers_started == 1


def _process_start_time() -> float:
    try:
        return float(psutil.Process().create_time())
    except (psutil.Error, OSError):
        return time.time()


def _written_by_this_run(data: bytes, first_in_process: bool) -> bool:
    """Whether a request found in the job when a poller starts belongs to this run: written
    (its `time`) after this process started, by a process whose first hook this is. Ranks of
    one job start together (one launcher), so a peer that failed before this rank's hook
    began wrote its request after this process started; an earlier run's request was
    written before. A second hook in one process (a notebook, tests) cannot tell an earlier
    run's request from a peer's by time, so it passes over what it finds, as before."""
    if not first_in_process:
        return False
    body = _parse_json(data)
    written = body.get("time") if body is not None else None
    return isinstance(written, (int, float)) and written >= _process_start_time()


def _stale_bytes(data: bytes | None, first_in_process: bool) -> bytes | None:
    """What a poller passes over: the bytes found at its start, unless they are this run's."""
    if data is None or _written_by_this_run(data, first_in_process):
        return None
    return data


def _parse_json(data: bytes) -> dict[str, Any] | None:
    try:
        body = json.loads(data)
    except ValueError:
        return None
    return body if isinstance(body, dict) else None


class StopPoller:
    """Checks for a stop request every `interval_s` on a daemon thread, so a training
    step only reads a flag. The check costs one stat (local) or HEAD (S3) per interval."""

    def __init__(self, store: Store, interval_s: float = 2.0, on_request: Callable[[], None] | None = None,
                 on_control: Callable[[], None] | None = None):  # fmt: skip
        """`on_request` runs (on the poller's thread) once `request` is set. A request already
        in the job when the poller starts is an earlier run's (a rule's stop, a black box's)
        and is passed over, so a new run in the same folder does not start stopped, unless it
        was written after this process started and no poller ran in this process before (a
        peer rank that failed before this slow-starting rank's hook began: see
        `_written_by_this_run`). Any request written after that, even by the same rule,
        differs in its bytes (its time) and counts.
        On-demand requests (`send_request`) are looked for in the same polls (one more
        stat/HEAD per interval): a new one waits in `take_control()` and `on_control` runs."""
        self.store = store
        self.interval_s = interval_s
        self.on_request = on_request
        self.on_control = on_control
        self.request: dict[str, Any] | None = None
        first_in_process = _note_poller_started()
        self._stale = _stale_bytes(self._read_bytes(), first_in_process)
        self._control_seen = _stale_bytes(self._read_bytes(REQUEST_KEY), first_in_process)  # an earlier run's is not this run's
        self._control: dict[str, Any] | None = None
        self._control_lock = threading.Lock()
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

    def _read_bytes(self, key: str = STOP_KEY) -> bytes | None:
        try:
            return self.store.read(key, max_size=MAX_REQUEST_BYTES) if self.store.exists(key) else None
        except (FileNotFoundError, OSError, ValueError):
            return None

    def check_control(self) -> bool:
        """Look for a new on-demand request; True when one is waiting."""
        if self.store.exists(REQUEST_KEY):
            data = self._read_bytes(REQUEST_KEY)
            if data is not None and data != self._control_seen:
                self._control_seen = data
                request = _parse_request(data)
                if request is None:
                    logger.warning("stepscope: ignoring an unreadable request in %s", self.store.describe(REQUEST_KEY))
                else:
                    with self._control_lock:
                        self._control = request
                    if self.on_control is not None:
                        self.on_control()
        return self._control is not None

    def take_control(self) -> dict[str, Any] | None:
        """The waiting on-demand request (once), or None."""
        with self._control_lock:
            request, self._control = self._control, None
        return request

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
                self.check_control()
                if self.check_now():
                    return
            except Exception as exc:  # a flaky store must not end the poller
                logger.debug("stepscope: stop poll failed: %s", exc)

    def close(self) -> None:
        self._stop.set()
