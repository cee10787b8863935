"""The writer's health, for its status file: the store's outages (when the current one
began, how many, the longest, the tries), what they cost (steps and files dropped because
the queue was full while the store was not answering), and the tensors that could not be
encoded. Counters the producers read are changed under the writer's lock."""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Iterable
from typing import Any

from .safety import WarnOnce

logger = logging.getLogger("stepscope")


def printable(name: Any) -> str:
    return name.encode("utf-8", "backslashreplace").decode("utf-8") if isinstance(name, str) else repr(name)


class WriterHealth:
    def __init__(self, worker: str, lock: threading.Condition) -> None:
        self.worker = worker
        self._lock = lock
        self.since: float | None = None  # monotonic start of the current outage
        self.outages = 0
        self.retries = 0
        self.longest_s = 0.0
        self.lost_steps: set[int] = set()
        self.lost_files: set[str] = set()
        self.status_due = False  # something new for the status file, published once the store answers
        self.dropped_tensors: dict[int, list[str]] = {}  # step -> tensors that could not be encoded
        self.warn = WarnOnce()

    def lose(self, steps: Iterable[int], files: Iterable[str], what: str, held: str) -> None:
        """(Under the lock.) A job found the queue full during an outage: dropped."""
        self.lost_steps.update(steps)
        self.lost_files.update(files)
        self.status_due = True
        self.warn(
            "lost",
            f"stepscope: writer ({self.worker}): the store is not answering and the queue is full ({held}): "
            f"{what} and later ones are dropped until it answers (listed in the status file)",
        )

    def outage_begins(self, exc: BaseException, max_queue_bytes: int) -> None:
        with self._lock:
            self.retries += 1
            if self.since is not None:
                return
            self.since = time.monotonic()
            self.outages += 1
            self._lock.notify_all()  # a producer waiting for room now drops instead
        logger.warning(
            "stepscope: writer (%s): the store is not answering (%s); holding up to %s bytes of steps (max_queue_bytes) and trying again until it does; training goes on",
            self.worker, exc, f"{max_queue_bytes:,}",
        )

    def outage_ends(self) -> None:
        with self._lock:
            since, self.since = self.since, None
            lasted = time.monotonic() - (since or time.monotonic())
            self.longest_s = max(self.longest_s, lasted)
            lost = len(self.lost_steps)
        logger.warning("stepscope: writer (%s): the store answers again after %.1f s; saving resumed (%d step(s) lost so far)", self.worker, lasted, lost)

    def drop_tensor(self, step: int, name: str, exc: BaseException) -> None:
        self.dropped_tensors.setdefault(step, []).append(name)
        shown = printable(name)
        self.warn(f"drop:{shown}", f"stepscope: tensor {shown!r} of step {step} ({self.worker}) cannot be saved and is skipped: {type(exc).__name__}: {exc}")

    def status_body(self) -> dict[str, Any]:
        """The worker's status: tensors that could not be encoded, and what outages cost."""
        with self._lock:
            lost_steps, lost_files = sorted(self.lost_steps), sorted(self.lost_files)
        drop_steps = sorted(self.dropped_tensors)
        names = sorted({printable(n) for s in drop_steps for n in self.dropped_tensors[s]})
        problems = []
        if names:
            problems.append(f"{len(names)} tensor(s) could not be saved and were skipped (see the training log)")
        if lost_steps or lost_files:
            problems.append(f"{len(lost_steps)} step(s) and {len(lost_files)} file(s) were dropped while the store was not answering and the queue was full")
        status: dict[str, Any] = {
            "state": "degraded",
            "component": f"writer ({self.worker})",
            "error": "; ".join(problems),
            "time": time.time(),
            "pid": os.getpid(),
        }
        if names:
            status.update(dropped_tensors=names[:100], steps_with_drops=drop_steps[:1000])
        if lost_steps or lost_files:
            status.update(lost_steps=lost_steps, lost_files=lost_files)
        if self.outages:
            status["outages"] = {"count": self.outages, "longest_s": round(self.longest_s, 3), "retries": self.retries}
        return status
