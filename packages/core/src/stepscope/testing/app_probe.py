"""A probe of the web app by mechanism: hostile job files of every kind the app reads, and
symlinks at every level of a store, each requested through every job endpoint. Used by the
app's tests (a fast subset) and by `bench/bench_probe_app.py` (everything, in parallel,
over a real server).

Each request is classified: `clean` (an answer that is not a 500 and shows nothing it
should not), `escape` (a user reached a job outside their grant, or a link was served as a
job), `traceback` (a 500), `hang` (no answer within the time limit)."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from .. import layout
from ..modes import ModeKeys

T0_NS = 1_700_000_000 * 10**9
DEEP = 100_000  # nesting far beyond Python's recursion limit


def write_job(job: Path, *, steps: int = 12, node: str = "algo-1") -> Path:
    """A small valid profiler job: a step timeline with phases (the real TimelineWriter),
    one minute of system metrics and the end marker."""
    from ..profiler import TimelineWriter

    job.mkdir(parents=True, exist_ok=True)
    writer = TimelineWriter(job, node_id=node, rank=0, framework="pytorch", flush_interval_s=3600)
    t = T0_NS
    for step in range(steps):
        end = t + 100_000_000
        writer.add(f"Step {step}", t, end, step=step, mode=ModeKeys.TRAIN, phase="step")
        writer.add("forward", t, t + 40_000_000, step=step, mode=ModeKeys.TRAIN, phase="forward")
        t = end + 1_000_000
    writer.close()
    lines = [json.dumps({"Type": "cpu", "Name": "total", "Dimension": "CPUUtilization", "Value": 40.0 + i, "NodeId": node,
                         "Timestamp": T0_NS / 1e9 + i}) for i in range(10)]
    _metrics_file(job, node).write_text("\n".join(lines) + "\n")
    (job / layout.END_MARKER).write_text("")
    return job


def _metrics_file(job: Path, node: str = "algo-1", minute: int = T0_NS // 10**9 // 60 * 60) -> Path:
    from ..capture.monitor import system_metrics_key

    path = job / system_metrics_key(minute, node)
    path.parent.mkdir(parents=True, exist_ok=True)
    return path


def _timeline_file(job: Path, events: str) -> None:
    from ..profiler.timeline import timeline_key

    path = job / timeline_key(T0_NS + 10**9, "algo-1", 1, 7, 0)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text('{"traceEvents": [' + events + "]}")


def _step_event(ts: str, dur: str = "1000.0", args: str = '{"step": 1, "mode": "TRAIN", "phase": "step"}') -> str:
    return f'{{"name": "Step 1", "cat": "step", "ph": "X", "ts": {ts}, "dur": {dur}, "pid": 0, "tid": 1, "args": {args}}}'


def _rules(job: Path, summary: object, reports: dict[str, str]) -> None:
    folder = job / layout.RULE_OUTPUT_DIR
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "summary.json").write_text(summary if isinstance(summary, str) else json.dumps(summary))
    for name, text in reports.items():
        (job / layout.rule_output_key(name)).write_text(text)


def _replace_with_folder(path: Path) -> None:
    path.unlink()
    path.mkdir()


def _deep(opening: str = "[", closing: str = "]") -> str:
    return opening * DEEP + closing * DEEP


# name -> what to break in a valid job
HOSTILE_FILES: dict[str, Callable[[Path], object]] = {
    "rule_output_deeply_nested": lambda job: _rules(job, {"rules": [{"rule": "StepOutlier", "fired": True}]},
                                                     {"StepOutlier": '{"details": ' + _deep() + "}"}),
    "rule_summary_deeply_nested": lambda job: _rules(job, '{"rules": ' + _deep() + "}", {}),
    "rule_summary_not_an_object": lambda job: _rules(job, "[1, 2, 3]", {}),
    "rule_summary_not_json": lambda job: _rules(job, "\x00\xff{", {}),
    "rule_output_text_violations": lambda job: _rules(job, {"rules": [{"rule": "LowGPU", "fired": True}]},
                                                       {"LowGPU": json.dumps({"violations": "many", "fired_steps": 5, "explanation": {"causes": 7}})}),
    "rule_name_with_path": lambda job: _rules(job, {"rules": [{"rule": "../../x/y", "fired": True}, {"rule": {"a": 1}, "fired": "yes"}]},
                                               {"../../x/y": json.dumps({"summary": "escaped name"})}),
    "timeline_nan_timestamps": lambda job: _timeline_file(job, _step_event("NaN", "NaN")),
    "timeline_infinite_timestamps": lambda job: _timeline_file(job, _step_event("Infinity", "-Infinity")),
    "timeline_huge_timestamps": lambda job: _timeline_file(job, _step_event("1e300", "1e300") + "," + _step_event("-1e300", "5")),
    "timeline_integer_overflow": lambda job: _timeline_file(job, _step_event("1" + "0" * 400, "1" + "0" * 400)),
    "timeline_deep_args": lambda job: _timeline_file(job, _step_event("1700000001000000", args=_deep("{\"a\": ", "}").replace("}", "1}", 1))),
    "timeline_deeply_nested": lambda job: _timeline_file(job, _deep()),
    "timeline_not_json": lambda job: _timeline_file(job, "\x00 nope"),
    "timeline_wrong_types": lambda job: _timeline_file(job, _step_event('"soon"', "[1]", '"args"') + ", 7, null"),
    "metrics_deep_line": lambda job: _metrics_file(job).write_text(_deep() + "\n"),
    "metrics_deep_object_line": lambda job: _metrics_file(job).write_text(_deep("{\"a\": ", "}").replace("}", "1}", 1) + "\n"),
    "metrics_nan_values": lambda job: _metrics_file(job).write_text(
        '{"Type": "cpu", "Name": "total", "Dimension": "CPUUtilization", "Value": NaN, "NodeId": "algo-1", "Timestamp": NaN}\n'
        '{"Type": "cpu", "Name": "total", "Dimension": "CPUUtilization", "Value": Infinity, "NodeId": "algo-1", "Timestamp": 1e300}\n'),
    "metrics_huge_timestamp": lambda job: _metrics_file(job).write_text(
        '{"Type": "cpu", "Name": "total", "Dimension": "CPUUtilization", "Value": 5, "NodeId": "algo-1", "Timestamp": 1e300}\n'),
    "metrics_wrong_types": lambda job: _metrics_file(job).write_text('{"Timestamp": "soon", "Name": 5, "Value": [1]}\nnot json\n[]\n7\n'),
    "end_marker_is_a_folder": lambda job: _replace_with_folder(job / layout.END_MARKER),
}


def build_hostile_store(root: Path, cases: list[str] | None = None) -> dict[str, str]:
    """Under `root`: `good/job` (valid), `team-a/<case>` for each hostile-file case, and
    `team-b/secret` (another team's job). Returns {case: job id}."""
    write_job(root / "good" / "job")
    write_job(root / "team-b" / "secret")
    ids = {}
    for name in cases or list(HOSTILE_FILES):
        job = write_job(root / "team-a" / name)
        HOSTILE_FILES[name](job)
        ids[name] = f"team-a/{name}"
    return ids


def plant_links(root: Path) -> dict[str, str]:
    """Symlinks at every level that would lend team-a's grant to team-b's job, or reach
    outside the store. Returns {case: the id a team-a user would request}."""
    secret = root / "team-b" / "secret"
    outside = root.parent / f"{root.name}-outside"
    write_job(outside / "job")
    links: dict[str, str] = {}

    def link(case: str, path: Path, target: Path | str, requested: str) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        os.symlink(target, path)
        links[case] = requested

    link("job_folder_to_other_team", root / "team-a" / "link", Path("..") / "team-b" / "secret", "team-a/link")
    link("job_folder_absolute", root / "team-a" / "abs", secret, "team-a/abs")
    link("job_folder_outside_store", root / "team-a" / "out", outside / "job", "team-a/out")
    link("parent_folder_to_other_team", root / "team-a" / "via", Path("..") / "team-b", "team-a/via/secret")
    link("prefix_folder_itself", root / "team-a-mirror", Path("team-b"), "team-a-mirror/secret")
    for marker in ("profiler-output", layout.END_MARKER):
        job = root / "team-a" / f"marker-{marker}"
        job.mkdir(parents=True)
        link(f"marker_{marker}", job / marker, secret / marker, f"team-a/marker-{marker}")
    deep = root / "team-a" / "deep" / "a" / "b"
    link("deep_component", deep / "c", Path("..") / ".." / ".." / ".." / "team-b", "team-a/deep/a/b/c/secret")
    return links


ENDPOINTS = (
    "/api/jobs/{job}/summary", "/api/jobs/{job}/version", "/api/jobs/{job}/dashboard", "/api/jobs/{job}/rules",
    "/api/jobs/{job}/health", "/api/jobs/{job}/tensor-histograms?tensor=x", "/api/jobs/{job}/stats",
    "/api/jobs/{job}/stats/steps?sort=step", "/api/jobs/{job}/stats/steps.csv", "/api/jobs/{job}/timeline",
    "/api/jobs/{job}/timeline?start=0&end=4e18&width=400", "/api/jobs/{job}/timeline/event?lane=x&i=0",
    "/api/jobs/{job}/perfetto", "/api/jobs/{job}/ranks", "/api/jobs/{job}/timeline?start=0&end=1e30", "/jobs/{job}",
)


@dataclass
class Tally:
    """What a probe found; `problems` names each non-clean case."""

    tried: int = 0
    clean: int = 0
    escapes: int = 0
    tracebacks: int = 0
    hangs: int = 0
    problems: list[str] = field(default_factory=list)

    def add(self, case: str, url: str, verdict: str) -> None:
        self.tried += 1
        if verdict == "clean":
            self.clean += 1
            return
        setattr(self, {"escape": "escapes", "traceback": "tracebacks", "hang": "hangs"}[verdict],
                getattr(self, {"escape": "escapes", "traceback": "tracebacks", "hang": "hangs"}[verdict]) + 1)
        self.problems.append(f"{verdict}: {case} {url}")

    def line(self) -> str:
        return f"cases tried {self.tried} / clean {self.clean} / escapes {self.escapes} / tracebacks (500s) {self.tracebacks} / hangs {self.hangs}"


def verdict_hostile(status: int | None, body: bytes) -> str:
    """A hostile job the user may see: anything but a 500 (or no answer) is clean, provided
    it shows nothing of team-b's secret job."""
    if status is None:
        return "hang"
    from .hostile_jobs import CANARY

    if b"team-b" in body or b"secret" in body or CANARY in body:
        return "escape"
    return "traceback" if status >= 500 and status != 503 else "clean"  # 503: busy, not broken


def verdict_link(status: int | None, body: bytes) -> str:
    """A symlinked path: it must answer exactly as a job that does not exist."""
    if status is None:
        return "hang"
    if status >= 500:
        return "traceback"
    return "clean" if status == 404 else "escape"


__all__ = ["HOSTILE_FILES", "ENDPOINTS", "Tally", "build_hostile_store", "plant_links", "verdict_hostile", "verdict_link", "write_job"]
