"""The merged timeline: one Perfetto-loadable Chrome-trace JSON per job (and step range)
with system metrics as counter tracks, the hooks' steps and phases, annotations, CPU ops,
GPU activity per stream with launch -> GPU flow arrows, and rule firings as instant events.

Perfetto misdraws slices that overlap on one track without nesting, so every track's
slices are laid out on lanes (extra tracks named "... (overlap k)") where each lane is
properly nested; flows are bound to the lane their slice landed on.

Four things are called "timeline": the hook's phase records (capture/phases.py); the step
timeline files, written by capture/step_timeline.py, parsed by profiler/timeline.py and read
for a job by profiler/step_reader.py; the merged Perfetto trace of `stepscope timeline`
(export/perfetto.py); and the app's timeline view (ui/timeline.py). This module is the merged Perfetto trace:
an export of the job to Perfetto, beside the TensorBoard and HDF5 exports, because it draws
what several layers compute (the trace engine's events, the system metrics, the rules'
firings); the trace engine itself imports nothing above the readers."""

from __future__ import annotations

import gzip
import io
import json
import logging
import os
import sys
from collections.abc import Iterable, Iterator
from typing import IO, Any

import numpy as np
import pandas as pd

from ..exceptions import ConfigError
from ..outputs import atomic_output
from ..rules.output import load_reports
from ..store import Store
from ..traces.analysis import StepRange, TraceAnalysis
from ..traces.schema import KIND_CODE, KINDS

logger = logging.getLogger("stepscope.traces")

# Process ids of the merged trace: a rank's host side (steps and phases, threads) is the
# process `rank`, as in the plain step-timeline export; its GPUs follow far above.
_SYSTEM_PID = 9_000_000
_RULES_PID = 9_000_001
_GPU_PID = 1_000_000  # + 100 * rank + device
_STEPS_TRACK = 1  # tid base of the steps track; host threads use 2 + thread id
_HOST_KINDS = ("cpu_op", "annotation", "runtime", "sync", "python")
_GPU_KINDS = ("kernel", "memcpy", "memset", "gpu_annotation", "gpu_sync")


def write_timeline(
    path: str | os.PathLike[str] | Store,
    output: str | os.PathLike[str],
    *,
    steps: StepRange = None,
    analysis: TraceAnalysis | None = None,
    include_cpu_ops: bool = True,
) -> dict[str, int]:
    """Write the merged timeline of the job at `path` to `output` (gzip when it ends in
    .gz, stdout for "-"). Returns counts of what was written (slices, counters, flows,
    instants); ConfigError when the job has neither a step timeline nor traces."""
    analysis = analysis or TraceAnalysis(path)
    window = _time_window(analysis, steps)
    builder = _Builder(_origin(analysis, window))
    builder.add_steps(analysis.step_timeline(), window)
    for rank in analysis.ranks:
        builder.add_rank(rank, analysis.events(rank=rank, steps=steps), include_cpu_ops)
    builder.add_system_metrics(analysis.store, window)
    builder.add_rule_firings(analysis.store, analysis.step_timeline(), window)
    if not builder.lines:
        raise ConfigError(f"nothing to draw: no step timeline and no detailed traces in {analysis.store.url}")
    output = os.fspath(output)
    if output == "-":
        builder.write(sys.stdout)
        return builder.counts
    if not output.endswith(".gz"):
        with atomic_output(output, text=True) as handle:
            builder.write(handle)
        return builder.counts
    with atomic_output(output) as raw:
        # Closing these two writes the gzip trailer; the file itself is atomic_output's.
        with gzip.GzipFile(fileobj=raw, mode="wb") as packed, io.TextIOWrapper(packed, encoding="utf-8") as handle:
            builder.write(handle)
    return builder.counts


def _time_window(analysis: TraceAnalysis, steps: StepRange) -> tuple[int, int] | None:
    if steps is None:
        return None
    first, last = (steps.start, steps.stop - 1) if isinstance(steps, range) else steps
    starts, ends = [], []
    timeline = analysis.step_timeline()
    if not timeline.empty:
        rows = timeline[(timeline["step"] >= first) & (timeline["step"] <= last)]
        starts += rows["start_ns"].tolist()
        ends += rows["end_ns"].tolist()
    for rank in analysis.ranks:
        events = analysis.events(rank=rank, steps=steps)
        if not events.empty:
            starts.append(int(events["ts_ns"].min()))
            ends.append(int((events["ts_ns"] + events["dur_ns"]).max()))
    return (min(starts), max(ends)) if starts else None


def _origin(analysis: TraceAnalysis, window: tuple[int, int] | None) -> int:
    """Whole second before everything: timestamps are written relative to it, because
    Perfetto reads them as doubles of microseconds, which cannot hold epoch nanoseconds."""
    if window is not None:
        first = window[0]
    else:
        starts = [int(s) for s in analysis.traces()["start_ns"].dropna()]
        timeline = analysis.step_timeline()
        if not timeline.empty:
            starts.append(int(timeline["start_ns"].min()))
        first = min(starts) if starts else 0
    return (first // 1_000_000_000 - 60) * 1_000_000_000 if first else 0


def nest_lanes(starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """Lane (0, 1, ...) for each slice such that the slices of one lane nest properly."""
    order = np.lexsort((-ends, starts))
    lanes: list[list[int]] = []  # per lane, the stack of open end times
    result = np.zeros(starts.size, dtype=np.int64)
    for index in order.tolist():
        start, end = int(starts[index]), int(ends[index])
        for lane, stack in enumerate(lanes):
            while stack and stack[-1] <= start:
                stack.pop()
            if not stack or end <= stack[-1]:
                stack.append(end)
                result[index] = lane
                break
        else:
            lanes.append([end])
            result[index] = len(lanes) - 1
    return result


def _us(ns: int) -> str:
    sign = "-" if ns < 0 else ""
    ns = abs(ns)
    return f"{sign}{ns // 1000}.{ns % 1000:03d}"


class _Builder:
    def __init__(self, origin_ns: int) -> None:
        self.origin = origin_ns
        self.lines: list[str] = []
        self.counts = {"slices": 0, "counters": 0, "flows": 0, "instants": 0}
        self.named: set[tuple[int, int | None]] = set()

    def _name(self, pid: int, tid: int | None, name: str, sort: int) -> None:
        if (pid, tid) in self.named:
            return
        self.named.add((pid, tid))
        kind = "process" if tid is None else "thread"
        base: dict[str, Any] = {"ph": "M", "pid": pid, "name": f"{kind}_name", "args": {"name": name}}
        if tid is not None:
            base["tid"] = tid
        self.lines.append(json.dumps(base))
        sort_event = dict(base, name=f"{kind}_sort_index", args={"sort_index": sort})
        self.lines.append(json.dumps(sort_event))

    def _slices(self, pid: int, tid_base: int, label: str, names: Iterable[str], starts: np.ndarray, durations: np.ndarray, cat: str, args: list[dict[str, Any]] | None = None) -> np.ndarray:
        """Emit slices on one logical track; returns the tid each landed on."""
        ends = starts + durations
        lanes = nest_lanes(starts, ends)
        tids = tid_base * 100 + lanes
        for lane in np.unique(lanes).tolist():
            self._name(pid, tid_base * 100 + lane, label if lane == 0 else f"{label} (overlap {lane})", tid_base * 100 + lane)
        for index, (name, start, duration, tid) in enumerate(zip(names, starts.tolist(), durations.tolist(), tids.tolist())):
            extra = f', "args": {json.dumps(args[index], default=str)}' if args else ""
            self.lines.append(f'{{"ph": "X", "cat": "{cat}", "name": {json.dumps(str(name))}, "pid": {pid}, "tid": {tid}, "ts": {_us(start - self.origin)}, "dur": {_us(duration)}{extra}}}')
        self.counts["slices"] += len(lanes)
        return tids

    def add_steps(self, timeline: pd.DataFrame, window: tuple[int, int] | None) -> None:
        if timeline.empty:
            return
        if window is not None:
            timeline = timeline[(timeline["end_ns"] >= window[0]) & (timeline["start_ns"] <= window[1])]
        for rank, rows in timeline.groupby("rank", sort=True):
            pid = max(int(rank), 0)
            self._name(pid, None, f"rank {pid}", pid)
            starts = rows["start_ns"].to_numpy()
            self._slices(pid, _STEPS_TRACK, "steps and phases", rows["name"].astype(str), starts, rows["end_ns"].to_numpy() - starts, "step",
                         [{"step": int(s), "mode": str(m), "phase": str(p)} for s, m, p in zip(rows["step"], rows["mode"], rows["phase"])])

    def add_rank(self, rank: int, events: pd.DataFrame, include_cpu_ops: bool) -> None:
        if events.empty:
            return
        host_pid = rank
        self._name(host_pid, None, f"rank {rank}", host_pid)
        kinds = events["kind"].to_numpy()
        host_codes = [KIND_CODE[k] for k in _HOST_KINDS if include_cpu_ops or k not in ("cpu_op", "python")]
        host = events[np.isin(kinds, host_codes)]
        launch_tid: dict[int, tuple[int, int]] = {}  # correlation -> (tid, ts) of its launch slice
        for thread, rows in host.groupby("tid", sort=True):
            starts = rows["ts_ns"].to_numpy()
            tids = self._slices(host_pid, 2 + int(thread) % 1_000_000, f"thread {thread}", rows["name"].astype(str), starts, rows["dur_ns"].to_numpy(),
                                "host", None)
            correlation = rows["correlation"].to_numpy()
            for corr, tid, ts in zip(correlation.tolist(), tids.tolist(), starts.tolist()):
                if corr >= 0:
                    launch_tid[corr] = (tid, ts)
        gpu = events[np.isin(kinds, [KIND_CODE[k] for k in _GPU_KINDS])]
        for (device, stream), rows in gpu.groupby(["device", "stream"], sort=True):
            pid = _GPU_PID + 100 * rank + max(int(device), 0)
            self._name(pid, None, f"rank {rank}: GPU {device}", pid)
            starts = rows["ts_ns"].to_numpy()
            cats = [KINDS[k] for k in rows["kind"].to_numpy().tolist()]
            tids = self._slices(pid, max(int(stream), 0) + 1, f"stream {stream}", rows["name"].astype(str), starts, rows["dur_ns"].to_numpy(), "gpu",
                                [{"kind": c} for c in cats])
            for corr, tid, ts in zip(rows["correlation"].tolist(), tids.tolist(), starts.tolist()):
                launch = launch_tid.get(corr)
                if corr < 0 or launch is None:
                    continue
                flow_id = rank * 10**12 + corr
                self.lines.append(f'{{"ph": "s", "cat": "launch", "name": "launch", "id": {flow_id}, "pid": {host_pid}, "tid": {launch[0]}, "ts": {_us(launch[1] - self.origin)}}}')
                self.lines.append(f'{{"ph": "f", "bp": "e", "cat": "launch", "name": "launch", "id": {flow_id}, "pid": {pid}, "tid": {tid}, "ts": {_us(ts - self.origin)}}}')
                self.counts["flows"] += 1

    def add_system_metrics(self, store: Store, window: tuple[int, int] | None) -> None:
        try:
            from ..profiler.reader import ProfilerTrial

            metrics = ProfilerTrial(store).system_metrics()
        except Exception as exc:  # traces without system metrics
            logger.debug("no system metrics for the timeline: %s", exc)
            return
        if metrics.empty:
            return
        seconds = metrics["timestamp"]
        ns = (seconds.astype("int64") if str(seconds.dtype).startswith("datetime") else (seconds.astype(float) * 1e9).round().astype("int64")).to_numpy()
        if window is not None:
            keep = (ns >= window[0]) & (ns <= window[1])
            metrics, ns = metrics[keep], ns[keep]
        self._name(_SYSTEM_PID, None, "system metrics", _SYSTEM_PID)
        labels = (metrics["node_id"].astype(str) + " " + metrics["name"].astype(str) + " " + metrics["dimension"].astype(str)).to_numpy()
        for label, timestamp, value in zip(labels.tolist(), ns.tolist(), metrics["value"].astype(float).tolist()):
            self.lines.append(f'{{"ph": "C", "name": {json.dumps(label)}, "pid": {_SYSTEM_PID}, "ts": {_us(timestamp - self.origin)}, "args": {{"value": {value!r}}}}}')
        self.counts["counters"] += len(labels)

    def add_rule_firings(self, store: Store, timeline: pd.DataFrame, window: tuple[int, int] | None) -> None:
        step_start = {}
        if not timeline.empty:
            step_start = timeline.groupby("step")["start_ns"].min().to_dict()
        for rule, step, message, at_ns in _firings(store):
            ts = at_ns if at_ns is not None else step_start.get(step)
            if ts is None or (window is not None and not window[0] <= ts <= window[1]):
                continue
            self._name(_RULES_PID, None, "rule firings", _RULES_PID)
            args = json.dumps({"rule": rule, "step": step, "message": message}, default=str)
            self.lines.append(f'{{"ph": "i", "s": "g", "cat": "rule", "name": {json.dumps(rule)}, "pid": {_RULES_PID}, "tid": 0, "ts": {_us(int(ts) - self.origin)}, "args": {args}}}')
            self.counts["instants"] += 1

    def write(self, handle: IO[str]) -> None:
        metadata = json.dumps({"stepscope_time_origin_ns": self.origin, "note": "ts are microseconds after stepscope_time_origin_ns (epoch ns)"})
        handle.write(f'{{"displayTimeUnit": "ms", "metadata": {metadata}, "traceEvents": [\n')
        handle.write(",\n".join(self.lines))
        handle.write("\n]}\n")


def _firings(store: Store) -> Iterator[tuple[str, int | None, str, int | None]]:
    """(rule, step, message, time ns or None) of every firing in the job's rule reports."""
    for report in load_reports(store) or []:
        if not report.fired:
            continue
        seen = set()
        for evidence in report.evidence:
            at = evidence.data.get("timestamp_ns")
            at = at if type(at) is int else None
            stamp = evidence.data.get("timestamp")
            if at is None and isinstance(stamp, (int, float)) and 0 <= stamp < 1e11:  # seconds; not NaN, not 1e300
                at = int(stamp * 1e9)
            seen.add(evidence.step)
            yield report.rule, evidence.step, evidence.message, at
        for step in report.fired_steps:
            if step not in seen:
                yield report.rule, step, "", None
