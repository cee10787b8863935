"""One module per report section; each has `build(ctx) -> Section`, in report order."""

from __future__ import annotations

from . import cost, gpu, health, rules, steps, summary, system

BUILDERS = (summary.build, rules.build, health.build, system.build, steps.build, gpu.build, cost.build)

__all__ = ["BUILDERS"]
