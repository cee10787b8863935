"""The black box: what a worker writes when training fails (an out-of-memory error, any
exception leaving the training loop, a stop), before the exception propagates: one record
(why, the exception, the step, host and device memory) and attachments (an allocator
snapshot, a memory summary), under `stepscope-blackbox/<worker>/`. Framework-free: the
plugins gather the framework's part. Bounded: the writes run on a daemon thread that the
failing thread waits for at most `budget_s`, and an attachment over `max_bytes` is left out
(named in the record)."""

from __future__ import annotations

import json
import logging
import math
import os
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..exceptions import ConfigError
from ..layout import BLACKBOX_DIR
from ..store import Store

logger = logging.getLogger("stepscope")

RECORD = "record.json"
Attachment = bytes | Callable[[], bytes]


@dataclass(frozen=True)
class BlackBoxConfig:
    budget_s: float = 10.0  # the most the failing thread waits for the black box
    max_bytes: int = 256 << 20  # per attachment

    def __post_init__(self) -> None:
        if isinstance(self.budget_s, bool) or not isinstance(self.budget_s, (int, float)) or not self.budget_s > 0:
            raise ConfigError(f"BlackBoxConfig.budget_s must be a number > 0, got {self.budget_s!r}")
        if isinstance(self.max_bytes, bool) or not isinstance(self.max_bytes, int) or self.max_bytes < 0:
            raise ConfigError(f"BlackBoxConfig.max_bytes must be an integer >= 0, got {self.max_bytes!r}")


def black_box_key(worker: str, name: str, event: str | None = None) -> str:
    """`stepscope-blackbox/<worker>/<name>`: the failure that ended the worker's training;
    with `event` (a NaN, a peer's request: training went on), `<worker>/<event>/<name>`."""
    return f"{BLACKBOX_DIR}/{worker}/{name}" if event is None else f"{BLACKBOX_DIR}/{worker}/{event}/{name}"


def host_memory() -> dict[str, int]:
    """The process's resident and peak resident bytes (Linux /proc; elsewhere the peak from
    getrusage); {} when neither can be read."""
    out: dict[str, int] = {}
    try:
        with open("/proc/self/status", encoding="ascii", errors="replace") as handle:
            for line in handle:
                if line.startswith(("VmRSS:", "VmHWM:")):
                    key = "rss_bytes" if line.startswith("VmRSS") else "peak_rss_bytes"
                    out[key] = int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        try:
            import resource

            out["peak_rss_bytes"] = int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024
        except (ImportError, OSError, ValueError):
            pass
    return out


def write_black_box(store: Store, worker: str, record: Mapping[str, Any], attachments: Mapping[str, Attachment] | None = None,
                    config: BlackBoxConfig | None = None, event: str | None = None) -> list[str]:  # fmt: skip
    """Write the record and its attachments (under `event`'s folder, see black_box_key);
    return the keys written within the budget. Never raises: the failure being recorded is
    the one that must propagate."""
    config = config or BlackBoxConfig()
    written: list[str] = []
    body = dict(record)
    body.setdefault("written_at", time.time())
    body.setdefault("pid", os.getpid())

    def work() -> None:
        left_out = body.setdefault("left_out", {})
        for name, attachment in (attachments or {}).items():
            try:
                data = attachment() if callable(attachment) else attachment
                if len(data) > config.max_bytes:
                    left_out[name] = f"{len(data):,} bytes, over max_bytes ({config.max_bytes:,})"
                    continue
                store.write(black_box_key(worker, name, event), [data])
                written.append(black_box_key(worker, name, event))
            except Exception as exc:  # one attachment failing leaves the others and the record
                left_out[name] = f"{type(exc).__name__}: {exc}"
        body["attachments"] = [key.rsplit("/", 1)[1] for key in written]
        store.write(black_box_key(worker, RECORD, event), [json.dumps(body, default=str, indent=1).encode()])
        written.append(black_box_key(worker, RECORD, event))

    def guarded() -> None:
        try:
            work()
        except Exception:
            logger.warning("stepscope: the black box of %s could not be written", worker, exc_info=True)

    thread = threading.Thread(target=guarded, name="stepscope-blackbox", daemon=True)
    thread.start()
    thread.join(config.budget_s)
    if thread.is_alive():
        logger.warning("stepscope: the black box of %s took over %.1f s; left to finish in the background", worker, config.budget_s)
    return list(written)


class SavedValues:
    """A writer step listener (it runs on the writer thread, never the training thread):
    keeps the last saved step's statistics (min / max / mean of at most `max_tensors`
    small tensors: losses, metrics, reductions) for the black box, and calls
    `on_non_finite` once, for the first saved step holding a NaN or an infinity (each
    float tensor of at most `max_checked` elements is checked by its largest and smallest
    elements, and counted element by element only where one is not finite; larger raw
    tensors are left to the losses and reductions they feed). Where the writer has checked
    a large float tensor already, in the pass that computed its record's CRC
    (`checked_step`), that answer is taken instead, whatever the tensor's size.

    The statistics are computed when `last` is read (a black box being written), from the
    values kept of the last step: a one-element value as its number, a small tensor as a
    copy (the writer's arrays may be the user's own, which they may change). Computed at
    every saved step they were most of this listener's time on the writer thread (three
    reductions per small tensor, holding the GIL between them) for a figure read only
    when training fails."""

    def __init__(self, on_non_finite: Callable[[dict[str, Any]], None] | None = None, max_tensors: int = 64, small: int = 4096,
                 max_checked: int = 1 << 20):  # fmt: skip
        self.on_non_finite = on_non_finite
        self.max_tensors, self.small, self.max_checked = max_tensors, small, max_checked
        # The last step: (step, mode name, mode step, [(name, number or small array)]).
        self._last: tuple[int, str, int, list[tuple[str, Any]]] | None = None
        self.non_finite: dict[str, Any] | None = None

    @property
    def last(self) -> dict[str, Any]:
        """The last saved step's statistics ({} before any): step, mode, mode_step and, per
        kept tensor, its shape, min, max and mean (NaN and infinities as text)."""
        kept = self._last
        if kept is None:
            return {}
        import numpy as np

        step, mode, mode_step, values = kept
        stats: dict[str, Any] = {}
        for name, value in values:
            if isinstance(value, tuple):  # (shape, number): a one-element value
                number = _number(value[1])
                stats[name] = {"shape": value[0], "min": number, "max": number, "mean": number}
                continue
            with np.errstate(invalid="ignore", over="ignore"):
                stats[name] = {"shape": list(value.shape), "min": _number(np.min(value)), "max": _number(np.max(value)),
                               "mean": _number(np.mean(value, dtype=np.float64))}  # fmt: skip
        return {"step": step, "mode": mode, "mode_step": mode_step, "tensors": stats}

    def __call__(self, step: int, mode: Any, mode_step: int, arrays: Mapping[str, Any]) -> None:
        self.checked_step(step, mode, mode_step, arrays, {})

    def checked_step(self, step: int, mode: Any, mode_step: int, arrays: Mapping[str, Any], finite: Mapping[str, bool]) -> None:
        """A saved step whose arrays named in `finite` were checked by the writer already:
        True where every element is a finite number."""
        import numpy as np

        kept: list[tuple[str, Any]] = []
        bad: dict[str, Any] = {}
        checking = self.non_finite is None  # only the first non-finite step is reported
        for name, array in arrays.items():
            known = finite.get(name)
            if known is None:
                if getattr(array, "dtype", None) is None or array.dtype.kind != "f" or array.size == 0 or array.size > self.max_checked:
                    continue
                if array.size == 1:
                    # A loss or a metric (most steps' only values): one float, checked here,
                    # kept as its number.
                    number = float(array.reshape(-1)[0])
                    if checking and not math.isfinite(number):
                        bad[name] = {"nan": int(number != number), "inf": int(math.isinf(number)), "size": 1}
                    if len(kept) < self.max_tensors and array.size <= self.small:
                        kept.append((name, (list(array.shape), number)))
                    continue
                if checking:
                    # Its largest and smallest elements are finite exactly when every element is
                    # (numpy's max and min carry a NaN through): two vectorised passes without a
                    # copy, 0.6x the time of the sum this was, which could also overflow. (A NaN
                    # or inf here is the finding, not a warning for the user's console.)
                    with np.errstate(invalid="ignore"):
                        known = bool(np.isfinite(array.max())) and bool(np.isfinite(array.min()))
            if checking and known is False:
                bad[name] = {"nan": int(np.count_nonzero(np.isnan(array))), "inf": int(np.count_nonzero(np.isinf(array))), "size": int(array.size)}
            if len(kept) < self.max_tensors and array.size <= self.small:
                kept.append((name, np.array(array, copy=True)))
        mode_name = getattr(mode, "name", str(mode))
        self._last = (int(step), mode_name, int(mode_step), kept)
        if bad and self.non_finite is None:
            self.non_finite = {"step": int(step), "mode": mode_name, "mode_step": int(mode_step), "tensors": dict(list(bad.items())[:20])}
            if self.on_non_finite is not None:
                self.on_non_finite(self.non_finite)

    def held_steps(self, steps: Sequence[tuple[int, Any, int, Mapping[str, Any], Any]]) -> None:
        """Several saved steps at once, oldest first (the writer's held batches of scalar
        steps: (step, mode, mode_step, {name: value}, shapes)): what calling this listener
        on each in turn does, with one check of all their values, and step by step only
        when that finds a NaN or an infinity (or a value it cannot add)."""
        import numpy as np

        if not steps:
            return
        check = self.non_finite is None and not _all_finite(steps)
        for step, mode, mode_step, tensors, _shapes in steps if check else steps[-1:]:
            self(step, mode, mode_step, {name: np.asarray(value) for name, value in tensors.items()})


def _all_finite(steps: Sequence[tuple[int, Any, int, Mapping[str, Any], Any]]) -> bool:
    """Whether every value of `steps` is a finite number: their sum is (unless it overflows,
    which reads as not finite: the caller then checks each)."""
    try:
        return math.isfinite(sum([float(value) for step in steps for value in step[3].values()]))
    except Exception:
        return False


def _number(value: Any) -> float | str:
    number = float(value)
    return number if number == number and abs(number) != float("inf") else str(number)  # JSON has no NaN
