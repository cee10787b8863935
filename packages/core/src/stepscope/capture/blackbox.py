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
import os
import threading
import time
from collections.abc import Callable, Mapping
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


def black_box_key(worker: str, name: str) -> str:
    return f"{BLACKBOX_DIR}/{worker}/{name}"


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
                    config: BlackBoxConfig | None = None) -> list[str]:  # fmt: skip
    """Write the record and its attachments; return the keys written within the budget.
    Never raises: the failure being recorded is the one that must propagate."""
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
                store.write(black_box_key(worker, name), [data])
                written.append(black_box_key(worker, name))
            except Exception as exc:  # one attachment failing leaves the others and the record
                left_out[name] = f"{type(exc).__name__}: {exc}"
        body["attachments"] = [key.rsplit("/", 1)[1] for key in written]
        store.write(black_box_key(worker, RECORD), [json.dumps(body, default=str, indent=1).encode()])
        written.append(black_box_key(worker, RECORD))

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
