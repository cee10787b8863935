"""Per-rank summaries of the detailed traces: a few rows per profiled step (time by GPU
activity class, launch-delay quantiles, memcpy bytes, syncs, idle time by cause) and per
(step, kernel), written as hive-partitioned Parquet next to the trace tables, and a job
manifest naming what exists. Cross-rank questions (rank comparison, stragglers,
`stepscope sql`) read these and never the events: their memory is O(summary size), a few
kilobytes per rank and step.

Layout, beside the trace tables (the job, or the user's cache for a read-only folder):

    stepscope-summaries/manifest.json                     which traces are summarised, and where
    stepscope-summaries/steps/rank=<R>/<id>.parquet       one row per (trace, step)
    stepscope-summaries/kernels/rank=<R>/<id>.parquet     one row per (trace, step, kernel)
    stepscope-summaries/compact/<table>-<digest>.parquet  every rank's rows in one file

`<id>` is a digest of the trace's key. Traces are immutable once published, so a summary
that the manifest lists is current; the manifest saves listing (and on S3 opening) the
2 x ranks summary files: a later analysis reads the manifest and, when nothing is new,
the one compacted file per table. Schemas and columns: docs/traces.md ("Summaries")."""

from __future__ import annotations

import hashlib
import io
import json
import logging
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from ..layout import TRACE_SUMMARY_DIR
from ..store import Store
from .analyzers import idle, launches
from .analyzers.common import of_kind, union_ns
from .analyzers.steps import profiler_steps
from .analyzers.syncs import sync_events
from .schema import BEFORE_FIRST_STEP, KIND_CODE, precision_class

logger = logging.getLogger("stepscope.traces")

SUMMARY_DIR = TRACE_SUMMARY_DIR
MANIFEST_KEY = f"{SUMMARY_DIR}/manifest.json"
SUMMARY_VERSION = 1
_MAX_MANIFEST_BYTES = 256 << 20

STEPS_SCHEMA = pa.schema(
    [
        ("rank", pa.int32()),
        ("trace", pa.string()),  # the trace's key: one profiling window of the rank
        ("step", pa.int32()),  # -2: GPU work launched before the trace's first step
        ("step_ns", pa.int64()),  # null for the before-first-step row
        ("kernel_ns", pa.int64()),
        ("compute_kernel_ns", pa.int64()),  # kernels other than collectives
        ("comm_kernel_ns", pa.int64()),  # collective-communication kernels (NCCL, RCCL)
        ("memcpy_ns", pa.int64()),
        ("memset_ns", pa.int64()),
        ("gpu_busy_ns", pa.int64()),  # union of kernels, memcpy, memset
        ("gpu_idle_ns", pa.int64()),  # step_ns - gpu_busy_ns (0 when negative)
        ("idle_host_wait_ns", pa.int64()),  # gaps between a stream's activities, by cause, summed over streams
        ("idle_kernel_wait_ns", pa.int64()),
        ("idle_other_ns", pa.int64()),
        ("kernels", pa.int64()),
        ("launches", pa.int64()),  # kernels whose launch call is in the trace
        ("launch_delay_p50_ns", pa.float64()),
        ("launch_delay_p95_ns", pa.float64()),
        ("launch_delay_max_ns", pa.int64()),
        ("memcpy_bytes", pa.int64()),
        ("memset_bytes", pa.int64()),
        ("syncs", pa.int64()),  # host synchronize calls
        ("sync_ns", pa.int64()),
        ("sync_gpu_wait_ns", pa.int64()),
    ]
)
KERNELS_SCHEMA = pa.schema(
    [
        ("rank", pa.int32()),
        ("trace", pa.string()),
        ("step", pa.int32()),
        ("name", pa.string()),
        ("class", pa.string()),  # communication, or the precision: fp8, int8, bf16, fp16, tf32, fp32, unknown
        ("count", pa.int64()),
        ("total_ns", pa.int64()),
        ("max_ns", pa.int64()),
    ]
)
SCHEMAS = {"steps": STEPS_SCHEMA, "kernels": KERNELS_SCHEMA}


def trace_id(key: str) -> str:
    """The summary files' name for a trace key (stable, short, path-safe)."""
    return hashlib.sha1(key.encode()).hexdigest()[:20]


def summary_key(table: str, rank: int, key: str) -> str:
    return f"{SUMMARY_DIR}/{table}/rank={rank}/{trace_id(key)}.parquet"


# --- computing a trace's summary ---------------------------------------------------------


def summarize(events: pd.DataFrame, rank: int, key: str) -> dict[str, pa.Table]:
    """The summary tables of one trace's events (one rank, one window)."""
    steps = profiler_steps(events)
    gpu = of_kind(events, "kernel", "memcpy", "memset")
    kind = gpu["kind"].to_numpy()
    gstep = gpu["step"].to_numpy()
    dur = gpu["dur_ns"].to_numpy()
    start = gpu["ts_ns"].to_numpy()
    names = gpu["name"].astype("category") if len(gpu) else pd.Series([], dtype="category")
    categories = [str(c) for c in names.cat.categories]
    classes = np.asarray([precision_class(c) for c in categories], dtype=object)
    codes = names.cat.codes.to_numpy()
    is_kernel = kind == KIND_CODE["kernel"]
    comm = np.zeros(len(gpu), dtype=bool)
    if len(gpu) and classes.size:
        comm = is_kernel & (classes[codes] == "communication")
    byte_counts = np.maximum(gpu["bytes"].to_numpy(), 0) if len(gpu) else np.zeros(0, dtype=np.int64)

    numbers = [int(s) for s in steps["step"].to_numpy()]
    step_ns = dict(zip(numbers, (int(d) for d in steps["dur_ns"].to_numpy())))
    wanted = numbers + ([BEFORE_FIRST_STEP] if (gstep == BEFORE_FIRST_STEP).any() else [])

    idle_steps = idle.idle_breakdown(events, per_step=True)
    idle_by = {c: idle_steps.groupby("step")[f"{c}_us"].sum() if len(idle_steps) else pd.Series(dtype=float) for c in ("host_wait", "kernel_wait", "other")}
    launched = launches.launches(events)
    launched = launched[launched["kind"].to_numpy() == KIND_CODE["kernel"]]
    delays = {int(s): g["delay_ns"].to_numpy() for s, g in launched.groupby("step", sort=False)}
    syncs = sync_events(events)
    sync_groups = {int(s): g for s, g in syncs.groupby("step", sort=False)} if len(syncs) else {}

    rows: dict[str, list[Any]] = {name: [] for name in STEPS_SCHEMA.names}
    for number in wanted:
        here = gstep == number
        k = here & is_kernel
        mc = here & (kind == KIND_CODE["memcpy"])
        ms = here & (kind == KIND_CODE["memset"])
        busy = union_ns(start[here], start[here] + dur[here]) if here.any() else 0
        total = step_ns.get(number)
        delay = delays.get(number, np.zeros(0, dtype=np.int64))
        sync = sync_groups.get(number)
        values = {
            "rank": rank,
            "trace": key,
            "step": number,
            "step_ns": total,
            "kernel_ns": int(dur[k].sum()),
            "compute_kernel_ns": int(dur[k & ~comm].sum()),
            "comm_kernel_ns": int(dur[k & comm].sum()),
            "memcpy_ns": int(dur[mc].sum()),
            "memset_ns": int(dur[ms].sum()),
            "gpu_busy_ns": int(busy),
            "gpu_idle_ns": max(0, total - int(busy)) if total is not None else None,
            "idle_host_wait_ns": _ns(idle_by["host_wait"].get(number, 0.0)),
            "idle_kernel_wait_ns": _ns(idle_by["kernel_wait"].get(number, 0.0)),
            "idle_other_ns": _ns(idle_by["other"].get(number, 0.0)),
            "kernels": int(k.sum()),
            "launches": int(delay.size),
            "launch_delay_p50_ns": float(np.percentile(delay, 50)) if delay.size else None,
            "launch_delay_p95_ns": float(np.percentile(delay, 95)) if delay.size else None,
            "launch_delay_max_ns": int(delay.max()) if delay.size else None,
            "memcpy_bytes": int(byte_counts[mc].sum()),
            "memset_bytes": int(byte_counts[ms].sum()),
            "syncs": 0 if sync is None else len(sync),
            "sync_ns": 0 if sync is None else int(sync["dur_ns"].sum()),
            "sync_gpu_wait_ns": 0 if sync is None else int(sync["gpu_wait_ns"].sum()),
        }
        for name, value in values.items():
            rows[name].append(value)
    steps_table = pa.Table.from_pydict(rows, schema=STEPS_SCHEMA)

    kernel_rows = gpu[is_kernel]
    if len(kernel_rows):
        grouped = (
            pd.DataFrame({"step": gstep[is_kernel], "code": codes[is_kernel], "dur": dur[is_kernel]})
            .groupby(["step", "code"], sort=True)["dur"]
            .agg(["size", "sum", "max"])
            .reset_index()
        )
        code = grouped["code"].to_numpy()
        kernels_table = pa.Table.from_pydict(
            {
                "rank": np.full(len(grouped), rank, dtype=np.int32),
                "trace": [key] * len(grouped),
                "step": grouped["step"].to_numpy().astype(np.int32),
                "name": np.asarray(categories, dtype=object)[code],
                "class": classes[code],
                "count": grouped["size"].to_numpy().astype(np.int64),
                "total_ns": grouped["sum"].to_numpy().astype(np.int64),
                "max_ns": grouped["max"].to_numpy().astype(np.int64),
            },
            schema=KERNELS_SCHEMA,
        )
    else:
        kernels_table = KERNELS_SCHEMA.empty_table()
    return {"steps": steps_table, "kernels": kernels_table}


def _ns(micros: float) -> int:
    return int(round(float(micros) * 1000))


# --- writing and reading -----------------------------------------------------------------


def _parquet_bytes(table: pa.Table) -> memoryview:
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink, compression="zstd")
    return memoryview(sink.getvalue())


def write_summary(store: Store, key: str, rank: int, tables: dict[str, pa.Table], events: int) -> dict[str, Any]:
    """Write one trace's summary files; returns its manifest entry."""
    files = {}
    for name, table in tables.items():
        target = summary_key(name, rank, key)
        store.write(target, [_parquet_bytes(table)])
        files[name] = target
    return {"rank": rank, "events": events, "files": files, "rows": {name: t.num_rows for name, t in tables.items()}}


@dataclass
class Manifest:
    """What is summarised: trace key -> {rank, events, files, rows}; and the compacted
    files (one per table) with the digest of the keys they cover."""

    entries: dict[str, dict[str, Any]] = field(default_factory=dict)
    compact: dict[str, Any] = field(default_factory=dict)

    def covered(self) -> str:
        return hashlib.sha1("\n".join(sorted(self.entries)).encode()).hexdigest()[:20]

    def to_json(self) -> bytes:
        return json.dumps({"version": SUMMARY_VERSION, "entries": self.entries, "compact": self.compact}, sort_keys=True).encode()


def read_manifest(store: Store) -> Manifest:
    """The job's summary manifest (empty when there is none, or of another version, or
    unreadable: the summaries are then rebuilt, never trusted half-read)."""
    try:
        raw = store.read(MANIFEST_KEY, max_size=_MAX_MANIFEST_BYTES)
    except FileNotFoundError:
        return Manifest()
    except OSError as exc:
        logger.warning("%s: unreadable (%s); summaries are rebuilt", store.describe(MANIFEST_KEY), exc)
        return Manifest()
    try:
        body = json.loads(raw)
        if not isinstance(body, dict) or body.get("version") != SUMMARY_VERSION:
            return Manifest()
        entries, compact = body.get("entries"), body.get("compact")
        if not isinstance(entries, dict) or not isinstance(compact, dict):
            raise ValueError("entries and compact must be objects")
        for key, entry in entries.items():
            if not isinstance(entry, dict) or type(entry.get("rank")) is not int or not isinstance(entry.get("files"), dict):
                raise ValueError(f"entry {key!r} is not a summary entry")
        return Manifest(entries, compact)
    except ValueError as exc:
        logger.warning("%s: not a summary manifest (%s); summaries are rebuilt", store.describe(MANIFEST_KEY), exc)
        return Manifest()


def write_manifest(store: Store, manifest: Manifest) -> None:
    store.write(MANIFEST_KEY, manifest.to_json())


def _read_parquet(store: Store, key: str, schema: pa.Schema) -> pa.Table:
    table = pq.read_table(io.BytesIO(store.read(key)))
    if not table.schema.remove_metadata().equals(schema):
        raise ValueError(f"{store.describe(key)}: columns {table.schema.names} are not those of a stepscope summary")
    return table


def load_tables(store: Store, manifest: Manifest, keys: Iterable[str] | None = None) -> dict[str, pa.Table]:
    """Every summary table of the manifest's traces (or of `keys`), each as one Arrow
    table: from the compacted files when they cover exactly these traces, else from the
    per-rank files (and a unreadable file is skipped with a warning)."""
    wanted = sorted(manifest.entries if keys is None else (k for k in keys if k in manifest.entries))
    if len(wanted) == len(manifest.entries) and manifest.compact.get("covers") == manifest.covered():
        try:
            return {name: _read_parquet(store, manifest.compact["files"][name], schema) for name, schema in SCHEMAS.items()}
        except (OSError, KeyError, ValueError, pa.ArrowException) as exc:
            logger.warning("compacted summaries unreadable (%s); reading the per-rank files", exc)
    out: dict[str, list[pa.Table]] = {name: [] for name in SCHEMAS}
    for key in wanted:
        entry = manifest.entries[key]
        for name, schema in SCHEMAS.items():
            target = entry["files"].get(name)
            if not isinstance(target, str):
                continue
            try:
                out[name].append(_read_parquet(store, target, schema))
            except (OSError, ValueError, pa.ArrowException) as exc:
                logger.warning("summary %s unreadable (%s); skipped", store.describe(target), exc)
    return {name: pa.concat_tables(parts) if parts else SCHEMAS[name].empty_table() for name, parts in out.items()}


def compact(store: Store, manifest: Manifest, fresh: dict[str, dict[str, pa.Table]] | None = None) -> None:
    """Write every rank's rows of each table into one file, so that a later analysis of an
    unchanged job reads one object per table instead of two per trace. `fresh`: tables
    just made (trace key -> table name -> table), used instead of reading their files."""
    fresh = fresh or {}
    # The earlier traces from the previous compaction when it covers exactly them (two
    # reads), else from their files.
    tables = load_tables(store, Manifest({k: v for k, v in manifest.entries.items() if k not in fresh}, dict(manifest.compact)))
    for name in SCHEMAS:
        made = [parts[name] for parts in fresh.values() if name in parts]
        if made:
            tables[name] = pa.concat_tables([tables[name], *made])
    digest = manifest.covered()
    files = {}
    for name, table in tables.items():
        target = f"{SUMMARY_DIR}/compact/{name}-{digest}.parquet"
        store.write(target, [_parquet_bytes(table.sort_by([("step", "ascending"), ("rank", "ascending")]))])
        files[name] = target
    old = manifest.compact.get("files") if isinstance(manifest.compact.get("files"), dict) else {}
    manifest.compact = {"covers": digest, "files": files}
    for name, target in (old or {}).items():  # the previous compaction is superseded
        if isinstance(target, str) and target != files.get(name) and target.startswith(f"{SUMMARY_DIR}/compact/"):
            try:
                store.delete(target)
            except OSError:
                pass
