"""stepscope's own cost, measured by the hooks while the job runs: time spent inside the
hooks and in the writer per step, against the step time, and bytes written. The hooks
publish one `stepscope-cost/<worker>.json` at close; the report shows it."""

from __future__ import annotations

import json
import logging
import platform
import time
from dataclasses import dataclass, field
from typing import Any

logger = logging.getLogger("stepscope")

COST_DIR = "stepscope-cost"
MAX_SAMPLES = 2000  # per-step samples kept (every k-th step beyond that)


def cost_key(worker: str) -> str:
    return f"{COST_DIR}/{worker}.json"


@dataclass
class HookCost:
    """What one worker's hook measured. Times in seconds; `samples` are per-step
    (step, step seconds, hook seconds) for the steps kept."""

    worker: str
    steps: int = 0
    step_s: float = 0.0
    hook_s: float = 0.0
    writer_s: float = 0.0
    bytes_written: int = 0
    samples: list[tuple[int, float, float]] = field(default_factory=list)
    versions: dict[str, str] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "worker": self.worker, "steps": self.steps, "step_s": self.step_s, "hook_s": self.hook_s,
            "writer_s": self.writer_s, "bytes_written": self.bytes_written,
            "samples": [list(s) for s in self.samples], "versions": self.versions,
        }

    @classmethod
    def from_json(cls, body: dict[str, Any]) -> HookCost:
        return cls(
            worker=str(body["worker"]), steps=int(body.get("steps", 0)), step_s=float(body.get("step_s", 0.0)),
            hook_s=float(body.get("hook_s", 0.0)), writer_s=float(body.get("writer_s", 0.0)),
            bytes_written=int(body.get("bytes_written", 0)),
            samples=[(int(s), float(a), float(b)) for s, a, b in body.get("samples", ())],
            versions={str(k): str(v) for k, v in (body.get("versions") or {}).items()},
        )


class CostMeter:
    """Accumulates the hook's own time. `enter()`/`leave()` bracket each stretch of hook
    code (they nest); `step_done(step, step_s)` closes a step. perf_counter only: cheap
    enough for the hot path (two calls per hook entry)."""

    def __init__(self, worker: str, versions: dict[str, str] | None = None):
        self.cost = HookCost(worker, versions={"python": platform.python_version(), **(versions or {})})
        self._depth = 0
        self._entered = 0.0
        self._step_hook_s = 0.0
        self._stride = 1

    def enter(self) -> None:
        if self._depth == 0:
            self._entered = time.perf_counter()
        self._depth += 1

    def leave(self) -> None:
        self._depth -= 1
        if self._depth == 0:
            elapsed = time.perf_counter() - self._entered
            self._step_hook_s += elapsed
            self.cost.hook_s += elapsed

    def step_done(self, step: int, step_s: float) -> None:
        cost = self.cost
        cost.steps += 1
        cost.step_s += step_s
        if step % self._stride == 0:
            cost.samples.append((step, step_s, self._step_hook_s))
            if len(cost.samples) >= MAX_SAMPLES:
                cost.samples = cost.samples[::2]
                self._stride *= 2
        self._step_hook_s = 0.0

    def to_bytes(self, writer_s: float, bytes_written: int) -> bytes:
        self.cost.writer_s, self.cost.bytes_written = writer_s, bytes_written
        return json.dumps(self.cost.to_json()).encode()


def read_costs(store: Any) -> dict[str, HookCost]:
    """{worker: HookCost} of every cost file in the job (empty when the hooks wrote none)."""
    out = {}
    for key in store.list(COST_DIR + "/"):
        try:
            cost = HookCost.from_json(json.loads(store.read(key)))
        except (ValueError, KeyError, TypeError, OSError) as exc:
            logger.warning("stepscope: skipping unreadable cost file %s: %s", store.describe(key), exc)
            continue
        out[cost.worker] = cost
    return out
