"""The black box for PyTorch: around a training loop, an exception that leaves it (an
out-of-memory error above all) first writes what this worker knows, then propagates
unchanged:

    with stepscope_torch.black_box(hook):
        for batch in loader:
            ...

The record (`stepscope-blackbox/<worker>/record.json`): why (`oom`, `stop`, `exception`),
the exception and its traceback's last lines, the hook's step and mode, host memory (RSS,
peak RSS), and per CUDA device allocated / reserved / peak bytes and the allocator's
retry and OOM counts. Attachments: the allocator's `memory_summary()` and, when its history
is being recorded (`ProfilerConfig(memory_history=True)` inside a window, or
`torch.cuda.memory._record_memory_history()` by the user), the allocator snapshot
(`snapshot.pickle.gz`, read with stepscope.traces.snapshot). Then the hook is closed, which
publishes the steps' timeline, system metrics and saved tensors it still holds. All of it
within `budget_s` for the black box plus the hook's own bounded close."""

from __future__ import annotations

import gzip
import logging
import pickle
import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch

from stepscope.capture.blackbox import BlackBoxConfig, host_memory, write_black_box
from stepscope.capture.control import request_stop
from stepscope.capture.hook import StopTrainingRequested

logger = logging.getLogger("stepscope")

_CPU_OOM = "can't allocate memory"  # the CPU allocator's message (a RuntimeError)


def failure_reason(exc: BaseException) -> str:
    """oom (CUDA's OutOfMemoryError, or the CPU allocator's failure), stop (a rule's stop
    request), else exception."""
    if isinstance(exc, torch.cuda.OutOfMemoryError) or (isinstance(exc, RuntimeError) and _CPU_OOM in str(exc)):
        return "oom"
    if isinstance(exc, StopTrainingRequested):
        return "stop"
    return "exception"


def _device_memory() -> list[dict[str, Any]]:
    if not torch.cuda.is_available():
        return []
    devices = []
    for index in range(torch.cuda.device_count()):
        stats = torch.cuda.memory_stats(index)
        devices.append(
            {
                "device": f"cuda:{index}",
                "allocated_bytes": torch.cuda.memory_allocated(index),
                "reserved_bytes": torch.cuda.memory_reserved(index),
                "peak_allocated_bytes": torch.cuda.max_memory_allocated(index),
                "num_alloc_retries": stats.get("num_alloc_retries", 0),
                "num_ooms": stats.get("num_ooms", 0),
            }
        )
    return devices


def _attachments() -> dict[str, Any]:
    if not torch.cuda.is_available():
        return {}
    out: dict[str, Any] = {"memory_summary.txt": torch.cuda.memory_summary().encode()}
    snapshot = torch.cuda.memory._snapshot()  # the allocator's state, on this thread, now
    if any(snapshot.get("device_traces") or ()):  # its history is being recorded
        out["snapshot.pickle.gz"] = lambda: gzip.compress(pickle.dumps(snapshot), compresslevel=3)
    return out


def dump(hook: Any, exc: BaseException, config: BlackBoxConfig | None = None) -> list[str]:
    """Write this worker's black box for `exc`; return the keys written. Never raises."""
    try:
        store = getattr(hook, "store", None)
        if store is None:
            return []
        record = {
            "reason": failure_reason(exc),
            "exception": type(exc).__qualname__,
            "message": str(exc)[:4000],
            "traceback": traceback.format_exception(type(exc), exc, exc.__traceback__)[-12:],
            "worker": hook.worker,
            "rank": hook.rank,
            "step": hook.global_step,  # the open step (where it failed), else the next one
            "mode": getattr(hook.mode, "name", str(hook.mode)),
            "host_memory": host_memory(),
            "devices": _device_memory(),
        }
        return write_black_box(store, hook.worker, record, _attachments(), config)
    except Exception:  # the failure being recorded must propagate, not this one
        logger.warning("stepscope: black box not written", exc_info=True)
        return []


def tell_peers(hook: Any, exc: BaseException) -> None:
    """Ask the job's other workers to stop (the stop request their hooks poll for, as a
    rule's stop): they leave their loops at the end of their current step, each writing its
    own black box (reason stop) when its loop runs inside `black_box`. Never raises."""
    try:
        request_stop(hook.store, "BlackBox", f"{hook.worker} failed at step {hook.global_step}: {failure_reason(exc)} ({type(exc).__qualname__})",
                     worker=hook.worker, failure=failure_reason(exc), step=hook.global_step)  # fmt: skip
    except Exception:
        logger.warning("stepscope: could not ask the other workers to stop", exc_info=True)


@contextmanager
def black_box(hook: Any, *, budget_s: float = 10.0, max_bytes: int = 256 << 20, close: bool = True, stop_peers: bool = True) -> Iterator[Any]:
    """Around a training loop: an exception leaving it writes the black box (`dump`), with
    `stop_peers` asks the other workers to stop (unless it is itself a stop), and with
    `close` closes the hook (publishing what it holds), before it propagates."""
    config = BlackBoxConfig(budget_s=budget_s, max_bytes=max_bytes)
    try:
        yield hook
    except (KeyboardInterrupt, GeneratorExit, SystemExit):
        raise
    except BaseException as exc:
        dump(hook, exc, config)
        if stop_peers and failure_reason(exc) != "stop" and getattr(hook, "store", None) is not None:
            tell_peers(hook, exc)
        if close:
            try:
                hook.close()
            except Exception:
                logger.warning("stepscope: closing the hook after a failure failed", exc_info=True)
        raise
