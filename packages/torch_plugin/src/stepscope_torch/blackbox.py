"""The black box for PyTorch: when training fails (an out-of-memory error above all, any
exception leaving the training loop, a rule's stop) this worker first writes what it
knows, then the exception propagates unchanged. A hook installs it by itself (`attach`,
from `Hook.__init__`): `sys.excepthook` and `threading.excepthook` (chained to the ones
already there) catch an exception that leaves the loop and ends the thread, the stop
coordinator calls it just before it raises `StopTrainingRequested`, and the writer's step
listener (`SavedValues`) reports the first NaN or infinity among the saved tensors. Around a
loop whose exception never reaches the excepthook (a launcher that catches it in-process,
such as torch.multiprocessing.spawn), wrap the loop:

    with stepscope_torch.black_box(hook):
        for batch in loader:
            ...

The record (`stepscope-blackbox/<worker>/record.json`; for a NaN or a peer's request, after
which training goes on, `<worker>/nan/` and `<worker>/request-<id>/`): why (`oom`, `stop`,
`exception`, `nan`, `request`), the exception and its traceback's last lines, the hook's
step and mode, host memory (RSS, peak RSS), per CUDA device allocated / reserved / peak
bytes and the allocator's retry and OOM counts, and the last saved step's tensor
statistics. Attachments: the allocator's `memory_summary()` and, when its history is being
recorded (`ProfilerConfig(memory_history=True)` inside a window, or
`torch.cuda.memory._record_memory_history()` by the user), the allocator snapshot
(`snapshot.pickle.gz`, read with stepscope.traces.snapshot). Each exception is recorded
once, whichever of these sees it first. All of it within `budget_s`; $STEPSCOPE_BLACK_BOX=0
installs none of it (the `black_box` context still works)."""

from __future__ import annotations

import gzip
import logging
import os
import pickle
import sys
import threading
import traceback
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import TracebackType
from typing import Any

import torch

from stepscope.capture.blackbox import BlackBoxConfig, SavedValues, host_memory, write_black_box
from stepscope.capture.control import BLACK_BOX, MEMORY_SNAPSHOT, request_stop, send_request, write_response
from stepscope.capture.hook import StopTrainingRequested

from .memory import MemorySnapshots

logger = logging.getLogger("stepscope")

_CPU_OOM = "can't allocate memory"  # the CPU allocator's message (a RuntimeError)
BLACK_BOX_ENV = "STEPSCOPE_BLACK_BOX"  # "0": a hook installs no black box by itself
_RECORDED = "_stepscope_black_box"  # set on an exception once its black box is written


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


def dump(hook: Any, exc: BaseException | None, config: BlackBoxConfig | None = None, *, reason: str | None = None,
         event: str | None = None, details: dict[str, Any] | None = None) -> list[str]:  # fmt: skip
    """Write this worker's black box for `exc` (None: no exception, `reason` says why);
    return the keys written. Never raises."""
    try:
        store = getattr(hook, "store", None)
        if store is None:
            return []
        record: dict[str, Any] = {"reason": reason or (failure_reason(exc) if exc is not None else "request")}
        if exc is not None:
            record.update({
                "exception": type(exc).__qualname__,
                "message": str(exc)[:4000],
                "traceback": traceback.format_exception(type(exc), exc, exc.__traceback__)[-12:],
            })  # fmt: skip
        record.update({
            "worker": hook.worker,
            "rank": hook.rank,
            "step": hook.global_step,  # the open step (where it failed), else the next one
            "mode": getattr(hook.mode, "name", str(hook.mode)),
            "host_memory": host_memory(),
            "devices": _device_memory(),
            **(details or {}),
        })  # fmt: skip
        box = getattr(hook, "_black_box", None)
        last_saved = box.saved.last if box is not None else None  # (computed when read: once)
        if last_saved:
            record["last_saved"] = last_saved
        return write_black_box(store, hook.worker, record, _attachments(), config, event=event)
    except Exception:  # the failure being recorded must propagate, not this one
        logger.warning("stepscope: black box not written", exc_info=True)
        return []


def _mark(exc: BaseException) -> bool:
    """Mark `exc` as recorded; False when it already was (another path wrote its box)."""
    if getattr(exc, _RECORDED, False):
        return False
    try:
        setattr(exc, _RECORDED, True)
    except (AttributeError, TypeError):  # an exception class without a __dict__: recorded each time
        pass
    return True


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
        if _mark(exc):
            dump(hook, exc, config)
            if stop_peers and failure_reason(exc) != "stop" and getattr(hook, "store", None) is not None:
                tell_peers(hook, exc)
        if close:
            try:
                hook.close()
            except Exception:
                logger.warning("stepscope: closing the hook after a failure failed", exc_info=True)
        raise


# --- installed by the hook ---------------------------------------------------------------


class BlackBox:
    """One hook's black box, installed by `attach`: the excepthooks, the stop's, the NaN
    listener's and the on-demand requests' (memory snapshot, a peer's black box) part."""

    def __init__(self, hook: Any, config: BlackBoxConfig | None = None):
        self._hook = weakref.ref(hook)  # the excepthook registry must not keep a hook alive
        self.config = config or BlackBoxConfig()
        self.saved = SavedValues(self._on_non_finite)
        self.snapshots = MemorySnapshots(hook)

    @property
    def hook(self) -> Any:
        return self._hook()

    def record(self, exc: BaseException, *, stop_peers: bool = True) -> list[str]:
        """The black box of `exc` (once per exception), and the other workers told to stop
        unless it is a stop. Never raises."""
        hook = self.hook
        if hook is None or getattr(hook, "store", None) is None or not _mark(exc):
            return []
        keys = dump(hook, exc, self.config)
        if stop_peers and failure_reason(exc) != "stop":
            tell_peers(hook, exc)
        return keys

    def on_stop(self, exc: BaseException) -> None:
        """The stop coordinator is about to raise `exc` (a rule's stop): every rank gets
        here at the same TRAIN step (the stop agreement), each writing its own box."""
        self.record(exc, stop_peers=False)

    def on_control(self, request: dict[str, Any]) -> None:
        """An on-demand request at a TRAIN step end (training thread)."""
        hook = self.hook
        if hook is None:
            return
        if request.get("action") == MEMORY_SNAPSHOT:
            self.snapshots.take(request)
        elif request.get("action") == BLACK_BOX:
            if request.get("worker") == hook.worker:
                return  # its own call to the others: its box is written already
            event = f"request-{request.get('id')}"
            keys = dump(hook, None, self.config, reason="request", event=event, details={"request": request})
            write_response(hook.store, request, hook.worker, rank=hook.rank, step=hook.global_step, written=keys, error=None if keys else "not written")
        else:
            write_response(hook.store, request, hook.worker, rank=hook.rank, step=hook.global_step, written=[], error="unknown action")

    def _on_non_finite(self, found: dict[str, Any]) -> None:
        # The writer's thread: the box is written on a thread of its own (the writer goes on
        # at once), and the other workers are asked for theirs.
        hook = self.hook
        if hook is None:
            return

        def write() -> None:
            dump(hook, None, self.config, reason="nan", event="nan", details={"non_finite": found})
            if hook.world_size > 1:
                names = ", ".join(list(found["tensors"])[:3])
                send_request(hook.store, BLACK_BOX, f"{hook.worker} saved non-finite values ({names}) at step {found['step']}",
                             worker=hook.worker, step=found["step"])  # fmt: skip

        logger.warning("stepscope: NaN/inf saved at step %s (%s); writing the black box", found["step"], ", ".join(found["tensors"]))
        threading.Thread(target=write, name="stepscope-blackbox-nan", daemon=True).start()

    def remove(self) -> None:
        """The hook closed: its black box leaves the excepthooks."""
        _Excepthooks.remove(self)


class _Excepthooks:
    """`sys.excepthook` and `threading.excepthook`, chained: the black boxes of the live
    hooks are written, then the previous hook runs (it prints the traceback, as before).
    The one process-wide state here, installed with the first hook and put back when the
    last one closes (if nobody replaced ours meanwhile)."""

    boxes: weakref.WeakSet[BlackBox] = weakref.WeakSet()
    previous_sys: Callable[..., Any] | None = None
    previous_threading: Callable[..., Any] | None = None
    lock = threading.Lock()

    @classmethod
    def add(cls, box: BlackBox) -> None:
        with cls.lock:
            # (Also when hooks are live: the program may have put its own handler in since.)
            if sys.excepthook is not cls.sys_hook:
                cls.previous_sys, sys.excepthook = sys.excepthook, cls.sys_hook
            if threading.excepthook is not cls.threading_hook:
                cls.previous_threading, threading.excepthook = threading.excepthook, cls.threading_hook
            cls.boxes.add(box)

    @classmethod
    def remove(cls, box: BlackBox) -> None:
        with cls.lock:
            cls.boxes.discard(box)
            if cls.boxes:
                return
            if sys.excepthook is cls.sys_hook and cls.previous_sys is not None:
                sys.excepthook, cls.previous_sys = cls.previous_sys, None
            if threading.excepthook is cls.threading_hook and cls.previous_threading is not None:
                threading.excepthook, cls.previous_threading = cls.previous_threading, None

    @classmethod
    def record_all(cls, exc: BaseException | None, thread: threading.Thread | None = None) -> None:
        """The black boxes of `exc`; with `thread` (an exception ending that thread, not the
        program), only of the hooks whose TRAIN steps that thread ends: a helper thread's
        error is not training's failure and must not stop the job."""
        if exc is None or not isinstance(exc, Exception):  # not KeyboardInterrupt / SystemExit
            return
        for box in list(cls.boxes):
            hook = box.hook
            # (The Thread object, not its ident: idents of ended threads are reused.)
            if thread is not None and (hook is None or getattr(hook._stop, "training_thread", None) is not thread):
                continue
            try:
                box.record(exc)
            except Exception:  # the traceback must still be printed
                logger.warning("stepscope: black box not written", exc_info=True)

    # A handler installed after ours that calls ours in turn, then ours installed again
    # on top of it (a second hook) would call each other forever: a call of ours inside
    # ours goes straight to Python's own handler.
    _inside = threading.local()

    @staticmethod
    def sys_hook(kind: type[BaseException], exc: BaseException, tb: TracebackType | None) -> None:
        inside = _Excepthooks._inside
        if getattr(inside, "active", False):
            sys.__excepthook__(kind, exc, tb)
            return
        inside.active = True
        try:
            try:
                _Excepthooks.record_all(exc)
            finally:  # the traceback is printed whatever the black box did
                (_Excepthooks.previous_sys or sys.__excepthook__)(kind, exc, tb)
        finally:
            inside.active = False

    @staticmethod
    def threading_hook(args: Any) -> None:
        inside = _Excepthooks._inside
        if getattr(inside, "active", False):
            threading.__excepthook__(args)
            return
        inside.active = True
        try:
            try:
                _Excepthooks.record_all(args.exc_value, args.thread or threading.current_thread())
            finally:
                (_Excepthooks.previous_threading or threading.__excepthook__)(args)
        finally:
            inside.active = False


def attach(hook: Any) -> BlackBox | None:
    """Install `hook`'s black box (unless $STEPSCOPE_BLACK_BOX=0): the excepthooks, the
    stop coordinator's callback, the writer's NaN listener and on-demand requests; the
    returned object's `remove()` takes it away when the hook closes."""
    box = BlackBox(hook)
    hook._stop.on_control = box.on_control  # on-demand requests work whatever the setting
    if os.environ.get(BLACK_BOX_ENV, "1").strip() in ("0", "false", "no", "off"):
        return box
    hook._stop.before_raise = box.on_stop
    writer = getattr(hook, "writer", None)
    if writer is not None:
        writer.step_listeners.append(box.saved)
    _Excepthooks.add(box)
    return box
