"""Finding a job's detailed traces, and their event tables persisted as Parquet next to
the job, so that a second analysis (and the report, the UI, DuckDB or Spark) never parses
JSON again.

A trace at `profiler-output/framework/<rest>` has its table at
`stepscope-traces/<rest>.parquet`: one file per trace (one rank, one profiling window),
every column of schema.EVENT_SCHEMA plus a constant `rank`, the trace's metadata in the
Parquet key-value metadata under `stepscope`. Traces are immutable once published, so a
table that exists is current."""

from __future__ import annotations

import io
import json
import logging
import mmap
import re
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from ..layout import (
    COLLECTIONS_DIR,
    DETAILED_FRAMEWORKS,
    EVENTS_DIR,
    FRAMEWORK_DIR,
    INDEX_DIR,
    LEGACY_TIMELINE_DIR,
    OWN_DIR_PREFIX,
    PROFILER_DIR,
    RULE_OUTPUT_DIR,
    STEP_TIMELINE_DIR,
    TRACE_TABLE_DIR,
    detailed_dir,
)
from ..store import Store
from .schema import EVENT_SCHEMA, KINDS

if TYPE_CHECKING:
    from .reader import RawTrace

logger = logging.getLogger("stepscope.traces")

TABLE_DIR = TRACE_TABLE_DIR
TABLE_VERSION = 3  # 2: exact decimal times, gpu_sync and other kinds, the category column; 3: allocator columns
DETAILED_DIRS = tuple(detailed_dir(framework) for framework in DETAILED_FRAMEWORKS)
_SKIPPED_DIRS = (f"{STEP_TIMELINE_DIR}/", f"{LEGACY_TIMELINE_DIR}/")
# A job's own top-level folders: smdebug's, and stepscope's (all named stepscope-*).
_JOB_DIRS = tuple(f"{folder.split('/')[0]}/" for folder in (EVENTS_DIR, INDEX_DIR, COLLECTIONS_DIR, PROFILER_DIR, RULE_OUTPUT_DIR)) + (OWN_DIR_PREFIX,)
_TRACE_SUFFIXES = (".json", ".json.gz", ".xplane.pb")
_MAX_RANK = 1 << 31  # ranks are stored as int32
_RANK_IN_KEY = re.compile(r"rank[_-]?(\d+)")


@dataclass
class TraceInfo:
    """One trace of the job: where it is, which rank wrote it, when it starts."""

    key: str
    rank: int
    base_ns: int
    events: int
    start_ns: int | None
    end_ns: int | None
    metadata: dict[str, Any]

    def to_row(self) -> dict[str, Any]:
        return {"key": self.key, "rank": self.rank, "events": self.events, "start_ns": self.start_ns, "end_ns": self.end_ns}


def list_trace_keys(store: Store) -> list[str]:
    """Every detailed trace of the job (Kineto JSON, plain or gzip; TF XSpace)."""
    keys = []
    for key in store.list(FRAMEWORK_DIR):
        if key.startswith(_SKIPPED_DIRS) or not key.endswith(_TRACE_SUFFIXES):
            continue
        keys.append(key)
    return sorted(keys)


def loose_trace_keys(store: Store) -> list[str]:
    """Every trace file anywhere in a folder that is not a job (a user's own traces:
    torch.profiler.tensorboard_trace_handler's output, a folder of rank files, nested).
    A job's own folders hold no such trace (its traces are `list_trace_keys`'): a job
    without detailed traces has none, rather than every index and collections file read
    as a trace and skipped with a warning."""
    return sorted(key for key in store.list("") if key.endswith(_TRACE_SUFFIXES) and not key.startswith((f"{TABLE_DIR}/", *_SKIPPED_DIRS, *_JOB_DIRS)))


def table_key(trace_key: str) -> str:
    rest = trace_key[len(FRAMEWORK_DIR) + 1 :] if trace_key.startswith(FRAMEWORK_DIR + "/") else trace_key
    return f"{TABLE_DIR}/{rest}.parquet"


def rank_of(metadata: dict[str, Any], key: str, default: int = 0) -> int:
    """The trace's rank: its distributedInfo, else `rank<N>` in its path, else `default`."""
    info = metadata.get("distributedInfo")
    rank = info.get("rank") if isinstance(info, dict) else None
    if type(rank) is int and 0 <= rank < _MAX_RANK:
        return rank
    match = _RANK_IN_KEY.search(key)  # a rank like 1e20 or -1 in a trace is not one
    return int(match.group(1)) if match and len(match.group(1)) < 10 and int(match.group(1)) < _MAX_RANK else default


def load_trace(
    store: Store,
    key: str,
    *,
    persist: bool = True,
    progress: Callable[[int, int | None], None] | None = None,
    writer: TableWriter | None = None,
    tables: Store | None = None,
    default_rank: int = 0,
) -> tuple[TraceInfo, pd.DataFrame]:
    """The events of one trace as a DataFrame: from its Parquet table when there is one,
    else parsed (and persisted when `persist`: by `writer` in the background when given,
    else before returning). `tables`: where the tables are (default: `store`, beside the
    traces); `default_rank`: the rank when neither the trace nor its path names one."""
    table_store = store if tables is None else tables
    tkey = table_key(key)
    if table_store.exists(tkey):
        try:
            return _read_table(table_store, tkey, key)
        except Exception as exc:  # a damaged table is rebuilt from its trace
            logger.warning("%s: unreadable (%s); parsing the trace again", table_store.describe(tkey), exc)
    raw = _parse(store, key, progress)
    rank = rank_of(raw.metadata, key, default_rank)
    table = raw.table.append_column("rank", pa.array(np.full(raw.table.num_rows, rank, dtype=np.int32)))
    kinds = table.column("kind").to_numpy()
    if kinds.size > 1 and not bool(np.all(kinds[1:] >= kinds[:-1])):  # the Kineto reader sorts already
        table = table.take(pa.array(np.argsort(kinds, kind="stable")))
    info = _info(key, rank, raw.base_ns, table, raw.metadata)
    if persist and writer is not None:
        writer.submit(table_store, tkey, table, info)
        return info, table.to_pandas(split_blocks=True)  # the writer still reads the table
    if persist:
        _write_logged(table_store, tkey, table, info)
    return info, _to_pandas(table)


class TableWriter:
    """Persists parsed tables in a background thread, one at a time, so the analyses that
    follow a parse do not wait for the Parquet encoding (and the two use two cores). The
    thread is not a daemon: a process does not exit before its tables are written."""

    def __init__(self) -> None:
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()  # analyses may run on several threads (the web UI)

    def submit(self, store: Store, tkey: str, table: pa.Table, info: TraceInfo) -> None:
        with self._lock:
            self._join()  # one table held for writing at a time, however many traces are parsed
            self._thread = threading.Thread(target=_write_logged, args=(store, tkey, table, info), name="stepscope-trace-persist")
            self._thread.start()

    def wait(self) -> None:
        """Block until every submitted table is written (or its failure logged)."""
        with self._lock:
            self._join()

    def _join(self) -> None:
        if self._thread is not None:
            self._thread.join()
            self._thread = None


def _write_logged(store: Store, tkey: str, table: pa.Table, info: TraceInfo) -> None:
    try:
        _write_table(store, tkey, table, info)
    except Exception as exc:  # a read-only job still gets its analysis
        logger.warning("%s: could not persist the trace table (%s)", store.describe(tkey), exc)


def _parse(store: Store, key: str, progress: Callable[[int, int | None], None] | None) -> RawTrace:
    if key.endswith(".xplane.pb"):
        from .xspace import read_xspace

        return read_xspace(store.read(key), store.describe(key))
    size = None
    from .reader import read_trace  # (imported here: a second analysis reads Parquet only)

    if progress is not None:
        size = store.size(key)
    return read_trace(key, store, progress=progress, size=size)


def _info(key: str, rank: int, base_ns: int, table: pa.Table, metadata: dict[str, Any]) -> TraceInfo:
    ts = table.column("ts_ns")
    ends = pc.add(ts, table.column("dur_ns")) if table.num_rows else None
    start = pc.min(ts).as_py() if table.num_rows else None
    end = pc.max(ends).as_py() if ends is not None else None
    small = {k: v for k, v in metadata.items() if k != "traceEvents" and len(json.dumps(v, default=str)) < 20_000}
    return TraceInfo(key, rank, base_ns, table.num_rows, start, end, small)


_DICTIONARY_COLUMNS = ["name"]


def _write_table(store: Store, tkey: str, table: pa.Table, info: TraceInfo) -> None:
    meta = {"version": TABLE_VERSION, "kinds": list(KINDS), **info.to_row(), "base_ns": info.base_ns, "metadata": info.metadata}
    table = table.replace_schema_metadata({"stepscope": json.dumps(meta, default=str)})
    sink = pa.BufferOutputStream()
    # LZ4: about as fast to read as no compression, a third of the size. Dictionary pages
    # only for the names (already dictionary-coded in Arrow): hashing the other columns
    # for a dictionary (which timestamps and ids abandon anyway) was half the write time.
    pq.write_table(table, sink, compression="lz4", row_group_size=1 << 20, use_dictionary=_DICTIONARY_COLUMNS)
    store.write(tkey, [memoryview(sink.getvalue())])  # the buffer as it is, not a copy


_TABLE_SCHEMA = EVENT_SCHEMA.append(pa.field("rank", pa.int32()))
_MAX_TABLE_META_BYTES = 1 << 20


def _read_table(store: Store, tkey: str, key: str) -> tuple[TraceInfo, pd.DataFrame]:
    """A persisted table, checked before it is used: the file is opened by the store (its
    path policy: no link to another job's table) and pyarrow reads that file object, never
    the path; the columns must be exactly the table schema's and the metadata typed, or
    the table is rebuilt from its trace (ValueError)."""
    with store.open_file(tkey) as handle:
        source: Any = handle
        fileno = getattr(handle, "fileno", None)
        if fileno is not None:
            try:  # memory-mapped: no copy of the file in memory
                source = pa.py_buffer(mmap.mmap(fileno(), 0, access=mmap.ACCESS_READ))
            except (OSError, ValueError, io.UnsupportedOperation):
                source = handle
        parquet = pq.ParquetFile(source)
        if not parquet.schema_arrow.remove_metadata().equals(_TABLE_SCHEMA):
            raise ValueError(f"columns {parquet.schema_arrow.names} are not those of a stepscope trace table")
        raw_meta = (parquet.schema_arrow.metadata or {}).get(b"stepscope")
        if raw_meta is not None and len(raw_meta) > _MAX_TABLE_META_BYTES:
            raise ValueError(f"metadata of {len(raw_meta)} bytes")
        table = parquet.read()
    meta = json.loads(raw_meta) if raw_meta else {}
    if not isinstance(meta, dict) or meta.get("version") != TABLE_VERSION:
        raise ValueError(f"table version {meta.get('version') if isinstance(meta, dict) else meta!r}, expected {TABLE_VERSION}")
    rank, base_ns = meta.get("rank", 0), meta.get("base_ns", 0)
    start, end = meta.get("start_ns"), meta.get("end_ns")
    for name, value in (("rank", rank), ("base_ns", base_ns), ("start_ns", start), ("end_ns", end)):
        if value is not None and (type(value) is not int or not -(1 << 62) <= value <= 1 << 62):
            raise ValueError(f"metadata {name} {value!r} is not an integer in range")
    if not 0 <= rank < 1 << 31:
        raise ValueError(f"rank {rank} out of range")
    extra = meta.get("metadata") or {}
    info = TraceInfo(key, rank, base_ns, table.num_rows, start, end, extra if isinstance(extra, dict) else {})
    return info, _to_pandas(table)


def _to_pandas(table: pa.Table) -> pd.DataFrame:
    return table.to_pandas(split_blocks=True, self_destruct=True)
