"""Allocator snapshots on demand for PyTorch: `hook.snapshot_memory()` in the training
code, or `stepscope memory snapshot JOB` from outside (a request every hook of the job
honours at its next TRAIN step end, stepscope.capture.control). The snapshot is
`torch.cuda.memory._snapshot()` (segments and blocks; with the allocation history and its
stacks when `_record_memory_history` runs, e.g. `ProfilerConfig(memory_history=True)`),
taken on the training thread, then gzip-pickled and written on a background thread to
`profiler-output/framework/pytorch/memory/rank<r>/<step>_pid<pid>_ondemand<n>.pickle.gz`
(read with stepscope.traces.snapshot). Bounded: one snapshot in flight per hook, at most
`max_bytes` compressed. Without CUDA (a CPU-only torch, no GPU) there is no allocator to
snapshot: the answer says so and nothing is written."""

from __future__ import annotations

import gzip
import logging
import os
import pickle
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import torch

from stepscope.capture.control import write_response
from stepscope.capture.detailed import output_key
from stepscope.layout import MEMORY_SNAPSHOT_DIR

logger = logging.getLogger("stepscope")

SNAPSHOT_SUFFIX = ".pickle.gz"
MAX_SNAPSHOT_BYTES = 512 << 20  # compressed: a larger snapshot is not written (the answer says why)
NO_CUDA = (
    "no CUDA allocator to snapshot: torch.cuda is not available in this process (a CPU-only torch build, or no GPU); "
    "allocator snapshots need CUDA"
)


class SnapshotUnavailable(RuntimeError):
    """This process has no CUDA allocator snapshot to give (the message says why)."""


def cuda_snapshot() -> dict[str, Any]:
    """The CUDA caching allocator's state now (`torch.cuda.memory._snapshot()`): the one
    place this module touches torch.cuda.memory (tests replace `_snapshot` there). On a
    CPU-only torch the function is there but its C half is not: SnapshotUnavailable."""
    take = getattr(torch.cuda.memory, "_snapshot", None)
    if take is None:
        raise SnapshotUnavailable(f"this torch ({torch.__version__}) has no torch.cuda.memory._snapshot")
    try:
        snapshot = take()
    except (AttributeError, RuntimeError, AssertionError) as exc:  # no CUDA half / no driver / not initialisable
        if torch.cuda.is_available():
            raise
        raise SnapshotUnavailable(f"{NO_CUDA} ({type(exc).__name__}: {exc})") from None
    if not isinstance(snapshot, dict):
        raise SnapshotUnavailable(f"torch.cuda.memory._snapshot() returned {type(snapshot).__name__}, not a dict")
    return snapshot


@dataclass
class SnapshotResult:
    """What one snapshot request gave: the key written (once `done`), or why not."""

    key: str | None = None
    error: str | None = None
    bytes: int = 0
    take_s: float = 0.0  # on the training thread
    write_s: float = 0.0  # on the background thread
    done: threading.Event = field(default_factory=threading.Event, repr=False)

    def answer(self) -> dict[str, Any]:
        return {"written": [self.key] if self.key and not self.error else [], "error": self.error, "bytes": self.bytes,
                "take_s": round(self.take_s, 4), "write_s": round(self.write_s, 4)}  # fmt: skip


class MemorySnapshots:
    """One hook's on-demand snapshots; at most one is being written at a time."""

    def __init__(self, hook: Any, max_bytes: int = MAX_SNAPSHOT_BYTES):
        self.hook = hook
        self.max_bytes = max_bytes
        self._busy = threading.Lock()
        self._count = 0

    def take(self, request: dict[str, Any] | None = None) -> SnapshotResult:
        """Take the snapshot now (this thread) and write it in the background; with
        `request` (an outside request), answer it once written. Never raises."""
        result = SnapshotResult()
        hook = self.hook
        store = getattr(hook, "store", None)
        if store is None:
            result.error = "the hook has no job store (closed, or STEPSCOPE_DISABLE)"
        elif not self._busy.acquire(blocking=False):
            result.error = "a snapshot of this worker is still being written; ask again later"
        else:
            try:
                started = time.perf_counter()
                raw = cuda_snapshot()
                result.take_s = time.perf_counter() - started
                self._count += 1
                result.key = output_key(MEMORY_SNAPSHOT_DIR, hook.rank, hook.global_step, os.getpid(), f"_ondemand{self._count}{SNAPSHOT_SUFFIX}")
            except Exception as exc:  # SnapshotUnavailable, or the allocator's own failure
                self._busy.release()
                result.error = str(exc) if isinstance(exc, SnapshotUnavailable) else f"{type(exc).__name__}: {exc}"
            else:
                threading.Thread(target=self._write, args=(store, raw, result, request), name="stepscope-memory-snapshot", daemon=True).start()
                return result
        self._finish(store, result, request)
        return result

    def _write(self, store: Any, raw: dict[str, Any], result: SnapshotResult, request: dict[str, Any] | None) -> None:
        try:
            started = time.perf_counter()
            data = gzip.compress(pickle.dumps(raw), compresslevel=3)
            del raw
            result.bytes = len(data)
            if len(data) > self.max_bytes:
                result.error = f"the snapshot is {len(data):,} bytes compressed, over max_bytes ({self.max_bytes:,}); not written"
            else:
                store.write(result.key, [data])
            result.write_s = time.perf_counter() - started
        except Exception as exc:
            result.error = f"{type(exc).__name__}: {exc}"
        finally:
            self._busy.release()
            self._finish(store, result, request)

    def _finish(self, store: Any, result: SnapshotResult, request: dict[str, Any] | None) -> None:
        if result.error:
            logger.warning("stepscope: no memory snapshot of %s: %s", getattr(self.hook, "worker", "?"), result.error)
        if request is not None and store is not None:
            try:
                write_response(store, request, self.hook.worker, rank=self.hook.rank, step=self.hook.global_step, **result.answer())
            except Exception as exc:
                logger.warning("stepscope: could not answer the memory snapshot request: %r", exc)
        result.done.set()


__all__ = ["MAX_SNAPSHOT_BYTES", "NO_CUDA", "MemorySnapshots", "SnapshotResult", "SnapshotUnavailable", "cuda_snapshot"]
