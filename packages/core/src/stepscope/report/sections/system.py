"""System usage: per node and metric max, p99, p95, p50, min (the OverallSystemUsage rule's
statistics), and CPU / GPU utilisation and GPU memory over time."""

from __future__ import annotations

from ..context import ReportContext
from ..figures import line_chart
from ..model import Figure, Section, Table

_OVER_TIME = (("CPUUtilization", "CPU utilisation %"), ("GPUUtilization", "GPU utilisation %"), ("GPUMemoryUtilization", "GPU memory %"))


def build(ctx: ReportContext) -> Section:
    section = Section("system", "System usage")
    usage = _usage(ctx)
    if not usage:
        section.missing.append("System usage needs system metrics: keep ProfilerConfig(system_monitor=True) (the default) in the hook; for GPUs install stepscope[gpu] (NVML).")
        return section
    rows = []
    for node, dimensions in sorted(usage.items()):
        for dimension, stats in sorted(dimensions.items()):
            rows.append((node, dimension, stats["max"], stats["p99"], stats["p95"], stats["p50"], stats["min"]))
    section.add(Table(("node", "metric", "max", "p99", "p95", "p50", "min"), tuple(rows), caption="Per node and metric (OverallSystemUsage)", key="system-usage"))
    frame = ctx.system_metrics([d for d, _ in _OVER_TIME])
    if not len(frame):
        return section
    start = float(frame["timestamp"].min())
    for dimension, label in _OVER_TIME:
        part = frame[frame["dimension"] == dimension]
        if not len(part):
            if dimension == "GPUUtilization":
                section.missing.append("GPU utilisation and memory: no GPU samples (no NVIDIA GPU, or stepscope[gpu] not installed for NVML).")
            continue
        series = {f"{node} {name}": ((g["timestamp"] - start).tolist(), g["value"].tolist()) for (node, name), g in part.groupby(["node_id", "name"], observed=True)}
        section.add(Figure(line_chart(series, xlabel="seconds since the first sample", ylabel=label), caption=f"{label} over time", key=f"over-time-{dimension}"))
    return section


def _usage(ctx: ReportContext) -> dict:
    finding = ctx.finding("OverallSystemUsage")
    if finding is not None and finding.statistics.get("nodes"):
        return finding.statistics["nodes"]
    try:  # the rule did not run (rules read from rule-output/ without it): run it now
        from ...rules.profiler import OverallSystemUsage

        statistics = OverallSystemUsage().run(ctx.profiler).statistics
        return dict(statistics.get("nodes") or {})
    except Exception:
        return {}
