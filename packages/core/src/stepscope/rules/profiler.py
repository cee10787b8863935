"""Profiler rules: whole-job rules (stepscope.rules.JobRule) over a job's system metrics and
step timeline, with the parameters and defaults of smdebug-rulesconfig. Each puts its
measurements in `report.statistics` and reports a violation when its condition holds;
GPU rules on a job without GPU samples report "no data".

`PROFILER_RULES` names them (the catalog, rules.registry, registers them), `run_profiler_rules`
runs them over a job; rules.config builds one from a smdebug_rulesconfig object or a dict."""

from __future__ import annotations

import itertools
import logging
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np
import pandas as pd

from ..health import OutlierCriterion, step_groups
from ..profiler.reader import ProfilerTrial
from ..profiler.timeline import STEP_PHASES
from ..store import Store
from .base import JobRule
from .params import RuleParams, ranged
from .report import RuleReport

logger = logging.getLogger("stepscope.profiler")

_SCAN_INTERVAL_US = 60 * 1000 * 1000  # accepted for SageMaker configs; reading is not polled here
_MAX_LISTED = 20  # outliers, pairs, ... listed in a report's statistics


@dataclass
class _Outcome:
    """What a rule measured: whether its condition holds (`message` says how, with the
    measured `value` against `threshold`), how many samples it judged, the statistics, and
    (`reason`) why there was nothing to judge."""

    fired: bool
    violations: int
    datapoints: int
    details: dict[str, Any]
    message: str = ""
    value: float | None = None
    threshold: float | None = None
    reason: str | None = None
    items: list[dict[str, Any]] = field(default_factory=list)  # one violation each, when listed
    # Too few samples to judge: the rule needs `needed` `unit` and had `available` (status
    # "not enough data (needs N, has M)", never "ok").
    needed: int | None = None
    available: int = 0
    unit: str = ""


class ProfilerRule(JobRule):
    """Base of the profiler rules: `_measure(profiler)` returns an _Outcome, which becomes
    the report (statistics, datapoints, violations) here."""

    def evaluate(self) -> None:
        outcome = self._measure(self.profiler)
        report = self.report
        report.datapoints = int(outcome.datapoints)
        report.statistics = dict(outcome.details)
        report.statistics.setdefault("samples_over_threshold", int(outcome.violations))
        if outcome.needed is not None:
            self.need(outcome.needed, outcome.available, outcome.unit)
            return
        if outcome.reason is not None:
            self.no_data(outcome.reason)
            return
        if not outcome.fired:
            return
        if outcome.items:
            for item in outcome.items:
                item = dict(item)  # "step": a global step, when the item names one
                self.violation(item.pop("step", None), item.pop("message"), **item)
        else:
            self.violation(None, outcome.message, value=outcome.value, threshold=outcome.threshold, count=int(outcome.violations))

    def _measure(self, trial: ProfilerTrial) -> _Outcome:
        raise NotImplementedError


# --- the rules --------------------------------------------------------------------------


@dataclass(frozen=True)
class CPUBottleneckParams(RuleParams):
    threshold: float = ranged(50, "percent")
    gpu_threshold: float = ranged(10, "percent")
    cpu_threshold: float = ranged(90, "percent")
    patience: int = ranged(1000, "count")
    scan_interval_us: int = ranged(_SCAN_INTERVAL_US, "positive_int")


@dataclass(frozen=True)
class IOBottleneckParams(RuleParams):
    threshold: float = ranged(50, "percent")
    gpu_threshold: float = ranged(10, "percent")
    io_threshold: float = ranged(50, "percent")
    patience: int = ranged(1000, "count")
    scan_interval_us: int = ranged(_SCAN_INTERVAL_US, "positive_int")


class _Bottleneck(ProfilerRule):
    """GPUs idle while the node's `dimension` is above the `busy` parameter, for more than
    `threshold` % of the samples."""

    params: CPUBottleneckParams | IOBottleneckParams
    dimension: ClassVar[str]
    busy: ClassVar[str]  # the parameter holding the threshold of `dimension`

    def _measure(self, trial: ProfilerTrial) -> _Outcome:
        p = self.params
        return _bottleneck(trial, self.dimension, getattr(p, self.busy), p.gpu_threshold, p.threshold, p.patience)


class CPUBottleneck(_Bottleneck):
    """GPUs idle while the CPU is saturated, for more than `threshold` % of the samples."""

    params: CPUBottleneckParams
    dimension, busy = "CPUUtilization", "cpu_threshold"


class IOBottleneck(_Bottleneck):
    """GPUs idle while the CPUs wait on IO, for more than `threshold` % of the samples."""

    params: IOBottleneckParams
    dimension, busy = "I/OWaitPercentage", "io_threshold"


@dataclass(frozen=True)
class LowGPUUtilizationParams(RuleParams):
    threshold_p95: float = ranged(70, "percent")
    threshold_p5: float = ranged(10, "percent")
    window: int = ranged(500, "positive_int")
    patience: int = ranged(1000, "count")
    scan_interval_us: int = ranged(_SCAN_INTERVAL_US, "positive_int")


class LowGPUUtilization(ProfilerRule):
    """Per GPU and window of `window` samples: p95 below `threshold_p95` (under-used), or p95
    above it with p5 below `threshold_p5` (fluctuating)."""

    params: LowGPUUtilizationParams

    def _measure(self, trial: ProfilerTrial) -> _Outcome:
        raw = _metric(trial, "GPUUtilization")
        gpu = _after_patience(raw, ["node_id", "name"], self.params.patience)
        if gpu.empty:
            return _short_of_patience(raw, ["node_id", "name"], self.params.patience, "GPU utilization samples")
        details: dict[str, Any] = {"gpus": {}}
        violations = datapoints = 0
        for (node, name), series in gpu.groupby(["node_id", "name"], sort=True):
            values = series["value"].to_numpy()
            datapoints += len(values)
            low = fluctuating = 0
            for chunk in _windows(values, self.params.window):
                p95, p5 = np.percentile(chunk, 95), np.percentile(chunk, 5)
                if p95 < self.params.threshold_p95:
                    low += 1
                elif p5 < self.params.threshold_p5:
                    fluctuating += 1
            violations += low + fluctuating
            details["gpus"][f"{node}/{name}"] = {
                "p95": float(np.percentile(values, 95)),
                "p5": float(np.percentile(values, 5)),
                "underutilized_windows": low,
                "fluctuating_windows": fluctuating,
            }
        worst = min(details["gpus"].items(), key=lambda kv: kv[1]["p95"])
        message = (
            f"{violations} window(s) of {self.params.window} samples with GPU utilization under-used (p95 < {self.params.threshold_p95:g}%) "
            f"or fluctuating (p5 < {self.params.threshold_p5:g}%); lowest p95 {worst[1]['p95']:.0f}% on {worst[0]}"
        )
        return _Outcome(violations > 0, violations, datapoints, details, message, worst[1]["p95"], self.params.threshold_p95)


@dataclass(frozen=True)
class GPUMemoryIncreaseParams(RuleParams):
    increase: float = ranged(5, "positive")
    patience: int = ranged(1000, "count")
    window: int = ranged(10, "positive_int")
    scan_interval_us: int = ranged(_SCAN_INTERVAL_US, "positive_int")


class GPUMemoryIncrease(ProfilerRule):
    """Per GPU, the mean memory footprint of a window of `window` samples exceeds the
    previous window's by more than `increase` percentage points."""

    params: GPUMemoryIncreaseParams

    def _measure(self, trial: ProfilerTrial) -> _Outcome:
        raw = _metric(trial, "GPUMemoryUtilization")
        memory = _after_patience(raw, ["node_id", "name"], self.params.patience)
        if memory.empty:
            return _short_of_patience(raw, ["node_id", "name"], self.params.patience, "GPU memory samples")
        details: dict[str, Any] = {"gpus": {}, "increases": []}
        violations = datapoints = 0
        for (node, name), series in memory.groupby(["node_id", "name"], sort=True):
            values = series["value"].to_numpy()
            timestamps = series["timestamp"].to_numpy()
            datapoints += len(values)
            starts = _window_starts(len(values), self.params.window)
            means = [float(values[start : start + self.params.window].mean()) for start in starts]
            worst = 0.0
            for later, (before, after) in zip(starts[1:], itertools.pairwise(means)):
                worst = max(worst, after - before)
                if after - before > self.params.increase:
                    violations += 1
                    if len(details["increases"]) < _MAX_LISTED:
                        details["increases"].append({"gpu": f"{node}/{name}", "from": before, "to": after, "window_start": float(timestamps[later])})
            details["gpus"][f"{node}/{name}"] = {"largest_increase": worst, "windows": len(means)}
        largest = max((g["largest_increase"] for g in details["gpus"].values()), default=0.0)
        message = f"GPU memory rose by more than {self.params.increase:g} points between windows {violations} time(s); largest rise {largest:.1f} points"
        return _Outcome(violations > 0, violations, datapoints, details, message, largest, self.params.increase)


@dataclass(frozen=True)
class BatchSizeParams(RuleParams):
    cpu_threshold_p95: float = ranged(70, "percent")
    gpu_threshold_p95: float = ranged(70, "percent")
    gpu_memory_threshold_p95: float = ranged(70, "percent")
    patience: int = ranged(1000, "count")
    window: int = ranged(500, "positive_int")
    scan_interval_us: int = ranged(_SCAN_INTERVAL_US, "positive_int")


class BatchSize(ProfilerRule):
    """Per GPU and window: CPU, GPU and GPU-memory p95 all below their thresholds, so the
    machine idles and a larger batch (or a smaller instance) would do."""

    params: BatchSizeParams

    def _measure(self, trial: ProfilerTrial) -> _Outcome:
        util = _metric(trial, "GPUUtilization")
        memory = _metric(trial, "GPUMemoryUtilization")
        cpu = _node_total(_metric(trial, "CPUUtilization"))
        if util.empty or memory.empty or cpu.empty:
            return _no_data("needs CPU, GPU and GPU memory utilization")
        tolerance = _tolerance(util)
        joined = _join_nearest(util, memory.rename(columns={"value": "memory"}), ["node_id", "name"], tolerance)
        joined = _join_nearest(joined, cpu.rename(columns={"value": "cpu"}), ["node_id"], tolerance)
        aligned = joined.dropna()
        joined = _after_patience(aligned, ["node_id", "name"], self.params.patience)
        if joined.empty:
            return _short_of_patience(aligned, ["node_id", "name"], self.params.patience, "aligned CPU/GPU samples")
        details: dict[str, Any] = {"gpus": {}}
        violations = 0
        for (node, name), series in joined.groupby(["node_id", "name"], sort=True):
            arrays = [series[c].to_numpy() for c in ("cpu", "value", "memory")]
            idle = 0
            for start in _window_starts(len(series), self.params.window):
                cpu_p95, gpu_p95, mem_p95 = (np.percentile(a[start : start + self.params.window], 95) for a in arrays)
                if cpu_p95 < self.params.cpu_threshold_p95 and gpu_p95 < self.params.gpu_threshold_p95 and mem_p95 < self.params.gpu_memory_threshold_p95:
                    idle += 1
            violations += idle
            details["gpus"][f"{node}/{name}"] = {
                "cpu_p95": float(np.percentile(arrays[0], 95)),
                "gpu_p95": float(np.percentile(arrays[1], 95)),
                "gpu_memory_p95": float(np.percentile(arrays[2], 95)),
                "underutilized_windows": idle,
            }
        message = (
            f"{violations} window(s) where CPU, GPU and GPU memory p95 were all below "
            f"{self.params.cpu_threshold_p95:g}/{self.params.gpu_threshold_p95:g}/{self.params.gpu_memory_threshold_p95:g}%: the machine idles"
        )
        return _Outcome(violations > 0, violations, len(joined), details, message)


@dataclass(frozen=True)
class LoadBalancingParams(RuleParams):
    threshold: float = ranged(0.5, "fraction")
    patience: int = ranged(1000, "count")
    scan_interval_us: int = ranged(_SCAN_INTERVAL_US, "positive_int")


class LoadBalancing(ProfilerRule):
    """Two GPUs of the job whose utilization distributions differ by more than `threshold`,
    measured as the earth mover's distance between them over the 0-100 % range (0: same
    distribution, 1: one always idle while the other is always busy)."""

    params: LoadBalancingParams

    def _measure(self, trial: ProfilerTrial) -> _Outcome:
        gpu = _after_patience(_metric(trial, "GPUUtilization"), ["node_id", "name"], self.params.patience)
        series = {f"{node}/{name}": s["value"].to_numpy() for (node, name), s in gpu.groupby(["node_id", "name"], sort=True)}
        if len(series) < 2:
            return _Outcome(False, 0, len(gpu), {}, reason="fewer than two GPUs with data after patience")
        levels = np.linspace(0, 100, 101)
        quantiles = {gpu_id: np.percentile(values, levels) for gpu_id, values in series.items()}
        pairs: list[dict[str, Any]] = []
        for a, b in itertools.combinations(sorted(quantiles), 2):
            distance = float(np.mean(np.abs(quantiles[a] - quantiles[b])) / 100.0)
            pairs.append({"gpus": [a, b], "distance": distance})
        pairs.sort(key=lambda p: -p["distance"])
        violations = sum(p["distance"] > self.params.threshold for p in pairs)
        details = {
            "median_utilization": {gpu_id: float(np.median(v)) for gpu_id, v in series.items()},
            "worst_pairs": pairs[:_MAX_LISTED],
        }
        worst = pairs[0]
        message = f"GPUs {worst['gpus'][0]} and {worst['gpus'][1]}: utilization distributions differ by {worst['distance']:.2f} > {self.params.threshold:g}"
        return _Outcome(violations > 0, violations, len(gpu), details, message, worst["distance"], self.params.threshold)


@dataclass(frozen=True)
class StepOutlierParams(RuleParams):
    stddev: float = ranged(3, "positive")
    mode: str | None = ranged(None, "mode")
    n_outliers: int = ranged(10, "count")
    min_ratio: float = ranged(0, "non_negative")
    min_excess_ms: float = ranged(0, "non_negative")
    scan_interval_us: int = ranged(_SCAN_INTERVAL_US, "positive_int")


class StepOutlier(ProfilerRule):
    """Steps longer than mean + `stddev` standard deviations of their rank and mode; fires
    when there are more than `n_outliers`. The first step of each rank and mode (warm-up,
    compilation) is left out. With `min_ratio` / `min_excess_ms` (the default set: 3 and
    50), an outlier must also take `min_ratio` times the median step and `min_excess_ms`
    more than it: scheduler jitter on millisecond steps is not worth a finding."""

    params: StepOutlierParams
    preset: ClassVar[Mapping[str, Any]] = {"min_ratio": 3.0, "min_excess_ms": 50.0}

    def criterion(self) -> OutlierCriterion:
        """Which steps are outliers (stepscope.health.OutlierCriterion): the app marks the same."""
        return OutlierCriterion(self.params.stddev, self.params.min_ratio, self.params.min_excess_ms)

    def modes(self) -> list[str]:
        """The modes whose steps this rule judges."""
        return [self.params.mode] if self.params.mode else ["TRAIN", "EVAL", "GLOBAL"]

    def _measure(self, trial: ProfilerTrial) -> _Outcome:
        every = step_groups(trial.step_timeline(), self.criterion(), self.modes())
        if not every:
            return _no_data("no step events in the timeline")
        details: dict[str, Any] = {"groups": {}, "outliers": []}
        violations = datapoints = 0
        for group in (g for g in every if g.limit_ms is not None):
            datapoints += group.judged
            violations += len(group.outliers)
            details["groups"][group.key] = {"steps": group.judged, "mean_ms": group.mean_ms, "std_ms": group.std_ms, "limit_ms": group.limit_ms, "outliers": len(group.outliers)}
            for step, duration in zip(group.outliers, group.outlier_ms):
                if len(details["outliers"]) < _MAX_LISTED:
                    details["outliers"].append({"node_id": group.node, "rank": group.rank, "mode": group.mode, "step": step, "duration_ms": duration})
        items = [
            {
                "message": f"{o['node_id']}/rank{o['rank']}: step took {o['duration_ms']:.1f} ms, over mean + {self.params.stddev:g} std",
                "step": o["step"], "mode": o["mode"], "tensor": f"{o['node_id']}/rank{o['rank']}", "value": o["duration_ms"],
                "threshold": details["groups"][f"{o['node_id']}/rank{o['rank']}/{o['mode']}"]["limit_ms"],
            }
            for o in details["outliers"]
        ]
        return _Outcome(violations > self.params.n_outliers, violations, datapoints, details, items=items)


@dataclass(frozen=True)
class MaxInitializationTimeParams(RuleParams):
    threshold: float = ranged(20, "positive")
    scan_interval_us: int = ranged(_SCAN_INTERVAL_US, "positive_int")


class MaxInitializationTime(ProfilerRule):
    """The first step started more than `threshold` minutes after the job did (or has not
    started that long after)."""

    params: MaxInitializationTimeParams

    def _measure(self, trial: ProfilerTrial) -> _Outcome:
        job_start = trial.job_start()
        if job_start is None:
            return _no_data("no profiler data")
        steps = trial.step_timeline()
        steps = steps[steps["phase"].isin(STEP_PHASES)]
        limit_s = self.params.threshold * 60.0
        if len(steps):
            first_step = float(steps["start_ns"].min()) / 1e9
            waited = first_step - job_start
            details: dict[str, Any] = {"job_start": job_start, "first_step_start": first_step, "initialization_minutes": waited / 60.0}
            message = f"the first step started {waited / 60.0:.1f} min after the job > {self.params.threshold:g} min"
            return _Outcome(waited > limit_s, int(waited > limit_s), 1, details, message, waited / 60.0, self.params.threshold)
        span = trial.time_range()
        last_seen = span[1] if span else job_start
        waited = last_seen - job_start
        details = {"job_start": job_start, "first_step_start": None, "minutes_without_step": waited / 60.0}
        message = f"no step started in the {waited / 60.0:.1f} min since the job did > {self.params.threshold:g} min"
        return _Outcome(waited > limit_s, int(waited > limit_s), 1, details, message, waited / 60.0, self.params.threshold)


# Stalls (steps waiting for data at least as long as the median step) that must recur
# before their share of the TRAIN time speaks for the job: a few are not a loader's pace.
MIN_DATA_STALLS = 5


@dataclass(frozen=True)
class DataloaderParams(RuleParams):
    min_threshold: float = ranged(70, "positive")
    max_threshold: float = ranged(200, "positive")
    min_data_wait_percent: float = ranged(0, "percent")
    min_data_wait_ms: float = ranged(0, "non_negative")
    scan_interval_us: int = ranged(_SCAN_INTERVAL_US, "positive_int")


class Dataloader(ProfilerRule):
    """Data loading. With `min_data_wait_percent` 0 (SageMaker's rule): fires when the
    data-loading processes (the training process's children) are fewer than
    `min_threshold` % or more than `max_threshold` % of the CPU cores, on any node. With
    `min_data_wait_percent` > 0 (stepscope's default set uses 25): fires only when waiting
    for data takes at least that share of the step time (the step timeline's data phases),
    (median wait per TRAIN step / median step time), whatever the worker count, and the
    median wait per step is at least `min_data_wait_ms`
    (the default set uses 5); the worker count is then evidence, not the verdict. It also
    fires when the typical step waits little but at least MIN_DATA_STALLS (5) recurring
    stalls take that share of the whole TRAIN time (`_data_stalls`)."""

    # A wait of a few ms per step is below what moving loading into worker processes can
    # win back (their inter-process transfer costs about that). The "data" phase also holds
    # the framework's own work between batches (a Lightning loop on a busy 2-core machine:
    # 10-15 % of the step with an in-memory dataset), so a quarter of the step is where a
    # data pipeline, not the loop, is what holds training back.
    preset: ClassVar[Mapping[str, Any]] = {"min_data_wait_percent": 25, "min_data_wait_ms": 5}

    params: DataloaderParams

    def _measure(self, trial: ProfilerTrial) -> _Outcome:
        children = _metric(trial, "ChildProcessCount")
        gate = self.params.min_data_wait_percent
        if children.empty and gate <= 0:
            return _no_data("no ChildProcessCount samples (legacy job, or monitor not run)")
        # With the data-wait gate the step timeline gives the verdict and the worker count
        # is evidence: a job without system metrics (ProfilerConfig(system_monitor=False),
        # a rank without a monitor) is judged on its timeline alone.
        cpu = _metric(trial, "CPUUtilization")
        cores_by_node = cpu[cpu["name"].str.fullmatch(r"cpu\d+")].groupby("node_id")["name"].nunique()
        details: dict[str, Any] = {"nodes": {}}
        violations = 0
        for node, series in children.groupby("node_id", sort=True):
            cores = int(cores_by_node.get(node, 0)) or os.cpu_count() or 1
            workers = int(series["value"].max())
            percent = 100.0 * workers / cores
            outside = not self.params.min_threshold <= percent <= self.params.max_threshold
            violations += int(outside)
            details["nodes"][node] = {"cores": cores, "dataloader_processes": workers, "percent_of_cores": percent}
        timeline = trial.step_timeline()
        wait, wait_ms = _data_wait(timeline)
        if wait is not None:
            details["data_wait_percent_of_step_time"] = wait  # median wait / median step
            details["data_wait_ms_per_step"] = wait_ms  # median over TRAIN steps
        if gate > 0:
            if wait is None:
                if _data_wait_unseen(timeline):
                    return _Outcome(False, 0, len(children), details, reason=(
                        "the TRAIN steps fetch their batch inside one framework call (Keras's fit runs the next tf.data or "
                        "PyDataset batch inside its compiled step), so the step timeline cannot show the wait for data: "
                        "a detailed profiling window shows the input pipeline"))
                return _Outcome(False, 0, len(children), details, reason="no data-loading phases in the step timeline to measure the wait"
                                + ("" if len(children) else ", and no ChildProcessCount samples (monitor not run)"))
            loaders = ", ".join(f"{n}: {d['dataloader_processes']} worker process(es) on {d['cores']} cores" for n, d in details["nodes"].items())
            loaders = loaders or "worker processes not known: no system metrics"
            # Samples judged: the worker counts, or without them the TRAIN steps judged.
            judged = _train_steps_and_data(timeline)
            datapoints = len(children) or (len(judged[0]) if judged else 0)
            hit = wait >= gate and (wait_ms or 0.0) >= self.params.min_data_wait_ms
            message = f"waiting for data took {wait:.1f}% of the step time >= {gate:g}%, {wait_ms:.1f} ms per step ({loaders})"
            stalls = _data_stalls(timeline, self.params.min_data_wait_ms)
            if stalls is not None:
                details["data_stall_percent_of_train_time"], details["data_stalls"], details["data_stall_ms"] = stalls
            if not hit and stalls is not None and stalls[0] >= gate and stalls[1] >= MIN_DATA_STALLS:
                # The typical step waits little, but recurring stalls hold the job back.
                share, count, stall_ms = stalls
                message = (f"{count} steps waited {stall_ms:.0f} ms each for data: {share:.1f}% of the TRAIN time >= {gate:g}% "
                           f"(the median step waits {wait_ms:.1f} ms; {loaders})")
                return _Outcome(True, 1, datapoints, details, message, share, gate)
            return _Outcome(hit, int(hit), datapoints, details, message, wait, gate)
        worst = max(details["nodes"].items(), key=lambda kv: abs(kv[1]["percent_of_cores"] - 100))
        message = (
            f"{worst[0]}: {worst[1]['dataloader_processes']} data-loading process(es) on {worst[1]['cores']} cores = "
            f"{worst[1]['percent_of_cores']:.0f}% of the cores, outside [{self.params.min_threshold:g}, {self.params.max_threshold:g}]%"
        )
        return _Outcome(violations > 0, violations, len(children), details, message, worst[1]["percent_of_cores"], self.params.min_threshold)


@dataclass(frozen=True)
class OverallSystemUsageParams(RuleParams):
    scan_interval_us: int = ranged(_SCAN_INTERVAL_US, "positive_int")


class OverallSystemUsage(ProfilerRule):
    """Per node, percentiles of CPU, GPU, memory, IO wait, disk and network; never fires."""

    params: OverallSystemUsageParams

    _DIMENSIONS: ClassVar[tuple[str, ...]] = (
        "CPUUtilization", "I/OWaitPercentage", "GPUUtilization", "GPUMemoryUtilization", "MemoryUsedPercent",
        "DiskReadBytesPerSecond", "DiskWriteBytesPerSecond", "NetworkReceiveBytesPerSecond", "NetworkTransmitBytesPerSecond",
    )

    def _measure(self, trial: ProfilerTrial) -> _Outcome:
        details: dict[str, Any] = {"nodes": {}}
        datapoints = 0
        for dimension in self._DIMENSIONS:
            frame = _metric(trial, dimension)
            if dimension in ("CPUUtilization", "I/OWaitPercentage"):
                frame = _node_total(frame)
            for node, series in frame.groupby("node_id", sort=True):
                values = series["value"].to_numpy()
                datapoints += len(values)
                p50, p95, p99 = np.percentile(values, [50, 95, 99])
                details["nodes"].setdefault(node, {})[dimension] = {
                    "min": float(values.min()), "p50": float(p50), "p95": float(p95), "p99": float(p99), "max": float(values.max()),
                }
        if not datapoints:
            return _no_data("no system metrics (the system monitor did not run: ProfilerConfig(system_monitor=False), or a job without them)")
        return _Outcome(False, 0, datapoints, details)


PROFILER_RULES: dict[str, type[ProfilerRule]] = {
    rule.__name__: rule
    for rule in (
        CPUBottleneck, IOBottleneck, LowGPUUtilization, GPUMemoryIncrease, BatchSize,
        LoadBalancing, StepOutlier, MaxInitializationTime, Dataloader, OverallSystemUsage,
    )
}


# --- running ---------------------------------------------------------------------------


def run_profiler_rules(trial: Any, rules: Iterable[Any] | None = None) -> list[RuleReport]:
    """Run `rules` (rule objects, classes, registry names, or rulesconfig objects/dicts; all
    rules with SageMaker's defaults when None) over `trial` (a Trial, a ProfilerTrial, a path
    or a Store), without actions. A rule that crashes gives a report with status "error"."""
    from .config import from_rulesconfig

    if isinstance(trial, (str, os.PathLike, Store)):
        trial = ProfilerTrial(trial)
    chosen = [rule() if isinstance(rule, type) else rule for rule in (rules if rules is not None else PROFILER_RULES.values())]
    return [(rule if isinstance(rule, JobRule) else from_rulesconfig(rule)).run(trial) for rule in chosen]


# --- data helpers -----------------------------------------------------------------------


def _metric(trial: ProfilerTrial, dimension: str) -> pd.DataFrame:
    """node_id, name, timestamp, value of one dimension, plain strings, sorted by time."""
    frame = trial.system_metrics(names=[dimension])
    frame = frame[frame["dimension"] == dimension]
    return pd.DataFrame(
        {
            "node_id": frame["node_id"].astype(str).to_numpy(),
            "name": frame["name"].astype(str).to_numpy(),
            "timestamp": frame["timestamp"].to_numpy(),
            "value": frame["value"].to_numpy(),
        }
    )


def _node_total(frame: pd.DataFrame) -> pd.DataFrame:
    """The node-wide series of a per-core dimension: our "total" rows, or (legacy jobs)
    the mean over the cores at each instant."""
    total = frame[frame["name"] == "total"]
    cores = frame[(frame["name"] != "total") & ~frame["node_id"].isin(set(total["node_id"]))]
    parts = [total[["node_id", "timestamp", "value"]]]
    if len(cores):
        cores = cores.assign(timestamp=cores["timestamp"].round(3))
        parts.append(cores.groupby(["node_id", "timestamp"], as_index=False)["value"].mean())
    out = pd.concat(parts, ignore_index=True).sort_values(["node_id", "timestamp"], kind="stable")
    return out.assign(name="total").reset_index(drop=True)


def _after_patience(frame: pd.DataFrame, by: list[str], patience: int) -> pd.DataFrame:
    if frame.empty:
        return frame
    frame = frame.sort_values(by + ["timestamp"], kind="stable")
    return frame[frame.groupby(by).cumcount() >= patience].reset_index(drop=True)


def _window_starts(count: int, window: int) -> list[int]:
    """Starts of consecutive windows ending at the newest sample; a leading partial window
    is used only when it is all there is."""
    if count == 0:
        return []
    if count <= window:
        return [0]
    return list(range(count - window, -1, -window))[::-1]


def _windows(values: np.ndarray, window: int) -> list[np.ndarray]:
    return [values[start : start + window] for start in _window_starts(len(values), window)]


def _tolerance(frame: pd.DataFrame) -> float:
    """How far apart two samples may be and still count as one instant: half the usual
    sampling period."""
    diffs = frame.groupby(["node_id", "name"])["timestamp"].diff().to_numpy()
    diffs = diffs[np.isfinite(diffs) & (diffs > 0)]
    period = float(np.median(diffs)) if len(diffs) else 1.0
    return min(30.0, max(0.05, period / 2))


def _join_nearest(left: pd.DataFrame, right: pd.DataFrame, by: list[str], tolerance: float) -> pd.DataFrame:
    right = right[by + ["timestamp"] + [c for c in right.columns if c not in by + ["timestamp", "name", "node_id"]]]
    return pd.merge_asof(
        left.sort_values("timestamp", kind="stable"),
        right.sort_values("timestamp", kind="stable"),
        on="timestamp",
        by=by,
        direction="nearest",
        tolerance=tolerance,
    )


def _bottleneck(trial: ProfilerTrial, dimension: str, busy_threshold: float, gpu_threshold: float, percent_threshold: float, patience: int) -> _Outcome:
    """Samples where the node's `dimension` is above `busy_threshold` while its GPUs (mean)
    are below `gpu_threshold`; fires above `percent_threshold` % of the samples."""
    host = _node_total(_metric(trial, dimension))
    gpu = _metric(trial, "GPUUtilization")
    if gpu.empty or host.empty:
        return _no_data(f"needs GPUUtilization and {dimension}")
    gpu = gpu.assign(timestamp=gpu["timestamp"].round(3)).groupby(["node_id", "timestamp"], as_index=False)["value"].mean()
    joined = _join_nearest(host, gpu.rename(columns={"value": "gpu"}), ["node_id"], _tolerance(host))
    aligned = joined.dropna()
    joined = _after_patience(aligned, ["node_id"], patience)
    if joined.empty:
        return _short_of_patience(aligned, ["node_id"], patience, f"aligned {dimension}/GPU samples")
    hit = (joined["value"] > busy_threshold) & (joined["gpu"] < gpu_threshold)
    violations, datapoints = int(hit.sum()), len(joined)
    percent = 100.0 * violations / datapoints
    per_node = {
        node: {"datapoints": int(len(g)), "bottlenecks": int(hit[g.index].sum())}
        for node, g in joined.groupby("node_id", sort=True)
    }
    message = f"{percent:.1f}% of the samples had {dimension} > {busy_threshold:g}% while GPUs were below {gpu_threshold:g}% (> {percent_threshold:g}%)"
    return _Outcome(percent > percent_threshold, violations, datapoints, {"bottleneck_percent": percent, "nodes": per_node}, message, percent, percent_threshold)


_STEP_KEYS = ["node_id", "rank", "step"]


def _train_steps_and_data(timeline: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame] | None:
    """The TRAIN steps' "step" spans and their "data" phases; None when either is missing.
    A step with a "compute" phase is left out: the framework ran it as one call that fetched
    its batch too (Keras's `fit`, whose tf.data or PyDataset batch is read inside the
    compiled step; a torch step whose forward the hook did not see), so its wait for data
    is in "compute", and its "data" phase holds only the loop's own work between batches."""
    train = _train_spans(timeline)
    blind = train[train["phase"] == "compute"]
    if not blind.empty:
        train = train[~pd.MultiIndex.from_frame(train[_STEP_KEYS]).isin(pd.MultiIndex.from_frame(blind[_STEP_KEYS]))]
    steps, data = train[train["phase"] == "step"], train[train["phase"] == "data"]
    return None if data.empty or steps.empty else (steps, data)


def _data_wait_unseen(timeline: pd.DataFrame) -> bool:
    """Whether the job has TRAIN steps whose wait for data the timeline cannot show (each
    one call that fetched its batch too: `_train_steps_and_data`)."""
    train = _train_spans(timeline)
    return bool((train["phase"] == "compute").any())


def _train_spans(timeline: pd.DataFrame) -> pd.DataFrame:
    return timeline[timeline["mode"].astype(str) == "TRAIN"] if "mode" in timeline else timeline


def _data_wait(timeline: pd.DataFrame) -> tuple[float | None, float | None]:
    """(share of the step in %, ms per step) spent waiting for data in a typical training
    step: medians over the TRAIN steps (per rank and step, data phases summed), so the first
    step's iterator set-up or one slow batch do not speak for the whole job."""
    spans = _train_steps_and_data(timeline)
    if spans is None:
        return None, None
    steps, data = spans
    per_step = data.groupby(_STEP_KEYS, observed=True)["duration_ms"].sum()
    wait_ms = float(per_step.median())
    step_ms = float(steps["duration_ms"].median())
    return (100.0 * wait_ms / step_ms if step_ms > 0 else None), wait_ms


def _data_stalls(timeline: pd.DataFrame, min_ms: float) -> tuple[float, int, float] | None:
    """Waits for data the medians of `_data_wait` cannot see: (share of the TRAIN time the
    stalls took in %, stalls, median stall in ms) over the TRAIN steps but those that begin
    a run of them (each rank's first, and the first after an evaluation or any other mode:
    their wait is the loop's turn, a validation's end or a new epoch's iterator, not the
    loader's pace; a Keras fit waited 0.06-2.2 s there). A stall is a step that waited at
    least `min_ms` and at least as long as the median step took: a loader that fills a
    buffer in bulk every few steps (Lightning's PPO example: a rollout every 16th step,
    130 ms against a 3.4 ms median step, 70 % of the time) leaves the median step no wait
    at all. Only the stalls' own waits count: the small wait of every step (a Lightning
    loop's own work between batches) is the medians' to judge. None without data phases."""
    spans = _train_steps_and_data(timeline)
    if spans is None:
        return None
    steps, data = spans
    keys = _STEP_KEYS
    per_step = steps.groupby(keys, observed=True)["duration_ms"].sum()
    waits = data.groupby(keys, observed=True)["duration_ms"].sum().reindex(per_step.index, fill_value=0.0)
    # The steps of every mode in order per rank (global steps): a TRAIN step whose previous
    # one was not TRAIN (or is none) begins a run.
    order = timeline[["node_id", "rank", "step", "mode"]].drop_duplicates(keys).sort_values(keys)  # (an EVAL step's span is "eval_step")
    previous = order.groupby(["node_id", "rank"], observed=True)["mode"].shift().astype(str)
    begins = order[(order["mode"].astype(str) == "TRAIN") & (previous != "TRAIN")]
    begins_index = pd.MultiIndex.from_frame(begins[keys])
    keep = ~per_step.index.isin(begins_index)
    per_step, waits = per_step[keep], waits[keep]
    total = float(per_step.sum())
    if total <= 0:
        return None
    stalls = waits[(waits >= min_ms) & (waits >= float(per_step.median()))]
    return 100.0 * float(stalls.sum()) / total, len(stalls), float(stalls.median()) if len(stalls) else 0.0


def _no_data(reason: str) -> _Outcome:
    return _Outcome(False, 0, 0, {}, reason=reason)


def _short_of_patience(raw: pd.DataFrame, by: list[str], patience: int, what: str) -> _Outcome:
    """Nothing left after the first `patience` samples (warm-up) of each series: "no data"
    without samples, else "not enough data (needs patience + 1, has the longest series)"."""
    if raw.empty:
        return _no_data(f"no {what}")
    longest = int(raw.groupby(by).size().max())
    return _Outcome(False, 0, 0, {}, reason=f"not enough {what} after patience", needed=patience + 1, available=longest, unit=f"{what} (the first {patience} are warm-up)")
