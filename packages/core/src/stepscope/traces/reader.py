"""Streaming reader of Kineto / Chrome-trace JSON (plain or gzip, local or any Store) into
one columnar event table (see schema.py), in bounded memory.

How it stays fast without a Python object per event: the bytes are read in chunks; in
each chunk numpy finds the commas that separate top-level events (`}` `,` whitespace `{`)
and overwrites them with newlines in place, which turns the array into newline-delimited
JSON that pyarrow's C++ parser reads straight into columns. Anything this trick gets
wrong (a separator inside a string, nested arrays of objects, an odd value type) makes
pyarrow raise, and that chunk alone is parsed again by a slow, exact event-by-event path,
so the result never depends on the trick being right."""

from __future__ import annotations

import json
import logging
import os
import queue
import re
import threading
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pj

from ..exceptions import CorruptRecord
from ..store import Store
from .schema import CATEGORY_KIND, EVENT_SCHEMA, KIND_CODE, MISSING, STEP_NAME_RE, SYNC_CALLS

logger = logging.getLogger("stepscope.traces")

CHUNK_BYTES = 32 << 20
_GZIP_MAGIC = b"\x1f\x8b"

_ARGS_TYPE = pa.struct(
    [
        ("External id", pa.int64()),
        ("correlation", pa.int64()),
        ("device", pa.int64()),
        ("stream", pa.int64()),
        ("bytes", pa.int64()),
        ("Bytes", pa.int64()),
        ("Total Allocated", pa.int64()),
        ("Device Id", pa.int64()),
    ]
)
# What pyarrow reads of each event; everything else is skipped by its C++ parser.
_RAW_SCHEMA = pa.schema(
    [
        ("ph", pa.string()),
        ("cat", pa.string()),
        ("name", pa.string()),
        ("pid", pa.int64()),
        ("tid", pa.int64()),
        ("ts", pa.float64()),
        ("dur", pa.float64()),
        ("args", _ARGS_TYPE),
    ]
)
_READ_OPTIONS = pj.ReadOptions(block_size=4 << 20, use_threads=True)
# After the separators become newlines, newlines inside events must not count as
# boundaries: JSON strings cannot hold a raw newline, so turning every other newline into a
# space (done in _separators) lets pyarrow split blocks at newlines, its fast mode.
_PARSE_OPTIONS = pj.ParseOptions(explicit_schema=_RAW_SCHEMA, unexpected_field_behavior="ignore", newlines_in_values=False)
_TRACE_EVENTS_RE = re.compile(rb'"traceEvents"\s*:\s*\[')
_WS = np.zeros(256, dtype=bool)
_WS[[9, 10, 13, 32]] = True


@dataclass
class RawTrace:
    """One parsed trace: its events (EVENT_SCHEMA) and the top-level metadata."""

    table: pa.Table
    metadata: dict[str, Any] = field(default_factory=dict)
    base_ns: int = 0
    source: str = ""
    slow_chunks: int = 0  # chunks the exact fallback parser had to read (0 for Kineto's own files)


def read_trace(
    source: str | os.PathLike[str] | bytes,
    store: Store | None = None,
    *,
    chunk_bytes: int = CHUNK_BYTES,
    progress: Callable[[int, int | None], None] | None = None,
    size: int | None = None,
) -> RawTrace:
    """Parse one trace file: a key in `store`, a local path, or the bytes themselves.
    `progress(bytes_read, total_or_None)` is called after every chunk (`size`: the stored
    size when the caller knows it)."""
    if isinstance(source, bytes):
        where = "<bytes>"
    else:
        where = store.describe(os.fspath(source)) if store is not None else os.fspath(source)
    chunks = _prefetched(_byte_chunks(source, store, chunk_bytes, size))
    try:
        return _Parser(where, chunk_bytes, progress).run(chunks)
    except zlib.error as exc:
        raise CorruptRecord(where, None, f"bad gzip data ({exc})") from None
    finally:
        chunks.close()


# --- bytes in ---------------------------------------------------------------------------


def _byte_chunks(source: Any, store: Store | None, chunk_bytes: int, size: int | None = None) -> Iterator[tuple[bytes, int, int | None]]:
    """(decompressed bytes, compressed bytes read so far, compressed total or None)."""
    if isinstance(source, bytes):
        raw: Iterator[bytes] = iter([source])
        total: int | None = len(source)
    elif store is not None:
        key = os.fspath(source)
        raw = _store_ranges(store, key, chunk_bytes)
        total = size
    else:
        path = os.fspath(source)
        total = os.path.getsize(path)
        raw = _file_chunks(path, chunk_bytes)
    done = 0
    decompressor = None
    first = True
    for piece in raw:
        done += len(piece)
        if first:
            first = False
            if piece[:2] == _GZIP_MAGIC:
                decompressor = zlib.decompressobj(wbits=31)
        if decompressor is None:
            yield piece, done, total
            continue
        # Decompress in bounded pieces so that a highly compressed chunk cannot blow up memory.
        data = decompressor.decompress(piece, chunk_bytes)
        while True:
            yield data, done, total
            if not decompressor.unconsumed_tail:
                break
            data = decompressor.decompress(decompressor.unconsumed_tail, chunk_bytes)
        if decompressor.eof and decompressor.unused_data:
            # A second gzip member (concatenated files are valid gzip).
            rest = decompressor.unused_data
            decompressor = zlib.decompressobj(wbits=31)
            yield decompressor.decompress(rest), done, total
    if decompressor is not None:
        tail = decompressor.flush()
        if tail:
            yield tail, done, total


class _prefetched:
    """Reads (and decompresses) the next chunk in a thread while the current one is parsed:
    file reads, S3 GETs and zlib release the GIL, so I/O and gunzip overlap the parsing.
    At most two chunks wait, which bounds the memory."""

    _END = object()

    def __init__(self, chunks: Iterator[tuple[bytes, int, int | None]]):
        self._queue: queue.Queue[Any] = queue.Queue(maxsize=2)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._fill, args=(chunks,), name="stepscope-trace-read", daemon=True)
        self._thread.start()

    def _fill(self, chunks: Iterator[tuple[bytes, int, int | None]]) -> None:
        try:
            for item in chunks:
                while not self._stop.is_set():
                    try:
                        self._queue.put(item, timeout=0.1)
                        break
                    except queue.Full:
                        continue
                if self._stop.is_set():
                    return
            self._queue.put(self._END)
        except BaseException as exc:  # handed to the parsing thread, which raises it
            self._queue.put(exc)

    def __iter__(self) -> _prefetched:
        return self

    def __next__(self) -> tuple[bytes, int, int | None]:
        item = self._queue.get()
        if item is self._END:
            raise StopIteration
        if isinstance(item, BaseException):
            raise item
        return item

    def close(self) -> None:
        self._stop.set()
        while self._thread.is_alive():
            try:
                self._queue.get(timeout=0.05)
            except queue.Empty:
                pass
        self._thread.join()


def _file_chunks(path: str, chunk_bytes: int) -> Iterator[bytes]:
    with open(path, "rb") as handle:
        while True:
            piece = handle.read(chunk_bytes)
            if not piece:
                return
            yield piece


def _store_ranges(store: Store, key: str, chunk_bytes: int) -> Iterator[bytes]:
    start = 0
    while True:
        piece = store.read_range(key, start, chunk_bytes)
        if piece:
            yield piece
        if len(piece) < chunk_bytes:
            return
        start += len(piece)


# --- parsing ----------------------------------------------------------------------------


class _Parser:
    def __init__(self, where: str, chunk_bytes: int, progress: Callable[[int, int | None], None] | None):
        self.where = where
        self.chunk_bytes = chunk_bytes
        self.progress = progress
        self.metadata: dict[str, Any] = {}
        self.columns: dict[str, list[np.ndarray]] = {name: [] for name in EVENT_SCHEMA.names if name != "name"}
        self.name_codes: list[np.ndarray] = []
        self.names: dict[str, int] = {}
        self.slow_chunks = 0
        self.offset = 0  # bytes of decompressed text consumed before the buffer

    def run(self, chunks: Iterator[tuple[bytes, int, int | None]]) -> RawTrace:
        buffer = bytearray()
        in_array = False
        done, total = 0, None
        for data, done, total in chunks:
            buffer += data
            if not in_array:
                start = self._find_array(buffer)
                if start is None:
                    continue
                self.offset += start
                del buffer[:start]
                in_array = True
            if len(buffer) >= self.chunk_bytes:
                cut = self._parse_complete_events(buffer)
                self.offset += cut
                del buffer[:cut]
            if self.progress is not None:
                self.progress(done, total)
        if self.progress is not None:
            self.progress(done, done)  # the end: the bar completes even when the size was unknown
        if not in_array:
            start = self._find_array(buffer)
            if start is None:
                raise CorruptRecord(self.where, None, "no traceEvents array: not a Chrome/Kineto trace")
            del buffer[:start]
        self._parse_last(buffer)
        return self._finish()

    def _find_array(self, buffer: bytearray) -> int | None:
        """Where the events start (just after `[`); reads the metadata before them."""
        head = bytes(buffer[:64])
        stripped = head.lstrip()
        if stripped.startswith(b"["):  # the bare-array form of Chrome traces
            return len(head) - len(stripped) + 1
        match = _TRACE_EVENTS_RE.search(buffer)
        if match is None:
            if len(buffer) > (64 << 20):  # metadata is small: this is not a trace
                raise CorruptRecord(self.where, None, "no traceEvents array in the first 64 MB: not a Chrome/Kineto trace")
            return None
        prefix = bytes(buffer[: match.start()]).rstrip().rstrip(b",")
        try:
            meta = orjson.loads(prefix + b"}") if prefix.strip() != b"{" else {}
            if isinstance(meta, dict):
                self.metadata.update(meta)
        except orjson.JSONDecodeError:
            logger.warning("%s: the metadata before traceEvents is not JSON; ignored", self.where)
        return match.end()

    def _parse_complete_events(self, buffer: bytearray) -> int:
        """Parse the events of `buffer` up to its last separator; returns how many bytes were used."""
        view = np.frombuffer(buffer, dtype=np.uint8)
        separators = _separators(view)
        if separators.size == 0:
            if len(buffer) > 4 * self.chunk_bytes:
                # Not a layout the fast path knows: parse exactly, one event at a time.
                return self._slow(buffer, final=False)
            return 0
        cut = int(separators[-1])
        self._fast(buffer, cut, view, separators[:-1])
        del view
        return cut + 1

    def _parse_last(self, buffer: bytearray) -> None:
        view = np.frombuffer(buffer, dtype=np.uint8)
        separators = _separators(view)
        last_start = int(separators[-1]) + 1 if separators.size else 0
        end = _object_end(buffer, last_start)
        if end is None:
            rest = bytes(buffer[last_start:]).strip()
            if rest.startswith(b"]") or not rest:
                end = last_start  # an empty array, or a trailing comma before `]`
            else:
                raise CorruptRecord(self.where, self.offset + last_start, "trace ends inside an event (truncated file?)")
        close = bytes(buffer[end:]).lstrip()
        if close.startswith(b"]"):
            tail = close[1:].strip().rstrip(b"}").strip()
            if tail.startswith(b","):
                try:
                    meta = orjson.loads(b"{" + tail[1:] + b"}")
                    if isinstance(meta, dict):
                        self.metadata.update(meta)
                except orjson.JSONDecodeError:
                    logger.warning("%s: the metadata after traceEvents is not JSON; ignored", self.where)
        elif close:
            raise CorruptRecord(self.where, self.offset + end, "expected ']' after the last event")
        # else: an unterminated array (a job killed mid-write); Chrome accepts it too.
        if end > 0:
            self._fast(buffer, end, view, separators)
        del view

    def _fast(self, buffer: bytearray, end: int, view: np.ndarray, separators: np.ndarray) -> None:
        renamed: list[tuple[int, bytes]] = []
        table = None
        for attempt in range(2):
            region = memoryview(buffer)[:end]
            try:
                table = pj.read_json(pa.BufferReader(pa.py_buffer(region)), read_options=_READ_OPTIONS, parse_options=_PARSE_OPTIONS)
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
                logger.debug("%s: fast parse failed near byte %d (%s)", self.where, self.offset, exc)
                region.release()
                if attempt == 0 and ("/pid" in str(exc) or "/tid" in str(exc)):
                    # Kineto's few string pids/tids ("Spans"): rename those keys and retry;
                    # searching every chunk for them up front would cost a pass over the bytes.
                    renamed = _rename_string_ids(buffer, end)
                    if renamed:
                        continue
                break
            region.release()
            break
        if table is None:
            view[separators] = ord(",")  # undo the trick, then read this chunk exactly
            for position, original in renamed:
                buffer[position : position + len(original)] = original
            self._slow(buffer, final=True, end=end)
            return
        self._add(table)

    def _slow(self, buffer: bytearray, final: bool, end: int | None = None) -> int:
        """Exact parse, one event at a time (json.raw_decode); returns bytes used."""
        self.slow_chunks += 1
        text = bytes(buffer[: end if end is not None else len(buffer)]).decode("utf-8", errors="replace")
        decoder = json.JSONDecoder(strict=False)
        rows: list[dict[str, Any]] = []
        position, used = 0, 0
        length = len(text)
        while True:
            while position < length and text[position] in " \t\r\n,":
                position += 1
            if position >= length:
                used = len(text.encode())
                break
            try:
                event, next_position = decoder.raw_decode(text, position)
            except json.JSONDecodeError as exc:
                if not final:
                    used = len(text[:position].encode())
                    break
                raise CorruptRecord(self.where, self.offset + exc.pos, f"not a JSON trace event ({exc.msg})") from None
            if isinstance(event, dict):
                rows.append(event)
            position = next_position
        self._add(_rows_to_table(rows))
        return used

    def _add(self, table: pa.Table) -> None:
        if table.num_rows == 0:
            return
        ph = table.column("ph")
        keep = pc.is_in(ph, value_set=pa.array(["X", "i", "I"]))
        cat = table.column("cat")
        kind_index = pc.index_in(cat, value_set=_CATEGORY_VALUES)
        keep = pc.and_(pc.fill_null(keep, False), pc.is_valid(kind_index))
        table = table.filter(keep)
        if table.num_rows == 0:
            return
        kind = _CATEGORY_CODES[pc.index_in(table.column("cat"), value_set=_CATEGORY_VALUES).to_numpy(zero_copy_only=False)]
        names = table.column("name").combine_chunks()
        encoded = pc.dictionary_encode(pc.fill_null(names, ""))
        chunk_names = encoded.dictionary.to_pylist()
        remap = np.fromiter((self.names.setdefault(n, len(self.names)) for n in chunk_names), dtype=np.int32, count=len(chunk_names))
        codes = remap[encoded.indices.to_numpy(zero_copy_only=False)]
        # Instant events are only kept when they are allocator records.
        is_memory = kind == KIND_CODE["memory"]
        if is_memory.any():
            memory_code = self.names.get("[memory]", -2)
            kind_keep = ~is_memory | (codes == memory_code)
            if not kind_keep.all():
                table = table.filter(pa.array(kind_keep))
                kind, codes = kind[kind_keep], codes[kind_keep]
        if table.num_rows == 0:
            return
        sync_codes = np.array([self.names[n] for n in SYNC_CALLS if n in self.names], dtype=np.int32)
        if sync_codes.size:
            kind = np.where((kind == KIND_CODE["runtime"]) & np.isin(codes, sync_codes), np.int8(KIND_CODE["sync"]), kind)
        args = table.column("args").combine_chunks()
        columns = self.columns
        columns["kind"].append(kind.astype(np.int8))
        self.name_codes.append(codes)
        columns["ts_ns"].append(_micros_to_ns(table.column("ts")))
        columns["dur_ns"].append(np.maximum(_micros_to_ns(table.column("dur")), 0))
        columns["pid"].append(_ints(table.column("pid")))
        columns["tid"].append(_ints(table.column("tid")))
        columns["correlation"].append(_ints(_field(args, "correlation")))
        columns["external_id"].append(_ints(_field(args, "External id")))
        device = _ints(_field(args, "device"))
        device_id = _ints(_field(args, "Device Id"))
        columns["device"].append(np.where(device == MISSING, device_id, device).astype(np.int32))
        columns["stream"].append(_ints(_field(args, "stream")).astype(np.int32))
        transfer = _ints(_field(args, "bytes"))
        allocator = _ints(_field(args, "Bytes"))
        columns["bytes"].append(np.where(transfer == MISSING, allocator, transfer))
        columns["total_allocated"].append(_ints(_field(args, "Total Allocated")))
        columns["step"].append(np.full(len(kind), MISSING, dtype=np.int32))

    def _finish(self) -> RawTrace:
        base_ns = _base_ns(self.metadata)
        arrays: dict[str, np.ndarray] = {}
        for name, parts in self.columns.items():
            dtype = EVENT_SCHEMA.field(name).type.to_pandas_dtype()
            arrays[name] = np.concatenate(parts).astype(dtype, copy=False) if parts else np.zeros(0, dtype=dtype)
            parts.clear()
        codes = np.concatenate(self.name_codes) if self.name_codes else np.zeros(0, dtype=np.int32)
        self.name_codes.clear()
        dictionary = np.array(list(self.names), dtype=object)
        if base_ns:
            arrays["ts_ns"] += base_ns
        _assign_steps(arrays, dictionary, codes)
        # Rows sorted by kind (stable: file order within a kind), so that selecting a kind
        # is a slice for the analyses and a row range in Parquet. Column by column, so that
        # only one column is ever held twice.
        order = np.argsort(arrays["kind"], kind="stable")
        for name in list(arrays):
            arrays[name] = arrays[name][order]
        codes = codes[order]
        del order
        table = _to_table(arrays, codes, dictionary)
        return RawTrace(table, self.metadata, base_ns, self.where, self.slow_chunks)


_CATEGORY_VALUES = pa.array(list(CATEGORY_KIND))
_CATEGORY_CODES = np.array([KIND_CODE[CATEGORY_KIND[c]] for c in CATEGORY_KIND], dtype=np.int8)


def _separators(view: np.ndarray) -> np.ndarray:
    """Positions of the commas between top-level events, overwritten with newlines."""
    if view.size < 3:
        return np.zeros(0, dtype=np.int64)
    closes = np.flatnonzero(view[:-2] == 125)  # '}'
    commas = closes + 1
    commas = commas[view[commas] == 44]  # ','
    after = commas + 1
    limit = view.size - 1
    for _ in range(32):  # skip up to 32 whitespace bytes (Kineto indents with 2)
        white = _WS[view[after]]
        if not white.any():
            break
        after = np.minimum(after + white, limit)
    separators = commas[view[after] == 123]  # '{'
    view[view == 10] = 32
    view[separators] = 10
    return separators


def _rename_string_ids(buffer: bytearray, end: int) -> list[tuple[int, bytes]]:
    """Kineto writes string pids/tids for a few bookkeeping events ("Spans", "Traces"):
    rename those keys in place (same length) so that the integer columns keep their type."""
    renamed = []
    for pattern in (b'id": "', b'id":"'):  # one pass per spacing covers both keys
        position = buffer.find(pattern, 0, end)
        while position != -1:
            key_start = position - 2
            if key_start >= 0 and buffer[key_start] == 34 and buffer[key_start + 1] in (112, 116):  # '"p' or '"t'
                original = bytes(buffer[key_start : key_start + 4])
                buffer[key_start + 3] = 115  # "pid" -> "pis", "tid" -> "tis"
                renamed.append((key_start, original))
            position = buffer.find(pattern, position + len(pattern), end)
    return renamed


def _object_end(buffer: bytearray, start: int) -> int | None:
    """End (exclusive) of the JSON object starting at or after `start`, or None."""
    position = start
    length = len(buffer)
    while position < length and buffer[position] in b" \t\r\n":
        position += 1
    if position >= length or buffer[position] != 123:
        return None
    depth, in_string, escaped = 0, False, False
    for index in range(position, length):
        byte = buffer[index]
        if in_string:
            if escaped:
                escaped = False
            elif byte == 92:
                escaped = True
            elif byte == 34:
                in_string = False
        elif byte == 34:
            in_string = True
        elif byte in (123, 91):
            depth += 1
        elif byte in (125, 93):
            depth -= 1
            if depth == 0:
                return index + 1
    return None


def _micros_to_ns(column: pa.ChunkedArray) -> np.ndarray:
    values = column.to_numpy()
    out = np.rint(np.nan_to_num(values.astype(np.float64), nan=0.0) * 1000.0)
    return out.astype(np.int64)


def _ints(column: pa.Array | pa.ChunkedArray) -> np.ndarray:
    return pc.fill_null(column, MISSING).to_numpy(zero_copy_only=False).astype(np.int64, copy=False)


def _field(args: pa.Array, name: str) -> pa.Array:
    if isinstance(args, pa.ChunkedArray):
        args = args.combine_chunks()
    values = args.field(name)
    if args.null_count:
        values = pc.if_else(args.is_valid(), values, pa.nulls(len(values), values.type))
    return values


def _base_ns(metadata: dict[str, Any]) -> int:
    base = metadata.get("baseTimeNanoseconds")
    try:
        return int(base) if base is not None else 0
    except (TypeError, ValueError):
        return 0


def _assign_steps(arrays: dict[str, np.ndarray], dictionary: np.ndarray, codes: np.ndarray) -> None:
    """Each event's step: host events by the ProfilerStep#N interval holding their start,
    GPU events by the step of the runtime call that launched them (HTA does the same)."""
    step_numbers = np.full(len(dictionary), MISSING, dtype=np.int64)
    for code, name in enumerate(dictionary):
        match = STEP_NAME_RE.match(name)
        if match:
            step_numbers[code] = int(match.group(1))
    kind, ts, dur = arrays["kind"], arrays["ts_ns"], arrays["dur_ns"]
    host_kinds = np.isin(kind, [KIND_CODE[k] for k in ("annotation", "cpu_op")])
    is_step = host_kinds & (step_numbers[codes] != MISSING) if codes.size else np.zeros(0, dtype=bool)
    if not is_step.any():
        return
    starts, ends, numbers = ts[is_step], ts[is_step] + dur[is_step], step_numbers[codes[is_step]]
    order = np.argsort(starts, kind="stable")
    starts, ends, numbers = starts[order], ends[order], numbers[order]
    gpu = np.isin(kind, [KIND_CODE[k] for k in ("kernel", "memcpy", "memset", "gpu_annotation")]) | (
        (kind == KIND_CODE["sync"]) & (arrays["stream"] != MISSING)
    )
    slot = np.searchsorted(starts, ts, side="right") - 1
    inside = (slot >= 0) & (ts < ends[np.maximum(slot, 0)])
    step = np.where(inside & ~gpu, numbers[np.maximum(slot, 0)], MISSING)
    # GPU side: the launching runtime call's step, else the interval holding the start.
    correlation = arrays["correlation"]
    launches = (kind == KIND_CODE["runtime"]) & (correlation != MISSING)
    if launches.any():
        launch_corr = correlation[launches]
        launch_step = step[launches]
        order = np.argsort(launch_corr, kind="stable")
        launch_corr, launch_step = launch_corr[order], launch_step[order]
        position = np.searchsorted(launch_corr, correlation)
        position = np.minimum(position, launch_corr.size - 1)
        found = gpu & (correlation != MISSING) & (launch_corr[position] == correlation)
        step = np.where(found, launch_step[position], np.where(gpu & inside, numbers[np.maximum(slot, 0)], step))
    else:
        step = np.where(gpu & inside, numbers[np.maximum(slot, 0)], step)
    arrays["step"] = step.astype(np.int32)


def _to_table(arrays: dict[str, np.ndarray], codes: np.ndarray, dictionary: np.ndarray) -> pa.Table:
    names = pa.DictionaryArray.from_arrays(pa.array(codes, type=pa.int32()), pa.array(dictionary, type=pa.string()))
    columns = [names if name == "name" else pa.array(arrays[name], type=EVENT_SCHEMA.field(name).type) for name in EVENT_SCHEMA.names]
    return pa.Table.from_arrays(columns, schema=EVENT_SCHEMA)


def _rows_to_table(rows: list[dict[str, Any]]) -> pa.Table:
    """The slow path's events in the fast path's raw schema (bad values become nulls)."""

    def number(value: Any, kind: type) -> Any:
        if isinstance(value, bool) or value is None:
            return None
        try:
            return kind(value)
        except (TypeError, ValueError):
            return None

    columns: dict[str, list[Any]] = {name: [] for name in _RAW_SCHEMA.names}
    for row in rows:
        for key in ("ph", "cat", "name"):
            value = row.get(key)
            columns[key].append(value if isinstance(value, str) else None)
        for key in ("pid", "tid"):
            columns[key].append(number(row.get(key), int))
        for key in ("ts", "dur"):
            columns[key].append(number(row.get(key), float))
        args = row.get("args")
        args = args if isinstance(args, dict) else {}
        columns["args"].append({f.name: number(args.get(f.name), int) for f in _ARGS_TYPE})
    return pa.Table.from_pydict(columns, schema=_RAW_SCHEMA)

