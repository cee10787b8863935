"""The raw parse of many traces fanned out: each task parses one trace (or reads its table),
writes its event table and its summary to the store, and hands back only the summary's
manifest entry, so the process that drives it holds O(summary) memory whatever the number
of ranks. Engines: `local` (worker processes on this machine, one per core by default) and
`ray` (tasks on a Ray cluster; `pip install 'stepscope[ray]'`). See docs/traces.md
("Thousands of ranks")."""

from __future__ import annotations

import logging
import multiprocessing
import os
import sys
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass
from typing import Any

from ..exceptions import ConfigError, StepscopeError
from ..store import Store, open_store
from . import sources, summaries
from .tables import list_trace_keys, load_trace, loose_trace_keys

logger = logging.getLogger("stepscope.traces")

ENGINES = ("local", "ray")
LOCAL_PROCESS_MIN_TASKS = 8
Progress = Callable[[int, int], None]


@dataclass(frozen=True)
class Task:
    """One trace to summarise; only URLs and keys, so it pickles to any worker."""

    store_url: str
    tables_url: str
    key: str
    default_rank: int


@dataclass
class BuildResult:
    """What a build did: traces summarised now, already summarised, and unreadable ones
    (key -> why)."""

    summarised: int
    reused: int
    problems: dict[str, str]
    seconds: float


def cpu_count() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


Result = tuple[str, dict[str, Any] | None, str | None, dict[str, Any] | None]


def summarise_one(task: Task) -> Result:
    """Parse (or read the table of) one trace, write its table and summary; returns
    (key, manifest entry or None, problem or None, the summary tables): the tables come
    back too (kilobytes), so that compacting them does not read every summary file again.
    Runs in a worker."""
    try:
        store = open_store(task.store_url)
        tables = store if task.tables_url == task.store_url else open_store(task.tables_url)
        info, events = load_trace(store, task.key, persist=True, tables=tables, default_rank=task.default_rank)
        tables_out = summaries.summarize(events, info.rank, task.key)
        del events
        return task.key, summaries.write_summary(tables, task.key, info.rank, tables_out, info.events), None, tables_out
    except (StepscopeError, OSError, ValueError, MemoryError, RecursionError) as exc:
        return task.key, None, str(exc), None
    except Exception as exc:  # pyarrow's errors, a reader's bug on hostile input: named, never fatal to the job
        return task.key, None, f"{type(exc).__name__}: {exc}", None


def _store_url(store: Store) -> str:
    # What a worker process reopens (open_store); a store held in memory has no such URL,
    # and its own url then names it in the worker's error.
    return store.reopenable_url() or store.url


def build(
    store: Store,
    keys: Iterable[str] | None = None,
    *,
    engine: str = "local",
    workers: int | None = None,
    progress: Progress | None = None,
) -> tuple[summaries.Manifest, Store, BuildResult]:
    """Summarise every trace of `store` that the manifest does not list yet, on `engine`;
    returns the updated manifest, the store holding the summaries, and what was done."""
    if engine not in ENGINES:
        raise ConfigError(f"engine must be one of {', '.join(ENGINES)}, got {engine!r}")
    if workers is not None and (isinstance(workers, bool) or not isinstance(workers, int) or workers < 1):
        raise ConfigError(f"workers must be an integer >= 1, got {workers!r}")
    started = time.monotonic()
    keys = sorted(keys) if keys is not None else (list_trace_keys(store) or loose_trace_keys(store))
    tables = sources.table_store(store)
    manifest = summaries.read_manifest(tables)
    todo = [key for key in keys if key not in manifest.entries]
    ranks = sources.worker_ranks(keys)
    store_url, tables_url = _store_url(store), _store_url(tables)
    tasks = [Task(store_url, tables_url, key, ranks.get(key, 0)) for key in todo]
    problems: dict[str, str] = {}
    fresh: dict[str, dict[str, Any]] = {}
    if tasks:
        results = _run_ray(tasks, workers, progress) if engine == "ray" else _run_local(tasks, workers, progress)
        for key, entry, problem, made in results:
            if entry is not None:
                manifest.entries[key] = entry
                fresh[key] = made or {}
            else:
                problems[key] = problem or "unknown error"
                logger.warning("skipping trace %s: %s", store.describe(key), problem)
    if tasks or manifest.compact.get("covers") != manifest.covered():
        if manifest.entries:
            summaries.compact(tables, manifest, fresh)
        try:
            summaries.write_manifest(tables, manifest)
        except OSError as exc:  # a read-only job: the summaries are used this time all the same
            logger.warning("%s: could not write the summary manifest (%s)", tables.describe(summaries.MANIFEST_KEY), exc)
    result = BuildResult(len(tasks) - len(problems), len(keys) - len(tasks), problems, time.monotonic() - started)
    return manifest, tables, result


def _run_local(tasks: list[Task], workers: int | None, progress: Progress | None) -> list[Result]:
    count = min(workers or cpu_count(), len(tasks))
    results = []
    # A worker process costs its start and its imports (a second or more): a few traces
    # are summarised here, in this process, one at a time.
    if count <= 1 or len(tasks) < LOCAL_PROCESS_MIN_TASKS:
        for done, task in enumerate(tasks, 1):
            results.append(summarise_one(task))
            if progress is not None:
                progress(done, len(tasks))
        return results
    # Spawned, not forked: the parent may hold threads (a table writer, a web server), and a
    # fork copies their locks mid-use. Each worker imports pandas/pyarrow once.
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=count, mp_context=context) as pool:
        futures = [pool.submit(summarise_one, task) for task in tasks]
        for done, future in enumerate(as_completed(futures), 1):
            results.append(future.result())
            if progress is not None:
                progress(done, len(tasks))
    return results


def _run_ray(tasks: list[Task], workers: int | None, progress: Progress | None) -> list[Result]:
    try:
        import ray
    except ImportError:
        raise ConfigError("--engine ray needs Ray, which is not installed: pip install 'stepscope[ray]'") from None
    if not ray.is_initialized():
        # RAY_ADDRESS (or a cluster started with `ray start`) is joined; else a local one.
        ray.init(num_cpus=workers, include_dashboard=False, log_to_driver=False)
    remote = ray.remote(summarise_one)
    pending = [remote.remote(task) for task in tasks]
    results = []
    while pending:
        ready, pending = ray.wait(pending, num_returns=min(len(pending), 64), timeout=None)
        results.extend(ray.get(ready))
        if progress is not None:
            progress(len(results), len(tasks))
    return results


def progress_printer(label: str = "summarised") -> Progress:
    """A progress line on stderr, every 5 % (for the CLI)."""
    state = {"shown": -1}

    def show(done: int, total: int) -> None:
        step = max(1, total // 20)
        if done == total or done // step != state["shown"]:
            state["shown"] = done // step
            sys.stderr.write(f"\r{label} {done}/{total} traces")
            if done == total:
                sys.stderr.write("\n")
            sys.stderr.flush()

    return show


def summarise_loaded(analysis: Any) -> int:
    """Write the summaries of the traces a TraceAnalysis has loaded and the manifest does
    not list yet (their events are in memory already, so this costs the summary only);
    returns how many were written. A failure is logged: the analysis is the answer."""
    loaded = getattr(analysis, "_loaded", {})
    if not loaded or not analysis.persist:
        return 0
    try:
        tables = sources.table_store(analysis.store)
        manifest = summaries.read_manifest(tables)
        new = 0
        fresh: dict[str, dict[str, Any]] = {}
        for key, (info, events) in list(loaded.items()):
            if key in manifest.entries:
                continue
            made = summaries.summarize(events, info.rank, key)
            manifest.entries[key] = summaries.write_summary(tables, key, info.rank, made, info.events)
            fresh[key] = made
            new += 1
        if new:
            summaries.compact(tables, manifest, fresh)
            summaries.write_manifest(tables, manifest)
        return new
    except Exception as exc:  # a read-only job, a store error: the analysis stands without them
        logger.warning("could not write the trace summaries of %s (%s)", analysis.store.url, exc)
        return 0
