"""The data behind each page of a job, as plain JSON: everything is computed here from the
trial's Python APIs (the step timeline and system metrics of `trial.profiler`, tensors,
the profiler rules' reports), so the browser only draws what it is given.

Results are cached per trial and per `stamp` (the job store's generation of the job, which
grows when the job publishes something), so a page that polls a finished job costs one
cheap listing, and a running job is recomputed only when something new has landed."""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable, Hashable
from typing import Any

import numpy as np
import pandas as pd

from .. import chart_scales, health
from ..health import STEP_PHASES
from .jobs import trial_lock

MAX_POINTS = 600  # samples per system-metric series sent to a chart
MAX_CURVE_POINTS = 2000
MAX_HEATMAP_STEPS = 120
MAX_HEATMAP_TENSORS = 60
MAX_HISTOGRAM_STEPS = 50

# Per trial (weakly: a trial the app drops takes its entries with it): {what: (stamp, value)}.
_cache: weakref.WeakKeyDictionary[Any, dict[str, tuple[Any, Any]]] = weakref.WeakKeyDictionary()
_cache_lock = threading.Lock()


def _cached(trial: Any, stamp: Hashable, what: str, compute: Callable[[], Any]) -> Any:
    with _cache_lock:
        hit = _cache.get(trial, {}).get(what)
    if hit is not None and hit[0] == stamp:
        return hit[1]
    with trial_lock(trial):
        value = compute()
    with _cache_lock:
        entries = _cache.setdefault(trial, {})
        if len(entries) > 64:  # many histogram or phase choices: start over
            entries.clear()
        entries[what] = (stamp, value)
    return value


def version(trial: Any, stamp: Hashable) -> dict[str, Any]:
    """What the job has published so far; a page polls this and reloads when `tag` changes."""
    def compute() -> dict[str, Any]:
        span = trial.profiler.time_range()
        return {"steps": len(trial.steps()), "timeline_events": len(trial.profiler.step_timeline()), "last_sample": span[1] if span else None,
                "complete": trial.is_complete(), "tag": str(stamp)}

    return _cached(trial, stamp, "version", compute)


# --- dashboard -------------------------------------------------------------------------


def dashboard(trial: Any, stamp: Hashable, phase: str | None = None, bins: int = 30, k: int = 10) -> dict[str, Any]:
    return _cached(trial, stamp, f"dashboard:{phase}:{bins}:{k}", lambda: _dashboard(trial, phase, bins, k))


def _dashboard(trial: Any, phase: str | None, bins: int, k: int) -> dict[str, Any]:
    profiler = trial.profiler
    timeline = profiler.step_timeline()
    metrics = profiler.system_metrics()
    steps = timeline[timeline["phase"].isin(STEP_PHASES)]
    phases = timeline[~timeline["phase"].isin(STEP_PHASES)]
    annotation_names = sorted(str(p) for p in phases["phase"].unique())
    traced = _trace_annotations(trial)
    annotation_names += [TRACE_PREFIX + name for name in sorted(traced)]
    if phase is None or phase not in annotation_names:
        phase = "backward" if "backward" in annotation_names else (annotation_names[0] if annotation_names else None)
    if phase and phase.startswith(TRACE_PREFIX):
        chosen = traced[phase[len(TRACE_PREFIX):]]
    else:
        chosen = phases[phases["phase"] == phase]["duration_ms"].to_numpy() if phase else np.array([])
    # one mode per histogram (an EVAL step is a whole validation pass): TRAIN when there is any
    histogram_mode = "TRAIN" if (steps["mode"] == "TRAIN").any() else (str(steps["mode"].iloc[0]) if len(steps) else None)
    histogram_steps = steps[steps["mode"] == histogram_mode] if histogram_mode else steps
    return {
        "system": _system_series(metrics),
        "steps": _step_series(steps),
        "step_histogram": {**_histogram(histogram_steps["duration_ms"].to_numpy(), bins, _step_names(histogram_steps)), "mode": histogram_mode},
        "cpu_time": _phase_shares(steps, phases),
        "annotation": {"names": annotation_names, "chosen": phase, "histogram": _histogram(chosen, bins)},
        "gpu": _gpu_views(trial, k),
    }


def _step_names(steps: pd.DataFrame) -> list[str]:
    """Each step row as a person names it: its mode and global step ("TRAIN step 0")."""
    return [f"{m} step {int(s)}" for m, s in zip(steps["mode"].astype(str), steps["step"])]


TRACE_PREFIX = "trace: "


def _trace_annotations(trial: Any) -> dict[str, np.ndarray]:
    """Durations (ms) of each user annotation in the job's detailed traces (record_function,
    stepscope.annotate), by name; empty without traces."""
    traces = _traces(trial)
    if traces is None:
        return {}
    events = traces.events(kinds=["annotation"])
    if events.empty:
        return {}
    events = events[~events["name"].astype(str).str.startswith("ProfilerStep#")]
    return {str(name): group["dur_ns"].to_numpy() / 1e6 for name, group in events.groupby("name", observed=True, sort=True)}


def _system_series(metrics: pd.DataFrame) -> dict[str, Any]:
    """Per node: CPU (total) and each GPU's utilization and memory, averaged into at most
    MAX_POINTS buckets of time (what a chart of a few hundred pixels can show)."""
    out: dict[str, Any] = {}
    if metrics.empty:
        return out
    wanted = metrics[metrics["dimension"].isin(["CPUUtilization", "GPUUtilization", "GPUMemoryUtilization", "MemoryUsedPercent"])]
    for node, frame in wanted.groupby("node_id", sort=True, observed=True):
        cpu = frame[frame["dimension"] == "CPUUtilization"]
        total = cpu[cpu["name"] == "total"]
        if total.empty:  # legacy jobs: no total line, the mean over cores
            total = cpu.groupby("timestamp", as_index=False)["value"].mean().assign(name="total")
        parts = [total.assign(series="CPU")[["timestamp", "series", "value"]]]
        memory = frame[frame["dimension"] == "MemoryUsedPercent"]
        parts.append(memory.assign(series="Host memory")[["timestamp", "series", "value"]])
        gpu = frame[frame["dimension"].isin(["GPUUtilization", "GPUMemoryUtilization"])]
        if not gpu.empty:
            label = gpu["name"].astype(str) + np.where(gpu["dimension"] == "GPUUtilization", "", " memory")
            parts.append(gpu.assign(series=label)[["timestamp", "series", "value"]])
        merged = pd.concat(parts, ignore_index=True)
        if merged.empty:
            continue
        wide = merged.pivot_table(index="timestamp", columns="series", values="value", aggfunc="mean").sort_index()
        if len(wide) > MAX_POINTS:
            buckets = np.arange(len(wide)) * MAX_POINTS // len(wide)
            # the timestamp as a column, so each bucket keeps its mean time (grouping the
            # index away put bucket numbers 0..599 on the time axis)
            wide = wide.reset_index().groupby(buckets).mean()
        out[str(node)] = {"t": [float(t) for t in wide.index] if "timestamp" not in wide else wide["timestamp"].tolist(),
                          "series": {str(c): _floats(wide[c].to_numpy()) for c in wide.columns if c != "timestamp"}}
        if "timestamp" in wide:
            out[str(node)]["series"].pop("timestamp", None)
    return out


def _step_series(steps: pd.DataFrame) -> list[dict[str, Any]]:
    """Step time over global steps per node, rank and mode, with the outlier limit and the
    outliers of the StepOutlier rule as `stepscope check` runs it (its default-set
    parameters): the steps above the limit are the outliers the rule counts."""
    from ..rules.profiler import StepOutlier

    rule = StepOutlier(**StepOutlier.preset)
    judged = set(rule.modes())
    series = []
    for group in health.step_groups(steps, rule.criterion()):
        limit = group.limit_ms if group.mode in judged else None
        series.append({"key": group.key, "node": group.node, "rank": group.rank, "mode": group.mode, "steps": group.steps,
                       "duration_ms": _floats(np.asarray(group.duration_ms)), "limit_ms": limit, "outliers": group.outliers if limit is not None else [],
                       "log_y": chart_scales.wants_log(group.duration_ms)})
    return series


def _histogram(values: np.ndarray, bins: int, names: list[str] | None = None) -> dict[str, Any]:
    """Counts over the range of all but the few far-out values (a compile step would put every
    other step into one bin; chart_scales.split_far): those are listed under `apart` and stated
    next to the chart. The summary figures (mean, percentiles, max) are over every value."""
    values = np.asarray(values, dtype=float)
    finite = np.isfinite(values) if len(values) else np.zeros(0, dtype=bool)
    names = [names[i] for i in np.flatnonzero(finite)] if names is not None else None
    values = values[finite]
    if not len(values):
        return {"edges": [], "counts": [], "n": 0, "apart": [], "apart_note": ""}
    split = chart_scales.split_far(values)
    counts, edges = np.histogram(values[split.keep], bins=bins)
    return {"edges": _floats(edges), "counts": [int(c) for c in counts], "n": int(len(values)),
            "mean": float(values.mean()), "p50": float(np.percentile(values, 50)), "p95": float(np.percentile(values, 95)), "max": float(values.max()),
            "apart": [{"value": v, "name": names[i] if names is not None else None} for i, v in split.apart],
            "apart_note": split.statement("ms", "step" if names is not None else "value", names)}


def _phase_shares(steps: pd.DataFrame, phases: pd.DataFrame) -> dict[str, float]:
    """Where the host's step time went: total ms per phase, and step time no phase covers
    added to `other`. (The phases of a step tile it, "data" included: a step starts where
    the previous one's work ended.)"""
    shares = {str(k): float(v) for k, v in phases.groupby("phase")["duration_ms"].sum().items() if v > 0}
    uncovered = float(steps["duration_ms"].sum()) - sum(shares.values())
    if uncovered > 0:
        shares["other"] = shares.get("other", 0.0) + uncovered
    return shares


def _traces(trial: Any) -> Any | None:
    """The job's trace analysis (stepscope.traces) when it has detailed traces, else None."""
    try:
        traces = trial.profiler.traces
        return traces if traces.trace_keys() else None
    except ImportError:  # the `traces` extra (pyarrow) is not installed
        return None


def _gpu_views(trial: Any, k: int = 10) -> dict[str, Any]:
    """The trace engine's answers: GPU time split (kernels, memcpy/memset, sync, idle) and
    idle causes per rank, top kernels by time and by launches, kernel precision, memory
    operations, syncs and launch delays."""
    traces = _traces(trial)
    if traces is None:
        return {"available": False, "reason": "no detailed GPU traces in this job (profile some steps with the plugins' detailed profiling)"}
    active = traces.active_time()
    idle = traces.idle_breakdown()
    precision = traces.kernel_stats(by="precision")
    pies = {}
    for row in active.itertuples():
        waits = idle[idle["rank"] == row.rank]
        classes = precision[precision["rank"] == row.rank] if "rank" in precision else precision
        pies[f"rank {row.rank}"] = {
            "precision": {str(p): float(t) for p, t in zip(classes["precision"], classes["total_us"])},
            "time": {"kernels": float(row.kernel_us), "memcpy / memset": float(row.memory_us), "sync": float(row.sync_us), "idle": float(row.idle_us)},
            "idle": {"waiting for the host": float(waits["host_wait_us"].sum()), "between kernels": float(waits["kernel_wait_us"].sum()),
                     "other": float(waits["other_us"].sum())},
        }
    return {
        "available": True,
        "k": k,
        "pies": pies,
        "tables": {
            "Top kernels by time": table(traces.top_kernels(k=k, by="time")),
            "Top kernels by launches": table(traces.top_kernels(k=k, by="launches")),
            "Kernel precision": table(precision),
            "Memory operations": table(traces.memory_ops()),
            "Synchronizations": table(traces.syncs()),
            "Launch delay": table(traces.launch_latency().head(k)),
            # torch's profiler tables lead with these; on a CPU-only job they are the window's work
            "CPU operators (inclusive time, with self time)": table(traces.cpu_ops(k=k)),
        },
        "gpu_activity": bool(len(active)) and float(active["kernel_us"].sum() + active["memory_us"].sum()) > 0,
    }


def table(frame: pd.DataFrame) -> dict[str, Any]:
    """A DataFrame as {columns, rows} of JSON values (NaN as null)."""
    rows = []
    for values in frame.itertuples(index=False):
        rows.append([None if isinstance(v, float) and not np.isfinite(v) else v.item() if isinstance(v, np.generic) else v for v in values])
    return {"columns": [str(c) for c in frame.columns], "rows": rows}


# --- rules -----------------------------------------------------------------------------


def rules_status(trial: Any, stamp: Hashable) -> dict[str, Any]:
    return _cached(trial, stamp, "rules", lambda: _rules_status(trial))


def _rules_status(trial: Any) -> dict[str, Any]:
    """The reports `stepscope check` published (tensor and whole-job rules), and the
    whole-job rules of its default set run now on what the job has so far (a running job's
    findings as they land), with the same parameters as `stepscope check`; each with its
    evidence and the rule's explanation (definition, likely causes, advice)."""
    from ..rules import RuleReport, default_profiler_rules, run_rules
    from ..rules.output import load_report, load_summary

    rows: dict[str, dict[str, Any]] = {}
    problems: list[str] = []  # reports that could not be read, each named: the rest still show
    for row in load_summary(trial.store, problems):
        name = str(row.get("rule"))
        report = load_report(trial.store, name, problems)
        if report is None:  # no report file, or an unreadable one: the summary's row still shows
            try:
                report = RuleReport.from_json(row)
            except ValueError as exc:
                problems.append(f"rule-output/summary.json: rule {name[:80]!r}: {exc}")
                continue
        rows[name] = _rule_row(report, "stepscope check")
    live_rules = [rule for rule in default_profiler_rules(trial) if rule.name not in rows and rule.name != "OverallSystemUsage"]
    for live in run_rules(live_rules) if live_rules else []:
        rows[live.rule] = _rule_row(live, "live")
    ordered = sorted(rows.values(), key=lambda r: (not r["fired"], r["rule"]))
    return {"rules": ordered, "fired": [r["rule"] for r in ordered if r["fired"]], "problems": problems}


def _rule_row(report: Any, source: str) -> dict[str, Any]:
    """A RuleReport (or its JSON, as `check` writes it) as one row of the panel."""
    from ..rules import RuleReport

    if not isinstance(report, RuleReport):
        report = RuleReport.from_json(report)
    explanation = report.explanation
    named = [e.step if e.step is not None else e.mode_step for e in report.evidence]
    steps = [s for s in [*report.fired_steps, *named] if isinstance(s, int)]
    return {
        "rule": report.rule, "kind": report.kind, "fired": report.fired, "status": report.status, "summary": report.summary(),
        "judged": report.judged, "to_save": report.to_save, "violations": report.violations,
        "definition": explanation.definition if explanation else None,
        "causes": _trim(list(explanation.causes)) if explanation else [], "advice": _trim(list(explanation.advice)) if explanation else [],
        "evidence": _trim(report.details), "statistics": _trim(report.statistics), "steps": sorted(set(steps))[:200], "source": source,
    }


def _trim(value: Any, depth: int = 0) -> Any:
    """Evidence for the page: lists cut to 20 items, nesting to 4 levels."""
    if depth > 4:
        return "..."
    if isinstance(value, dict):
        return {str(k): _trim(v, depth + 1) for k, v in list(value.items())[:40]}
    if isinstance(value, (list, tuple)):
        return [_trim(v, depth + 1) for v in list(value)[:20]]
    return value


# --- training health -----------------------------------------------------------------------


def training_health(trial: Any, stamp: Hashable) -> dict[str, Any]:
    return _cached(trial, stamp, "health", lambda: _training_health(trial))


def _collection_names(trial: Any, collection: str) -> list[str]:
    try:
        return trial.tensor_names(collection=collection)
    except KeyError:
        return []


def _training_health(trial: Any) -> dict[str, Any]:
    """Every series over global steps, each of one mode (named with it): losses and metrics
    per mode, and the health series of stepscope.health at the TRAIN steps."""
    scalars = sorted((set(_collection_names(trial, "losses")) | set(_collection_names(trial, "metrics"))) - health.STEP_COUNTERS)
    curves = []
    for name in scalars:
        for mode, steps in health.steps_by_mode(trial, name).items():
            steps = health.subsample(steps, MAX_CURVE_POINTS)
            values = trial.read_many([(name, s, None, None) for s in steps])
            kept = [(s, float(np.asarray(v).reshape(-1)[0])) for s, v in zip(steps, values) if v is not None and np.asarray(v).size == 1]
            if kept:
                curve: dict[str, Any] = {"tensor": name, "mode": mode, "steps": [s for s, _ in kept], "values": _floats(np.array([v for _, v in kept]))}
                # NaN/inf values have no place on the chart (it ends where the loss blew up):
                # counted, with the first step, for the note under it.
                bad = health.non_finite_points(kept)
                if bad is not None:
                    curve["non_finite"] = dict(zip(("nan", "inf", "first_step"), bad))
                curves.append(curve)
    gradients = [n for n in _collection_names(trial, "gradients") if not n.startswith("smdebug/")][:MAX_HEATMAP_TENSORS]
    raw = [n for n in trial.tensor_names() if not n.startswith("smdebug/")]
    return {"curves": curves, "gradient_norms": _norm_heatmap(trial, gradients), "update_ratios": _update_ratios(trial),
            "inactive_units": _inactive_units(trial), "tensors": raw, "default_tensor": _default_tensor(trial, raw)}


def _default_tensor(trial: Any, names: list[str]) -> str | None:
    """The tensor the histogram view opens on: a weight, else a gradient, else any."""
    for collection in ("weights", "gradients"):
        found = [n for n in _collection_names(trial, collection) if n in names]
        if found:
            return found[0]
    return names[0] if names else None


def _heatmap(rows: list[health.Series], limit: int) -> dict[str, Any]:
    """Series as a heatmap: one row per series (named "tensor (MODE)" where modes differ),
    one column per global step any of them has (at most `limit`, evenly spread)."""
    steps = health.subsample(sorted({s for row in rows for s in row.steps}), limit)
    values = []
    for row in rows:
        at = dict(zip(row.steps, row.values))
        values.append(_floats(np.array([at.get(s, np.nan) for s in steps], dtype=float)))
    return {"tensors": [row.name for row in rows], "modes": [row.mode for row in rows], "steps": steps, "values": values}


def _inactive_units(trial: Any) -> dict[str, Any]:
    """Per layer the DeadRelu / SaturatedActivation rules inspect (their default set), the %
    of units dead or saturated at each of the layer's last `persistence` saved steps of a
    mode: the figure those rules judge (stepscope.health.inactive_unit_series)."""
    from ..rules.activations import default_inactive_series

    rows, persistence = default_inactive_series(trial)
    return {**_heatmap(rows[:MAX_HEATMAP_TENSORS], MAX_HEATMAP_STEPS), "persistence": persistence}


def _norm_heatmap(trial: Any, names: list[str]) -> dict[str, Any]:
    """L2 norm of each gradient at its saved TRAIN steps (stepscope.health.gradient_norm)."""
    return _heatmap([health.gradient_norm_series(trial, name, MAX_HEATMAP_STEPS) for name in names], MAX_HEATMAP_STEPS)


def _update_ratios(trial: Any) -> dict[str, Any]:
    """Each weight's update ratio between consecutive saved TRAIN steps
    (stepscope.health.update_ratio: the figure the WeightUpdateRatio rule judges)."""
    names = [n for n in _collection_names(trial, "weights") if not n.startswith("smdebug/")][:MAX_HEATMAP_TENSORS]
    found = [health.update_ratio_series(trial, name, MAX_HEATMAP_STEPS) for name in names]
    return {"series": [s.to_json() for s in found if s.steps]}


def tensor_histograms(trial: Any, stamp: Hashable, name: str, bins: int = 30, mode: str | None = None) -> dict[str, Any]:
    """Histograms of one tensor at its saved steps of one mode (`mode`, else TRAIN when it has
    TRAIN steps, else its first mode), on common bin edges (TensorBoard's histogram view):
    counts[step index][bin], steps as global steps; `modes` lists the modes it has."""
    if not trial.has_tensor(name):
        return {"tensor": name, "steps": [], "edges": [], "counts": [], "error": "no such tensor"}
    return _cached(trial, stamp, f"hist:{name}:{bins}:{mode}", lambda: _tensor_histograms(trial, name, bins, mode))


def _tensor_histograms(trial: Any, name: str, bins: int, mode: str | None) -> dict[str, Any]:
    by_mode = health.steps_by_mode(trial, name)
    if mode not in by_mode:
        mode = "TRAIN" if "TRAIN" in by_mode else next(iter(by_mode), None)
    steps = health.subsample(by_mode.get(mode, []) if mode else [], MAX_HISTOGRAM_STEPS)
    values = trial.read_many([(name, s, None, None) for s in steps])
    kept = [(s, np.asarray(v, dtype=float).ravel()) for s, v in zip(steps, values) if v is not None]
    kept = [(s, v[np.isfinite(v)]) for s, v in kept]
    kept = [(s, v) for s, v in kept if len(v)]
    if not kept:
        return {"tensor": name, "mode": mode, "modes": list(by_mode), "steps": [], "edges": [], "counts": []}
    low = min(float(v.min()) for _, v in kept)
    high = max(float(v.max()) for _, v in kept)
    if high <= low:
        high = low + 1.0
    edges = np.linspace(low, high, bins + 1)
    counts = [[int(c) for c in np.histogram(v, bins=edges)[0]] for _, v in kept]
    return {"tensor": name, "mode": mode, "modes": list(by_mode), "steps": [s for s, _ in kept], "edges": _floats(edges), "counts": counts}


# --- statistical summary ----------------------------------------------------------------


def statistics(trial: Any, stamp: Hashable) -> dict[str, Any]:
    return _cached(trial, stamp, "stats", lambda: _statistics(trial))


def _statistics(trial: Any) -> dict[str, Any]:
    from ..rules.profiler import OverallSystemUsage

    profiler = trial.profiler
    timeline = profiler.step_timeline()
    tables: dict[str, dict[str, Any]] = {}
    steps = timeline[timeline["phase"].isin(STEP_PHASES)].sort_values("start_ns")
    tables["steps"] = {
        "title": "Steps",
        "columns": ["node", "rank", "mode", "step", "start_s", "duration_ms"],
        "rows": [[str(r.node_id), int(r.rank), str(r.mode), int(r.step), round(r.start_ns / 1e9, 6), float(r.duration_ms)] for r in steps.itertuples()],
    }
    grouped = timeline.groupby(["phase", "name"], sort=True)["duration_ms"]
    annotation_rows: list[list[Any]] = []
    for (phase, name), durations in grouped:
        values = durations.to_numpy()
        p50, p95 = np.percentile(values, [50, 95])
        annotation_rows.append([str(phase), str(name), int(len(values)), float(values.sum()), float(values.mean()), float(p50), float(p95), float(values.max())])
    if len(timeline):
        annotation_rows.sort(key=lambda r: -float(r[3]))
    tables["annotations"] = {"title": "Annotations (steps and phases)", "columns": ["phase", "name", "count", "total_ms", "mean_ms", "p50_ms", "p95_ms", "max_ms"], "rows": annotation_rows}
    usage = OverallSystemUsage().run(profiler).statistics.get("nodes", {})
    tables["system"] = {
        "title": "System metrics (percentiles)",
        "columns": ["node", "dimension", "min", "p50", "p95", "p99", "max"],
        "rows": [[node, dim, s["min"], s["p50"], s["p95"], s["p99"], s["max"]] for node, dims in sorted(usage.items()) for dim, s in dims.items()],
    }
    traces = _traces(trial)
    if traces is not None:
        for name, title, frame in (
            ("kernels", "GPU kernels", traces.kernel_stats()),
            ("cpu_ops", "CPU operators (inclusive time)", traces.cpu_ops(k=None)),
            ("memory_ops", "Memory operations", traces.memory_ops()),
            ("syncs", "Synchronizations", traces.syncs()),
            ("launch_latency", "Kernel launch delay", traces.launch_latency()),
        ):
            tables[name] = {"title": title, **table(frame)}
        tables.update(_detail_tables(traces))
    return {"tables": tables}


MAX_DETAIL_TRACES = 8  # the operator/kernel views read trace files again: a few ranks' worth


def _detail_tables(traces: Any) -> dict[str, dict[str, Any]]:
    """Operators by name, by input shapes and by call stack, and kernels by name and by
    launching operator with their launch configuration (stepscope.traces.details), over the
    first MAX_DETAIL_TRACES Kineto traces; an unreadable trace is named in the title."""
    from ..traces import details

    keys = [k for k in traces.trace_keys() if k.endswith((".json", ".json.gz"))]
    if not keys:
        return {}
    shown = keys[:MAX_DETAIL_TRACES]
    note = f" (first {len(shown)} of {len(keys)} traces)" if len(keys) > len(shown) else ""
    try:
        found = details.views(traces.store, shown)
    except details.TraceDetailError as exc:
        return {"operators": {"title": f"Operators: not available ({exc})", "columns": [], "rows": []}}
    titles = {"operators": "Operators by name", "operators_by_shapes": "Operators by name and input shapes",
              "operators_by_stack": "Operators by name and call stack", "kernels": "Kernels by name, with launch configuration",
              "kernels_by_op": "Kernels by launching operator"}
    return {name: {"title": titles[name] + note, **table(frame)} for name, frame in found.items() if len(frame)}


def table_page(table: dict[str, Any], *, query: str = "", sort: str | None = None, descending: bool = False, offset: int = 0,
               limit: int = 1000) -> dict[str, Any]:
    """Rows of a summary table matching `query` (case-insensitive text in any cell), sorted by
    the column `sort` (missing values last), from `offset`, at most `limit`."""
    rows = table["rows"]
    if query:
        needle = query.lower()
        rows = [r for r in rows if any(needle in str(c).lower() for c in r)]
    if sort is not None:
        column = table["columns"].index(sort)
        present = [r for r in rows if r[column] is not None]
        rows = sorted(present, key=lambda r: r[column], reverse=descending) + [r for r in rows if r[column] is None]
    return {"columns": table["columns"], "rows": rows[offset:offset + limit], "total": len(table["rows"]), "matched": len(rows), "offset": offset}


# --- helpers ----------------------------------------------------------------------------


def _floats(values: np.ndarray) -> list[float | None]:
    """JSON has no NaN: missing values become null."""
    return [None if not np.isfinite(v) else float(v) for v in np.asarray(values, dtype=float)]
