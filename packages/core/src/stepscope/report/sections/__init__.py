"""One module per report section; each has `build(ctx) -> Section`, in report order."""

from __future__ import annotations

from . import cost, distributed, gpu, health, memory, rules, steps, summary, system

BUILDERS = (summary.build, rules.build, health.build, system.build, steps.build, gpu.build, distributed.build, memory.build, cost.build)

__all__ = ["BUILDERS"]
