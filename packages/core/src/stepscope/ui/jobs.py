"""The jobs of a store (a local folder or an s3:// prefix holding many jobs): finding them,
checking that a job path from a URL stays inside the store, and one summary per job.

A job id is the job's path relative to the store root (`team-a/run-3`). Every id that comes
from a request goes through `job_id()` before it touches a file, so no URL reaches outside."""

from __future__ import annotations

import os
import threading
import time
import weakref
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from .. import layout
from ..exceptions import ConfigError, StepscopeError
from ..store import Store, open_store

# A folder holding any of these is a job; the walk does not look inside a job for more jobs.
_JOB_MARKERS = layout.JOB_MARKERS
# A folder of a user's own Kineto traces (torch.profiler.tensorboard_trace_handler's output)
# is a job too: the trace engine reads it (docs/traces.md). Kineto's own file names only, so
# a folder with some other JSON is not taken for one.
_TRACE_FILE_SUFFIXES = (".pt.trace.json", ".pt.trace.json.gz", ".xplane.pb")


def _is_marker(name: str) -> bool:
    return name in _JOB_MARKERS or name.endswith(_TRACE_FILE_SUFFIXES)


MAX_DEPTH = 6
RUNNING_WINDOW_S = 300.0
SUMMARY_TTL_S = 10.0


_TRIAL_LOCKS: weakref.WeakKeyDictionary[Any, threading.RLock] = weakref.WeakKeyDictionary()
_TRIAL_LOCKS_GUARD = threading.Lock()


def trial_lock(trial: Any) -> threading.RLock:
    """The lock that serialises everything done with one trial: the server answers requests
    in threads, and a Trial (refresh, lazily parsed frames) is not made for concurrent use."""
    with _TRIAL_LOCKS_GUARD:
        lock = _TRIAL_LOCKS.get(trial)
        if lock is None:
            lock = _TRIAL_LOCKS[trial] = threading.RLock()
        return lock


class JobNotFound(StepscopeError, KeyError):
    """No job by that id (or not one this user may see: the app does not tell them apart)."""

    def __str__(self) -> str:
        return "no such job"


def job_id(text: str) -> str:
    """A clean store-relative job id, or JobNotFound for anything that could leave the store:
    `..` or `.` parts, empty parts, absolute paths, backslashes, NUL, control characters."""
    if not text or len(text) > 1024 or text.startswith("/") or any(ord(c) < 32 for c in text):
        raise JobNotFound(text)
    parts = text.split("/")
    if any(p in ("", ".", "..") or "\\" in p or ":" in p for p in parts):
        raise JobNotFound(text)
    return text


@dataclass(frozen=True)
class JobSummary:
    """One row of the jobs list."""

    id: str
    status: str  # running | finished | stopped | failed (a worker's hook failed and switched itself off)
    start: float | None  # epoch seconds
    end: float | None
    framework: str | None
    workers: int
    steps: int  # steps run (the step timeline's, every mode; the saved steps where there is no timeline)
    rules_fired: tuple[str, ...]
    skipped: tuple[str, ...] = ()  # files the reader could not read and left out, each with why
    saved_steps: int = 0  # steps with saved tensors

    @property
    def duration(self) -> float | None:
        return None if self.start is None or self.end is None else max(0.0, self.end - self.start)

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id, "status": self.status, "start": self.start, "end": self.end, "duration": self.duration,
            "framework": self.framework, "workers": self.workers, "steps": self.steps, "saved_steps": self.saved_steps,
            "rules_fired": list(self.rules_fired), "skipped": list(self.skipped),
        }


class JobStore:
    """The store root the app serves; hands out one cached Trial per job."""

    def __init__(self, url: str):
        self.url = url.rstrip("/") if url.startswith("s3://") else os.path.abspath(os.path.expanduser(url))
        self.is_s3 = self.url.startswith("s3://")
        if not self.is_s3 and not os.path.isdir(self.url):
            raise ConfigError(f"store {url!r} is not a folder")
        self._root_real = "" if self.is_s3 else os.path.realpath(self.url)
        self._lock = threading.Lock()
        self._trials: dict[str, Any] = {}
        self._summaries: dict[str, tuple[float, JobSummary]] = {}
        self._generations: dict[str, int] = {}
        self._seen: dict[str, tuple[bool, int]] = {}

    def check(self) -> None:
        """ConfigError naming the store when it cannot be listed (a missing bucket, no access):
        the CLI calls it before it creates anything."""
        if not self.is_s3:
            return
        from ..store import open_store

        try:
            open_store(self.url).probe()
        except StepscopeError as exc:  # the store's error names the endpoint and the cause
            raise ConfigError(f"store {self.url!r} cannot be listed: {exc}") from None
        except Exception as exc:  # a bad URL, boto3 not configured: all mean "not this store"
            raise ConfigError(f"store {self.url!r} cannot be listed ({exc.__class__.__name__})") from None

    # --- finding jobs ------------------------------------------------------------------

    def job_ids(self) -> list[str]:
        """Every job under the root, sorted."""
        return sorted(self._walk_s3() if self.is_s3 else self._walk_local())

    def _walk_local(self) -> Iterator[str]:
        stack = [("", 0)]
        while stack:
            rel, depth = stack.pop()
            folder = os.path.join(self.url, rel)
            try:
                entries = list(os.scandir(folder))
            except OSError:
                continue
            names = {e.name for e in entries}
            if rel and any(_is_marker(n) for n in names):
                if not any(e.is_symlink() for e in entries if _is_marker(e.name)):
                    yield rel  # (one whose index/events/... are links is no job: `resolve` refuses it)
                continue
            if depth < MAX_DEPTH:
                # Symlinked folders are not followed: they could lead outside the store.
                stack += [(f"{rel}/{e.name}" if rel else e.name, depth + 1) for e in entries if e.is_dir(follow_symlinks=False) and not e.name.startswith(".")]

    def _walk_s3(self) -> Iterator[str]:
        from ..store import open_store

        root = open_store(self.url)
        stack = [("", 0)]
        while stack:
            rel, depth = stack.pop()
            listing = root.list_folder(rel)
            if rel and any(_is_marker(n) for n in (*listing.files, *listing.folders)):
                yield rel
                continue
            if depth < MAX_DEPTH:
                stack += [(f"{rel}/{n}" if rel else n, depth + 1) for n in listing.folders if not n.startswith(".")]

    # --- opening one ------------------------------------------------------------------

    def resolve(self, job: str) -> str:
        """The id of the job folder that `job` really names, which is what the app authorises
        (never the requested text): JobNotFound for an unsafe id, no job, or a path that
        passes through a symlink. S3 keys have no links; their id is the checked key itself."""
        from ..store.local import resolve_within

        job = job_id(job)
        if self.is_s3:
            return job
        try:
            # The store's path policy: every component opened with O_NOFOLLOW from the root,
            # so `team-a/link -> ../team-b/job` (or a linked parent) is refused, not followed.
            folder = resolve_within(self._root_real, job)
            parent = self._root_real
            for part in job.split("/"):
                # Each name as the folder spells it: on a case-insensitive filesystem
                # `TEAM-B/job` would otherwise reach `team-b/job` under another grant.
                if part not in os.listdir(parent):
                    raise JobNotFound(job)
                parent = os.path.join(parent, part)
            markers = [e for e in os.scandir(folder) if _is_marker(e.name)]
        except (OSError, StepscopeError):
            raise JobNotFound(job) from None
        # A folder whose index/, events/, ... are links is no job (the walk skips it too).
        if not markers or any(e.is_symlink() for e in markers):
            raise JobNotFound(job)
        return job

    def job_path(self, job: str) -> str:
        """Where the job lies (a folder or an s3:// URL): error messages name files relative to it."""
        return f"{self.url}/{job}" if self.is_s3 else os.path.join(self._root_real, *job.split("/"))

    def open(self, job: str) -> Store:
        """The store of one job; JobNotFound when the id is unsafe, names no job, or passes
        through a symlink (see `resolve`)."""
        job = self.resolve(job)
        if self.is_s3:
            store = open_store(f"{self.url}/{job}")
            if not store.list("", start_after=None)[:1]:
                raise JobNotFound(job)
            return store
        return open_store(self.job_path(job))

    def trial(self, job: str, refresh: bool = True) -> Any:
        """The job's Trial, opened once and refreshed on later calls (a running job grows)."""
        from ..trial import create_trial

        job = job_id(job)
        with self._lock:
            trial = self._trials.get(job)
        if trial is None:
            trial = create_trial(self.open(job), name=job)
            seen = (trial.is_complete(), len(trial.store.list(layout.RULE_OUTPUT_DIR + "/")))
            with self._lock:
                self._trials[job] = trial
                self._seen[job] = seen
                self._generations[job] = self._generations.get(job, 0) + 1
        elif refresh:
            with trial_lock(trial):
                rule_files = len(trial.store.list(layout.RULE_OUTPUT_DIR + "/"))
                new_data = bool(trial.refresh()) | bool(trial.profiler.refresh())
                changed = new_data or (trial.is_complete(), rule_files) != self._seen.get(job)
            with self._lock:
                self._seen[job] = (trial.is_complete(), rule_files)
                if changed:
                    self._generations[job] = self._generations.get(job, 0) + 1
        return trial

    def generation(self, job: str) -> int:
        """A number that grows whenever the job has published something new (new steps,
        timeline or metric files, rule reports, the end marker): what the pages poll and the
        computed views are cached by."""
        with self._lock:
            return self._generations.get(job, 0)

    def summary(self, job: str) -> JobSummary:
        now = time.monotonic()
        with self._lock:
            cached = self._summaries.get(job)
        if cached and now - cached[0] < SUMMARY_TTL_S:
            return cached[1]
        trial = self.trial(job)
        with trial_lock(trial):
            summary = summarize(job, trial)
        with self._lock:
            self._summaries[job] = (now, summary)
        return summary


def summarize(job: str, trial: Any) -> JobSummary:
    """Status, start, duration, framework, workers and fired rules of one job, from the trial."""
    from ..rules.output import load_summary

    profiler = trial.profiler
    timeline = profiler.step_timeline()
    start = profiler.job_start()
    span = profiler.time_range()
    ends = [span[1]] if span else []
    if len(timeline):
        ends.append(float(timeline["end_ns"].max()) / 1e9)
        first = float(timeline["start_ns"].min()) / 1e9
        start = first if start is None else min(start, first)
    end = max(ends) if ends else None
    frameworks = sorted({str(f) for f in timeline["framework"].dropna().unique() if str(f)}) if len(timeline) else []
    ranks = int(timeline["rank"].nunique()) if len(timeline) else 0
    workers = max(trial.num_workers if trial.workers() else 0, ranks, 1 if (trial.steps() or ranks) else 0)
    failed = bool(trial.failed_workers())  # a hook that switched itself off (not "degraded")
    if trial.is_complete():
        status = "finished"
    elif failed:
        status = "failed"
    elif end is not None and time.time() - end < RUNNING_WINDOW_S:
        status = "running"
    else:
        status = "stopped"
    fired = tuple(str(r.get("rule")) for r in load_summary(trial.store) if r.get("fired"))
    saved = len(trial.steps())
    steps = _steps_run(timeline) or saved
    # Named relative to the job: the viewer may see the job, not where it lies on the machine.
    folder = trial.store.describe().rstrip("/") + "/"
    skipped = tuple(p[len(folder):] if p.startswith(folder) else p for p in trial.problems[:20])
    return JobSummary(job, status, start, end, ", ".join(frameworks) or None, workers, steps, fired, skipped, saved)


def _steps_run(timeline: Any) -> int:
    """Steps the job ran, every mode: the step intervals of its busiest rank (ranks run the
    same steps; a rank that stopped early or joined late must not add or remove any)."""
    if not len(timeline):
        return 0
    steps = timeline[timeline["phase"].isin(("step", "eval_step", "predict_step"))]
    if not len(steps):
        return 0
    return int(steps.groupby(["node_id", "rank"], observed=True)[["mode", "step"]].apply(lambda f: len(f.drop_duplicates())).max())
