"""Compare two jobs, or two traces: what got slower, which kernels and operators changed,
which rules' verdicts changed, how the saved tensors differ at the steps both saved.

`compare(a, b)` returns a `JobDiff` of sections, each a list of `Change` rows (A's value,
B's value, the unit); `stepscope diff A B` prints it (docs/reading.md#compare-two-jobs).
Only what both sides have is compared; a section one side lacks says so in its note instead
of showing numbers against nothing.

Values are normalised so that jobs of different lengths compare: step times are medians
over each mode's steps, kernel and operator times are per profiled step (each side's traced
steps), system metrics are means (peaks for memory)."""

from __future__ import annotations

import logging
import math
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .exceptions import StepscopeError
from .modes import ModeKeys

if TYPE_CHECKING:  # numpy and pandas load when a comparison runs, not with the CLI's parser
    import numpy as np
    import pandas as pd

logger = logging.getLogger("stepscope.diff")

# A change smaller than this share of the larger value is reported as "same": step times
# and kernel totals of two runs of one unchanged program differ by a few percent.
SAME_WITHIN = 0.05
_STEP_PHASES = {"step", "eval_step", "predict_step"}


@dataclass(frozen=True)
class Change:
    """One compared figure. `a` / `b` None: that side does not have it (new / vanished)."""

    key: str
    a: float | str | None
    b: float | str | None
    unit: str = ""

    @property
    def status(self) -> str:
        """new, vanished, changed or same (numbers within SAME_WITHIN of each other)."""
        if self.a is None:
            return "new"
        if self.b is None:
            return "vanished"
        if isinstance(self.a, str) or isinstance(self.b, str):
            return "same" if self.a == self.b else "changed"
        largest = max(abs(self.a), abs(self.b))
        return "same" if largest == 0 or abs(self.b - self.a) <= SAME_WITHIN * largest else "changed"

    @property
    def ratio(self) -> float | None:
        """b / a for numbers (None where either is missing, a string or a is 0)."""
        if isinstance(self.a, (int, float)) and isinstance(self.b, (int, float)) and self.a:
            return self.b / self.a
        return None

    def to_json(self) -> dict[str, Any]:
        return {"key": self.key, "a": _plain(self.a), "b": _plain(self.b), "unit": self.unit, "status": self.status, "ratio": _plain(self.ratio)}


@dataclass
class Section:
    name: str
    title: str
    rows: list[Change] = field(default_factory=list)
    note: str | None = None  # why the section is empty or partial

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "title": self.title, "note": self.note, "rows": [row.to_json() for row in self.rows]}


@dataclass
class JobDiff:
    a: str
    b: str
    sections: list[Section]

    def section(self, name: str) -> Section:
        for section in self.sections:
            if section.name == name:
                return section
        raise KeyError(name)

    def to_json(self) -> dict[str, Any]:
        return {"a": self.a, "b": self.b, "same_within": SAME_WITHIN, "sections": [s.to_json() for s in self.sections]}


def _plain(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if hasattr(value, "item") and not isinstance(value, (str, bytes)):  # a numpy scalar
        return value.item()
    return value


# --- one side ---------------------------------------------------------------------------


class _Side:
    """What one side offers: a job (a Trial with its profiler data) or only traces."""

    def __init__(self, path: Any):
        from .store import open_store
        from .traces import sources

        self.path = path
        self.trial: Any = None
        self.traces: Any = None
        if hasattr(path, "tensor_names") and hasattr(path, "profiler"):  # a Trial already open (the app's)
            self.trial, self.traces = path, path.profiler.traces
            return
        store = open_store(path) if not sources.is_trace_file(str(path)) else None
        if store is not None and _is_job(store):
            from .trial import create_trial

            self.trial = create_trial(store)
            self.traces = self.trial.profiler.traces
        else:
            from .traces.analysis import TraceAnalysis

            self.traces = TraceAnalysis(path)
            if not self.traces.trace_keys():
                raise StepscopeError(f"{path}: neither a stepscope job nor a folder or file of traces (nothing to compare)")

    def timeline(self) -> pd.DataFrame | None:
        return self.trial.profiler.step_timeline() if self.trial is not None else None


def _is_job(store: Any) -> bool:
    from . import layout

    folders = (layout.INDEX_DIR, layout.EVENTS_DIR, layout.PROFILER_DIR, layout.COLLECTIONS_DIR)
    return any(store.list(folder.split("/")[0] + "/") for folder in folders)


def _guarded(section: Section, compute: Callable[[], None]) -> Section:
    """A section whose data cannot be read says why; the other sections still compare."""
    try:
        compute()
    except (StepscopeError, OSError, ValueError, KeyError) as exc:
        logger.debug("diff section %s failed", section.name, exc_info=True)
        section.rows.clear()
        section.note = f"could not compare: {exc}"
    return section


# --- sections ---------------------------------------------------------------------------


def _steps(a: _Side, b: _Side) -> Section:
    section = Section("steps", "Step time (median and p90 per mode, from the step timeline)")

    def compute() -> None:
        ta, tb = a.timeline(), b.timeline()
        if ta is None or tb is None or not len(ta) or not len(tb):
            return _trace_steps(a, b, section)
        for mode in sorted(set(ta["mode"]) | set(tb["mode"])):
            da, db = _step_durations(ta, mode), _step_durations(tb, mode)
            section.rows.append(Change(f"{mode} steps", _count(da), _count(db), "steps"))
            section.rows.append(Change(f"{mode} median step", _q(da, 0.5), _q(db, 0.5), "ms"))
            section.rows.append(Change(f"{mode} p90 step", _q(da, 0.9), _q(db, 0.9), "ms"))
        return None

    return _guarded(section, compute)


def _step_durations(timeline: pd.DataFrame, mode: str) -> pd.Series | None:
    rows = timeline[(timeline["mode"] == mode) & timeline["phase"].isin(_STEP_PHASES)]
    return rows["duration_ms"] if len(rows) else None


def _trace_steps(a: _Side, b: _Side, section: Section) -> None:
    """Two traces without a job's step timeline: the traces' ProfilerStep spans."""
    sa, sb = a.traces.step_breakdown(), b.traces.step_breakdown()
    if not len(sa) or not len(sb):
        section.note = "one side has no steps (no step timeline and no ProfilerStep in its traces)"
        return
    da, db = sa["step_us"] / 1000.0, sb["step_us"] / 1000.0
    section.rows += [Change("traced steps", float(len(da)), float(len(db)), "steps"),
                     Change("median traced step", _q(da, 0.5), _q(db, 0.5), "ms")]


def _phases(a: _Side, b: _Side) -> Section:
    section = Section("phases", "Time in each phase (median per TRAIN step, from the step timeline)")

    def compute() -> None:
        ta, tb = a.timeline(), b.timeline()
        if ta is None or tb is None or not len(ta) or not len(tb):
            section.note = "needs a job's step timeline on both sides"
            return
        ma, mb = _phase_medians(ta), _phase_medians(tb)
        for phase in sorted(set(ma) | set(mb)):
            section.rows.append(Change(phase, ma.get(phase), mb.get(phase), "ms"))

    return _guarded(section, compute)


def _phase_medians(timeline: pd.DataFrame) -> dict[str, float]:
    rows = timeline[(timeline["mode"] == ModeKeys.TRAIN.name) & ~timeline["phase"].isin(_STEP_PHASES)]
    per_step = rows.groupby(["rank", "step", "phase"], observed=True)["duration_ms"].sum()
    return {str(phase): float(v) for phase, v in per_step.groupby(level="phase", observed=True).median().items()}


def _per_traced_step(side: _Side) -> int:
    steps = side.traces.step_breakdown()
    return max(len(steps), 1)


def _by_name(frame: pd.DataFrame, value: str, steps: int) -> dict[str, tuple[float, float]]:
    """name -> (value per traced step, calls per traced step), summed over ranks."""
    if not len(frame):
        return {}
    grouped = frame.groupby("name", observed=True)[[value, "count"]].sum()
    return {str(name): (float(row[value]) / steps, float(row["count"]) / steps) for name, row in grouped.iterrows()}


def _ranked_changes(ma: dict[str, tuple[float, float]], mb: dict[str, tuple[float, float]], unit: str, top: int) -> list[Change]:
    """Time per step of each name on both sides, the largest absolute changes first; then
    the call counts of those names."""
    names = sorted(set(ma) | set(mb), key=lambda n: -abs(mb.get(n, (0.0, 0.0))[0] - ma.get(n, (0.0, 0.0))[0]))
    rows = []
    for name in names[:top]:
        va, vb = ma.get(name), mb.get(name)
        rows.append(Change(name, None if va is None else va[0], None if vb is None else vb[0], unit))
    return rows


def _kernels(a: _Side, b: _Side, top: int) -> Section:
    section = Section("kernels", f"GPU kernels: time per traced step, the {top} largest changes")
    # One side without kernels still compares (a kernel that vanished is a change).
    return _named_times(section, a, b, top, lambda t: t.kernel_stats(by="name"), "total_us", need_both=False,
                        empty_note="no GPU kernels in either side's traces (CPU-only, or no profiling window)")


def _operators(a: _Side, b: _Side, top: int) -> Section:
    section = Section("operators", f"CPU operators: self time per traced step, the {top} largest changes")
    return _named_times(section, a, b, top, lambda t: t.cpu_ops(k=None), "self_us", need_both=True,
                        empty_note="needs operators in both sides' traces (a profiling window on each)")


def _named_times(section: Section, a: _Side, b: _Side, top: int, table: Callable[[Any], pd.DataFrame], value: str,
                 *, need_both: bool, empty_note: str) -> Section:
    """Fills `section` with the largest changes of `value` per traced step, by name, of the
    trace table `table` returns; `empty_note` when one side (need_both) or both lack rows."""

    def compute() -> None:
        fa, fb = table(a.traces), table(b.traces)
        empty = (not len(fa) or not len(fb)) if need_both else (not len(fa) and not len(fb))
        if empty:
            section.note = empty_note
            return
        ma, mb = _by_name(fa, value, _per_traced_step(a)), _by_name(fb, value, _per_traced_step(b))
        section.rows = _ranked_changes(ma, mb, "us/step", top)

    return _guarded(section, compute)


# (dimension, name or None for any, statistic, label, unit, scale)
_SYSTEM = (
    ("CPUUtilization", "total", "mean", "CPU utilisation", "%", 1.0),
    ("GPUUtilization", None, "mean", "GPU utilisation", "%", 1.0),
    ("GPUMemoryUsedBytes", None, "max", "GPU memory used (peak)", "MiB", 1 / 2**20),
    ("ProcessMemoryRSSBytes", None, "max", "training process RSS (peak)", "MiB", 1 / 2**20),
    ("MemoryUsedBytes", "system", "max", "host memory used (peak)", "MiB", 1 / 2**20),
)


def _system(a: _Side, b: _Side) -> Section:
    section = Section("system", "System metrics (means; memory: peaks)")

    def compute() -> None:
        if a.trial is None or b.trial is None:
            section.note = "needs a job on both sides (traces carry no system metrics)"
            return
        fa, fb = a.trial.profiler.system_metrics(), b.trial.profiler.system_metrics()
        for dimension, name, stat, label, unit, scale in _SYSTEM:
            va, vb = _metric(fa, dimension, name, stat), _metric(fb, dimension, name, stat)
            if va is not None or vb is not None:
                section.rows.append(Change(label, None if va is None else va * scale, None if vb is None else vb * scale, unit))
        if not section.rows:
            section.note = "no system metrics saved on either side"

    return _guarded(section, compute)


def _metric(frame: pd.DataFrame, dimension: str, name: str | None, stat: str) -> float | None:
    rows = frame[frame["dimension"] == dimension]
    if name is not None:
        rows = rows[rows["name"] == name]
    if not len(rows):
        return None
    if stat == "max":  # peak of the sum over devices at one time (two GPUs' memory add up)
        return float(rows.groupby("timestamp")["value"].sum().max())
    return float(rows["value"].mean())


def _rules(a: _Side, b: _Side, rules: str) -> Section:
    section = Section("rules", "Rule verdicts")

    def compute() -> None:
        if a.trial is None or b.trial is None or rules == "none":
            section.note = "needs a job on both sides" if rules != "none" else "not asked for (--rules none)"
            return
        va, vb = _verdicts(a.trial, rules), _verdicts(b.trial, rules)
        if not va and not vb:
            section.note = "no rule results on either side (run `stepscope check` on each, or --rules run)"
            return
        order = {"fired": 0, "error": 1}
        for rule in sorted(set(va) | set(vb), key=lambda r: (order.get(vb.get(r, ""), 2), r)):
            section.rows.append(Change(rule, va.get(rule), vb.get(rule)))

    return _guarded(section, compute)


def _verdicts(trial: Any, rules: str) -> dict[str, str]:
    from .report.findings import run_default_rules, saved_findings

    findings = saved_findings(trial.store) if rules in ("auto", "saved") else None
    if findings is None and rules in ("auto", "run"):
        findings = run_default_rules(trial)
    return {f.rule: f.status for f in findings or []}


def _tensors(a: _Side, b: _Side, top: int) -> Section:
    section = Section("tensors", f"Saved tensors: L2 norm at the last TRAIN step both saved, the {top} largest relative changes")

    def compute() -> None:
        if a.trial is None or b.trial is None:
            section.note = "needs a job on both sides"
            return
        names = sorted(set(a.trial.tensor_names()) & set(b.trial.tensor_names()))
        if not names:
            section.note = "no tensor saved under the same name on both sides"
            return
        changes = []
        for name in names:
            ta, tb = a.trial.tensor(name), b.trial.tensor(name)
            common = sorted(set(ta.steps(mode=ModeKeys.TRAIN)) & set(tb.steps(mode=ModeKeys.TRAIN)))
            if not common:
                continue
            step = common[-1]
            va, vb = ta.value(step, mode=ModeKeys.TRAIN), tb.value(step, mode=ModeKeys.TRAIN)
            na, nb = _norm(va), _norm(vb)
            key = f"{name} @ TRAIN step {step}" + ("" if va.shape == vb.shape else f" (shape {va.shape} vs {vb.shape})")
            changes.append(Change(key, na, nb))
        if not changes:
            section.note = "no TRAIN step saved on both sides for the same tensor"
            return
        changes.sort(key=_relative_change, reverse=True)
        section.rows = changes[:top]

    return _guarded(section, compute)


def _norm(value: np.ndarray) -> float:
    import numpy as np

    return float(np.linalg.norm(np.asarray(value, dtype=np.float64).ravel()))


def _relative_change(change: Change) -> float:
    a, b = change.a, change.b
    if not isinstance(a, float) or not isinstance(b, float):
        return math.inf
    if not (math.isfinite(a) and math.isfinite(b)):
        return math.inf  # a NaN or inf on one side is the largest change there is
    largest = max(abs(a), abs(b))
    return 0.0 if largest == 0 else abs(b - a) / largest


# --- the whole comparison ---------------------------------------------------------------

SECTIONS = ("steps", "phases", "kernels", "operators", "system", "rules", "tensors")


def compare(a: Any, b: Any, *, top: int = 15, rules: str = "auto", sections: Iterable[str] = SECTIONS,
            names: tuple[str, str] | None = None) -> JobDiff:
    """Compare A (the baseline) with B. `a`/`b`: a job (folder or s3:// URL, or an open
    Trial) or traces (a folder of them or one trace file); `names`: how to call them in the
    result (default: the paths). `rules`: saved (rule-output/ of each job), run (the
    default rules now), auto (saved where there are, else run), none."""
    wanted = list(sections)
    unknown = [s for s in wanted if s not in SECTIONS]
    if unknown:
        raise ValueError(f"unknown section(s) {', '.join(unknown)}; known: {', '.join(SECTIONS)}")
    if top < 1:
        raise ValueError(f"top must be at least 1, got {top}")
    sa, sb = _Side(a), _Side(b)
    builders: dict[str, Callable[[], Section]] = {
        "steps": lambda: _steps(sa, sb),
        "phases": lambda: _phases(sa, sb),
        "kernels": lambda: _kernels(sa, sb, top),
        "operators": lambda: _operators(sa, sb, top),
        "system": lambda: _system(sa, sb),
        "rules": lambda: _rules(sa, sb, rules),
        "tensors": lambda: _tensors(sa, sb, top),
    }
    name_a, name_b = names or (str(getattr(a, "path", a)), str(getattr(b, "path", b)))
    return JobDiff(name_a, name_b, [builders[name]() for name in wanted])


def _count(values: pd.Series | None) -> float | None:
    return None if values is None else float(len(values))


def _q(values: pd.Series | None, q: float) -> float | None:
    return None if values is None or not len(values) else float(values.quantile(q))


# --- text -------------------------------------------------------------------------------


def format_text(diff: JobDiff, *, show_same: bool = False) -> str:
    """The comparison as aligned text, one block per section; rows whose values are within
    SAME_WITHIN of each other are left out unless `show_same` (their count is said)."""
    lines = [f"A: {diff.a}", f"B: {diff.b}", ""]
    for section in diff.sections:
        lines.append(f"== {section.title}")
        rows = section.rows if show_same else [r for r in section.rows if r.status != "same"]
        if section.note:
            lines.append(f"   {section.note}")
        if rows:
            width = min(max(len(r.key) for r in rows), 60)
            lines.append(f"   {'':{width}}  {'A':>12}  {'B':>12}  {'B/A':>7}  unit")
            for row in rows:
                ratio = f"{row.ratio:.2f}x" if row.ratio is not None else row.status
                lines.append(f"   {_clip(row.key, width):{width}}  {_cell(row.a):>12}  {_cell(row.b):>12}  {ratio:>7}  {row.unit}")
        hidden = len(section.rows) - len(rows)
        if hidden:
            lines.append(f"   ({hidden} more unchanged, within {SAME_WITHIN:.0%}: --all shows them)")
        if not section.rows and not section.note:
            lines.append("   nothing to compare")
        lines.append("")
    return "\n".join(lines).rstrip() + "\n"


def _clip(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"


def _cell(value: float | str | None) -> str:
    if value is None:
        return "-"
    if isinstance(value, str):
        return value
    if value != 0 and (abs(value) >= 1e6 or abs(value) < 1e-3):
        return f"{value:.3g}"
    return f"{value:.4g}" if abs(value) < 1000 else f"{value:,.0f}"  # four significant digits, whole numbers above


# --- the command ------------------------------------------------------------------------


def add_parser(sub: Any) -> None:
    from .cli_common import add_command

    parser = add_command(
        sub, "diff", _run,
        summary="compare two jobs or two traces: what got slower, what changed",
        description=(
            "Compare B with A (the baseline): step time and phases, GPU kernels and CPU operators per traced step "
            "(new, vanished, largest changes), system utilisation and memory peaks, rule verdicts, saved tensors' "
            "norms at the last TRAIN step both saved. A and B are jobs (folders or s3:// URLs) or traces (a folder "
            "of them, e.g. torch.profiler's tensorboard_trace_handler output, or one trace file); with traces only "
            f"the trace sections compare. Values within {SAME_WITHIN:.0%} of each other are hidden unless --all. "
            "Exit status: 0, or 1 when --fail-if-slower or --fail-on-new-findings finds a regression; 2 bad usage or unreadable data."
        ),
    )
    parser.add_argument("a", metavar="A", help="the baseline job or traces")
    parser.add_argument("b", metavar="B", help="the job or traces to compare with it")
    parser.add_argument("--top", type=int, default=15, help="rows of kernels, operators and tensors (largest changes first; default 15)")
    parser.add_argument("--sections", default=",".join(SECTIONS), help=f"comma-separated, of {','.join(SECTIONS)} (default all)")
    parser.add_argument("--rules", choices=("auto", "saved", "run", "none"), default="auto",
                        help="rule verdicts: saved (rule-output/), run (the default rules, now), auto (saved if any, else run), none")
    parser.add_argument("--all", action="store_true", help="also show the figures that did not change")
    parser.add_argument("--json", action="store_true", help="print the comparison as JSON")
    parser.add_argument("--fail-if-slower", type=float, metavar="PCT",
                        help="exit 1 when B's median TRAIN step is more than PCT percent slower than A's")
    parser.add_argument("--fail-on-new-findings", action="store_true", help="exit 1 when a rule finds an issue in B that it did not find in A")


def _run(args: Any) -> int:
    import json

    from .cli_common import EXIT_FIRED, EXIT_OK, UsageError

    if args.fail_if_slower is not None and not (math.isfinite(args.fail_if_slower) and args.fail_if_slower >= 0):
        raise UsageError(f"--fail-if-slower must be a percentage >= 0, got {args.fail_if_slower}")
    try:
        diff = compare(args.a, args.b, top=args.top, rules=args.rules, sections=[s.strip() for s in args.sections.split(",") if s.strip()])
    except ValueError as exc:
        raise UsageError(str(exc)) from exc
    print(json.dumps(diff.to_json(), indent=1) if args.json else format_text(diff, show_same=args.all), end="" if not args.json else "\n")
    regressions = regressions_of(diff, slower_pct=args.fail_if_slower, new_findings=args.fail_on_new_findings)
    for line in regressions:
        print(f"regression: {line}", file=sys.stderr)
    return EXIT_FIRED if regressions else EXIT_OK


def regressions_of(diff: JobDiff, *, slower_pct: float | None = None, new_findings: bool = False) -> list[str]:
    """What a CI gate fails on: B's median TRAIN step slower than A's by more than
    `slower_pct` percent; a rule that finds an issue in B and did not in A."""
    found = []
    if slower_pct is not None and any(s.name == "steps" for s in diff.sections):
        for row in diff.section("steps").rows:
            if row.key in ("TRAIN median step", "median traced step") and row.ratio is not None and row.ratio > 1 + slower_pct / 100:
                found.append(f"{row.key} {row.a:.3f} -> {row.b:.3f} ms ({100 * (row.ratio - 1):.1f}% slower; limit {slower_pct:g}%)")
    if new_findings and any(s.name == "rules" for s in diff.sections):
        for row in diff.section("rules").rows:
            if row.b == "fired" and row.a != "fired":
                found.append(f"{row.key}: {row.a or 'not run'} -> fired")
    return found
