"""Streaming reader of Kineto / Chrome-trace JSON (plain or gzip, local or any Store) into
one columnar event table (see schema.py), in bounded memory.

How it stays fast without a Python object per event: a reader thread reads the text in
chunks; the main thread cuts each chunk at event boundaries and hands it to one of two
worker threads, which overwrite the commas between top-level events with newlines in
place (numpy finds them), turning the chunk into newline-delimited JSON that pyarrow's
C++ parser reads straight into columns. Both release the GIL, so two chunks parse at
once. Anything this trick gets wrong (a separator inside a string, nested arrays of
objects, an odd value type) makes pyarrow raise, and that chunk alone is parsed again by
a slow, exact event-by-event path, so the result never depends on the trick being right.
docs/traces.md ("How traces are read") has the whole design."""

from __future__ import annotations

import ctypes
import decimal
import json
import logging
import os
import queue
import re
import sys
import threading
import zlib
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pj

from ..exceptions import CorruptRecord
from ..store import Store
from . import native
from .schema import BEFORE_FIRST_STEP, CATEGORY_KIND, EVENT_SCHEMA, KIND_CODE, KINDS, MISSING, STEP_NAME_RE, SYNC_CALLS

logger = logging.getLogger("stepscope.traces")

CHUNK_BYTES = 16 << 20
_GZIP_MAGIC = b"\x1f\x8b"

_MICROS = pa.decimal128(38, 3)
# The integer args the engine reads (the C parser reads the same: native.ARG_INTS).
_ARGS_TYPE = pa.struct([(name, pa.int64()) for name in native.ARG_INTS])
# What pyarrow reads of each event; everything else is skipped by its C++ parser.
_RAW_SCHEMA = pa.schema(
    [
        ("ph", pa.string()),
        ("cat", pa.string()),
        ("name", pa.string()),
        ("pid", pa.int64()),
        ("tid", pa.int64()),
        # Decimal microseconds read as decimals with three places: the unscaled integer is
        # exactly the nanoseconds (a float64 of epoch µs x 1000 is off by up to 128 ns). A
        # value with more places fails the fast parse and goes to the exact slow path.
        ("ts", _MICROS),
        ("dur", _MICROS),
        ("args", _ARGS_TYPE),
    ]
)
# The two parse workers keep two cores busy; with more cores pyarrow also splits each
# chunk into blocks on its own thread pool (see _read_options).
_CORES = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
_THREADED_READ = pj.ReadOptions(block_size=4 << 20, use_threads=True)
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
    native_chunks: int = 0  # chunks the compiled parser read (native.py; 0 where it is not built)


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
    except _Inflated as exc:
        raise CorruptRecord(where, None, str(exc)) from None
    finally:
        chunks.close()


# --- bytes in ---------------------------------------------------------------------------


def _byte_chunks(source: Any, store: Store | None, chunk_bytes: int, size: int | None = None) -> Iterator[tuple[bytearray, int, int | None]]:
    """(decompressed text, compressed bytes read so far, compressed total or None). The text
    comes as a bytearray of its own, which the parser overwrites in place (no copy)."""
    if isinstance(source, bytes):
        view = memoryview(source)
        raw: Iterator[bytes | bytearray | memoryview] = (view[at : at + chunk_bytes] for at in range(0, len(source), chunk_bytes))
        total: int | None = len(source)
    elif store is not None:
        key = os.fspath(source)
        raw = _store_ranges(store, key, chunk_bytes)
        total = size
    else:
        path = os.fspath(source)
        total = os.path.getsize(path)
        raw = _file_chunks(path, chunk_bytes)
    done = inflated = 0
    decompressor = None
    first = True
    for piece in raw:
        done += len(piece)
        if first:
            first = False
            if bytes(piece[:2]) == _GZIP_MAGIC:
                decompressor = zlib.decompressobj(wbits=31)
        if decompressor is None:
            yield (piece if isinstance(piece, bytearray) else bytearray(piece)), done, total
            continue
        # Decompress in bounded pieces so that a highly compressed chunk cannot blow up memory.
        data = decompressor.decompress(piece, chunk_bytes)
        while True:
            inflated += len(data)
            if inflated > MAX_INFLATED_MIN and inflated > MAX_INFLATION * done:
                raise _Inflated(f"decompresses to more than {MAX_INFLATION} times its size (over {inflated >> 20} MiB from {done >> 10} KiB): refused as a decompression bomb")
            yield bytearray(data), done, total
            if not decompressor.unconsumed_tail:
                break
            data = decompressor.decompress(decompressor.unconsumed_tail, chunk_bytes)
        if decompressor.eof and decompressor.unused_data:
            # A second gzip member (concatenated files are valid gzip).
            rest = decompressor.unused_data
            decompressor = zlib.decompressobj(wbits=31)
            yield bytearray(decompressor.decompress(rest)), done, total
    if decompressor is not None:
        tail = decompressor.flush()
        if tail:
            yield bytearray(tail), done, total


# Kineto's JSON compresses about 10:1 (8-11 in our traces); 100:1 past 64 MiB is not a
# trace but a decompression bomb (2 MB of gzip holding 2 GiB of spaces).
MAX_INFLATION = 100
MAX_INFLATED_MIN = 64 << 20


class _Inflated(ValueError):
    pass


class _prefetched:
    """Reads (and decompresses) the next chunk in a thread while the current one is parsed:
    file reads, S3 GETs and zlib release the GIL, so I/O and gunzip overlap the parsing.
    One chunk waits (and one is being read), which bounds the memory."""

    _END = object()

    def __init__(self, chunks: Iterator[tuple[bytearray, int, int | None]]):
        self._queue: queue.Queue[Any] = queue.Queue(maxsize=1)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._fill, args=(chunks,), name="stepscope-trace-read", daemon=True)
        self._thread.start()

    def _fill(self, chunks: Iterator[tuple[bytearray, int, int | None]]) -> None:
        try:
            for item in chunks:
                while not self._stop.is_set():
                    try:
                        self._queue.put(item, timeout=0.1)
                        break
                    except queue.Full:
                        continue
                del item  # the parser owns it now
                if self._stop.is_set():
                    return
            self._queue.put(self._END)
        except BaseException as exc:  # handed to the parsing thread, which raises it
            self._queue.put(exc)

    def __iter__(self) -> _prefetched:
        return self

    def __next__(self) -> tuple[bytearray, int, int | None]:
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


def _file_chunks(path: str, chunk_bytes: int) -> Iterator[bytearray]:
    with open(path, "rb", buffering=0) as handle:
        while True:
            piece = bytearray(chunk_bytes)
            got = handle.readinto(piece)
            if not got:
                return
            if got < chunk_bytes:
                del piece[got:]
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


@dataclass
class _Chunk:
    """One chunk's events as numpy columns, sorted by kind (`bounds[k]:bounds[k + 1]` are
    the rows of kind k), names coded against the chunk's own list."""

    columns: dict[str, np.ndarray]
    codes: np.ndarray
    names: list[str]
    bounds: np.ndarray
    slow: int = 0
    category_codes: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int32))
    categories: list[str] = field(default_factory=list)
    native: int = 0


class _Parser:
    """Cuts the text at event boundaries (a few `rfind`s per chunk, no copy of the chunk)
    and hands each chunk to one of two worker threads, which do all the per-byte work
    (marking separators, pyarrow's parse, the columns). numpy and pyarrow's C++ release
    the GIL for nearly all of it, so two chunks parse at once on two cores; the results
    are merged in file order. Two chunks in flight bound the memory: each holds its bytes
    and its table until merged."""

    def __init__(self, where: str, chunk_bytes: int, progress: Callable[[int, int | None], None] | None):
        self.where = where
        self.chunk_bytes = chunk_bytes
        self.progress = progress
        self.metadata: dict[str, Any] = {}
        self.parts: list[_Chunk] = []
        self.names: dict[str, int] = {}
        self.categories: dict[str, int] = {}
        self.slow_chunks = 0
        self.native_chunks = 0
        self.offset = 0  # position in the decompressed text of the carried-over bytes
        self._pool: ThreadPoolExecutor | None = None
        self._pending: deque[Future[list[_Chunk]]] = deque()

    def run(self, chunks: Iterator[tuple[bytearray, int, int | None]]) -> RawTrace:
        self._pool = ThreadPoolExecutor(max_workers=PARSE_WORKERS, thread_name_prefix="stepscope-trace-parse")
        try:
            with _small_pages():
                return self._run(chunks)
        finally:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pending.clear()

    def _run(self, chunks: Iterator[tuple[bytearray, int, int | None]]) -> RawTrace:
        carry = bytearray()  # the start of an event whose end is in the next chunk
        in_array = False
        done, total = 0, None
        for piece, done, total in chunks:
            if not in_array:
                carry += piece
                del piece
                start = self._find_array(carry)
                if start is None:
                    continue
                self.offset += start
                del carry[:start]
                in_array = True
                piece, carry = carry, bytearray()
            carry = self._take(carry, piece)
            del piece
            if self.progress is not None:
                self.progress(done, total)
        if not in_array:
            start = self._find_array(carry)
            if start is None:
                raise CorruptRecord(self.where, None, "no traceEvents array: not a Chrome/Kineto trace")
            del carry[:start]
        self._submit_last(carry)
        self._wait_all()
        if self.progress is not None:
            self.progress(done, done)  # the end: the bar completes even when the size was unknown
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

    def _take(self, carry: bytearray, piece: bytearray) -> bytearray:
        """Send the whole events of carry + piece to the workers; returns the new carry.
        The bulk of the piece goes as it is; only the event that straddles the previous
        cut (the carry and the piece's head) is copied."""
        piece_offset = self.offset + len(carry)
        first = _first_separator(piece)
        if first is None and not piece.strip() and not carry.strip():
            # Whitespace between events, a chunk of it: skipped at C speed, never carried
            # (2 GiB of spaces must not go through the exact parser one character at a time).
            self.offset += len(carry) + len(piece)
            return bytearray()
        if first is None:  # no boundary in this piece: an event larger than a chunk
            carry += piece
            if len(carry) > 4 * self.chunk_bytes:
                # Not a layout the fast path knows: parse exactly, one event at a time.
                self._wait_all()
                chunk, used = _parse_regions_slowly(carry, self.where, self.offset)
                self._merge(chunk)
                self.offset += used
                del carry[:used]
            return carry
        last = _last_separator(piece)
        last = first if last is None or last < first else last
        tail = bytearray(memoryview(piece)[last + 1 :])
        carry += memoryview(piece)[:first]
        regions = [(carry, 0, len(carry), self.offset)] if carry.strip() else []
        if last > first:
            regions.append((piece, first + 1, last, piece_offset + first + 1))
        self._submit(regions)  # one task: the straddling event must not take a worker's turn
        self.offset = piece_offset + last + 1
        return tail

    def _submit_last(self, buffer: bytearray) -> None:
        cut = _last_separator(buffer, starts_at_event=True)
        last_start = cut + 1 if cut is not None else 0
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
            self._submit([(buffer, 0, end, self.offset)])

    def _submit(self, regions: list[tuple[bytearray, int, int, int]]) -> None:
        """Parse (text, start, end, offset) regions, in order, in one worker task."""
        if not regions:
            return
        while len(self._pending) >= PARSE_WORKERS:
            self._merge_many(self._pending.popleft().result())
        assert self._pool is not None
        self._pending.append(self._pool.submit(_parse_regions, regions, self.where))

    def _wait_all(self) -> None:
        while self._pending:
            self._merge_many(self._pending.popleft().result())

    def _merge_many(self, chunks: list[_Chunk]) -> None:
        for chunk in chunks:
            self._merge(chunk)

    def _merge(self, chunk: _Chunk) -> None:
        """Keep a chunk's columns, its names recoded into the trace's one dictionary."""
        self.slow_chunks += chunk.slow
        self.native_chunks += chunk.native
        if chunk.codes.size == 0:
            return
        chunk.codes = _recode(self.names, chunk.names, chunk.codes)
        chunk.category_codes = _recode(self.categories, chunk.categories, chunk.category_codes)
        chunk.names, chunk.categories = [], []
        self.parts.append(chunk)

    def _finish(self) -> RawTrace:
        base_ns = _base_ns(self.metadata)
        # Rows sorted by kind (stable: file order within a kind), so that selecting a kind
        # is a slice for the analyses and a row range in Parquet. Each chunk came sorted, so
        # this is one concatenation of slices per column; parts are dropped column by column
        # so that only one column is ever held twice.
        slices = [(part, int(part.bounds[k]), int(part.bounds[k + 1])) for k in range(len(KINDS)) for part in self.parts]
        slices = [s for s in slices if s[2] > s[1]]
        arrays: dict[str, np.ndarray] = {}
        for name in _CHUNK_COLUMNS:
            dtype = EVENT_SCHEMA.field(name).type.to_pandas_dtype()
            arrays[name] = np.concatenate([part.columns[name][lo:hi] for part, lo, hi in slices]).astype(dtype, copy=False) if slices else np.zeros(0, dtype=dtype)
            for part in self.parts:
                del part.columns[name]
            _return_free_memory()
        codes = np.concatenate([part.codes[lo:hi] for part, lo, hi in slices]) if slices else np.zeros(0, dtype=np.int32)
        category_codes = np.concatenate([part.category_codes[lo:hi] for part, lo, hi in slices]) if slices else np.zeros(0, dtype=np.int32)
        self.parts.clear()
        del slices
        arrays["step"] = np.full(codes.size, MISSING, dtype=np.int32)
        dictionary = np.array(list(self.names), dtype=object)
        if base_ns:
            arrays["ts_ns"] += base_ns
        _assign_steps(arrays, dictionary, codes)
        categories = np.array(list(self.categories), dtype=object)
        table = _to_table(arrays, codes, dictionary, category_codes, categories)
        return RawTrace(table, self.metadata, base_ns, self.where, self.slow_chunks, self.native_chunks)


class _small_pages:
    """numpy asks the kernel for transparent huge pages for every array of 4 MB or more.
    Where THP defrag is `madvise` (Ubuntu's and Debian's default), a fault on such an array
    may stall on compaction: a parse allocates a few hundred MB of fresh columns, and that
    cost 0.75 CPU-s of kernel time on the 479 MB bench trace (as much as the compiled scan
    of the whole trace). Off while parses run (a count: parses in threads overlap), back
    as it was after the last one; without numpy's switch (a private function), a no-op."""

    _lock = threading.Lock()
    _active = 0
    _before: bool | None = None

    def __enter__(self) -> None:
        with self._lock:
            if _small_pages._active == 0 and _SET_HUGE_PAGES is not None:
                _small_pages._before = bool(_SET_HUGE_PAGES(False))
            _small_pages._active += 1

    def __exit__(self, *exc: object) -> None:
        with self._lock:
            _small_pages._active -= 1
            if _small_pages._active == 0 and _SET_HUGE_PAGES is not None and _small_pages._before is not None:
                _SET_HUGE_PAGES(_small_pages._before)
                _small_pages._before = None


def _huge_pages_switch() -> Any:
    for module in ("numpy._core.multiarray", "numpy.core.multiarray"):
        try:
            return getattr(__import__(module, fromlist=["_set_madvise_hugepage"]), "_set_madvise_hugepage", None)
        except ImportError:
            continue
    return None


_SET_HUGE_PAGES = _huge_pages_switch()


def _recode(trace_codes: dict[str, int], chunk_values: list[str], chunk_codes: np.ndarray) -> np.ndarray:
    """A chunk's codes (against its own list of values) recoded into the trace's dictionary."""
    remap = np.fromiter((trace_codes.setdefault(v, len(trace_codes)) for v in chunk_values), dtype=np.int32, count=len(chunk_values))
    return remap[chunk_codes] if remap.size else chunk_codes


def _return_free_memory() -> None:
    """Hand the memory just freed back to the OS. glibc keeps freed blocks in the arena of
    the thread that allocated them: the chunks' columns were made by the workers, so the
    main thread's concatenated columns could not reuse that memory and the process would
    hold the table twice at the end of a parse. No-op where there is no malloc_trim."""
    if _MALLOC_TRIM is not None:
        _MALLOC_TRIM(0)


def _malloc_trim() -> Any:
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(None).malloc_trim  # glibc; musl has none
    except (OSError, AttributeError):
        return None


_MALLOC_TRIM = _malloc_trim()


# --- one chunk, in a worker thread ------------------------------------------------------

PARSE_WORKERS = 2
# Columns a chunk yields (name codes apart); `step` is computed over the whole trace.
_CHUNK_COLUMNS = tuple(name for name in EVENT_SCHEMA.names if name not in ("name", "step", "category"))


def _parse_regions(regions: list[tuple[bytearray, int, int, int]], where: str) -> list[_Chunk]:
    """One worker task: (text, start, end, offset) regions, parsed in order."""
    chunks = []
    for text, start, end, offset in regions:
        try:
            chunks.append(_parse_chunk(text, start, end, where, offset))
        except _TimeOverflow:
            raise CorruptRecord(where, offset, "a time beyond int64 nanoseconds in the events from this byte on") from None
    return chunks


def _parse_regions_slowly(text: bytearray, where: str, offset: int) -> tuple[_Chunk, int]:
    """The whole events at the start of `text`, read exactly (an event larger than a chunk)."""
    try:
        return _slow(text, 0, len(text), where, offset, final=False)
    except _TimeOverflow:
        raise CorruptRecord(where, offset, "a time beyond int64 nanoseconds in the events from this byte on") from None


def _parse_chunk(text: bytearray, start: int, end: int, where: str, offset: int) -> _Chunk:
    """The events of `text[start:end]` (whole events, separated by commas) as columns. The
    fast path: separators become newlines, pyarrow parses the newline-delimited JSON.
    Anything it cannot read sends the chunk to the exact, slow parser."""
    module = native.compiled()
    if module is not None:
        chunk = _native_chunk(module, text, start, end, where, offset)
        if chunk is not None:
            return chunk
    view = np.frombuffer(text, dtype=np.uint8)[start:end]
    read_options, in_blocks = _read_options(end - start)
    separators = _separators(view, in_blocks)
    renamed: list[tuple[int, bytes]] = []
    table = None
    for attempt in range(2):
        try:
            table = pj.read_json(pa.BufferReader(pa.py_buffer(memoryview(text)[start:end])), read_options=read_options, parse_options=_PARSE_OPTIONS)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
            logger.debug("%s: fast parse failed near byte %d (%s)", where, offset, exc)
            if attempt == 0 and ("/pid" in str(exc) or "/tid" in str(exc)):
                # Kineto's few string pids/tids ("Spans"): rename those keys and retry;
                # searching every chunk for them up front would cost a pass over the bytes.
                renamed = _rename_string_ids(text, start, end)
                if renamed:
                    continue
        break
    if table is not None:
        try:
            return _columns(table)
        except UnicodeDecodeError:  # a kept name that is not UTF-8: the exact parser replaces its bad bytes
            logger.debug("%s: a name near byte %d is not UTF-8", where, offset)
    view[separators] = ord(",")  # undo the trick, then read this chunk exactly
    for position, original in renamed:
        text[position : position + len(original)] = original
    chunk, _ = _slow(text, start, end, where, offset, final=True)
    return chunk


_SPACE_OR_COMMA = re.compile(r"[ \t\r\n,]*")
_SPACE = re.compile(rb"[ \t\r\n]*")
_NEXT_EVENT = re.compile(r"\}\s*,\s*(?=\{)")  # the end of an event and the start of the next


def _slow(text: bytearray, start: int, end: int, where: str, offset: int, final: bool) -> tuple[_Chunk, int]:
    """Exact parse of `text[start:end]`, one event at a time (json.raw_decode); returns the
    columns and the bytes used (all of them when `final`, else up to the last whole event)."""
    decoded = bytes(text[start:end]).decode("utf-8", errors="replace")
    decoder = json.JSONDecoder(strict=False, parse_float=decimal.Decimal)  # exact: never a float
    rows: list[dict[str, Any]] = []
    position, used, skipped = 0, 0, 0
    length = len(decoded)
    while True:
        position = _SPACE_OR_COMMA.match(decoded, position).end()  # type: ignore[union-attr]
        if position >= length:
            used = len(decoded.encode())
            break
        try:
            event, next_position = decoder.raw_decode(decoded, position)
        except json.JSONDecodeError as exc:
            if not final:
                used = len(decoded[:position].encode())
                break
            # One bad event costs that event, not the trace: Kineto writes a name between
            # quotes as it is, so an annotation named `a"b` breaks its own event only.
            # (Regions end at event boundaries: with no next event here, this one runs to
            # the region's end.)
            following = _NEXT_EVENT.search(decoded, max(exc.pos, position + 1))
            if not skipped:
                logger.warning("%s: the event at byte %d is not valid JSON (%s; a '\"' in an annotation name?); skipped", where, offset + position, exc.msg)
            skipped += 1
            position = following.end() if following is not None else length
            continue
        if isinstance(event, dict):
            rows.append(event)
        position = next_position
    chunk = _columns(_rows_to_table(rows))
    chunk.slow = 1
    return chunk, used


def _columns(table: pa.Table) -> _Chunk:
    """The kept events of a raw table (durations, instants, allocator records of a known
    category) as numpy columns sorted by kind, names coded against the chunk's own list.
    (The extension's path, _native_chunk, reads the same columns from the text.)"""
    if table.num_rows == 0:
        return _empty_chunk()
    # Kept: complete events ("X") of any category (an unknown one becomes an `other` row,
    # its category kept), and instants of known categories (allocator records).
    phase, category = table.column("ph"), table.column("cat")
    kind_index = pc.index_in(category, value_set=_CATEGORY_VALUES)
    complete = pc.fill_null(pc.equal(phase, "X"), False)
    keep = pc.and_(pc.is_valid(category), pc.or_(complete, pc.and_(pc.fill_null(pc.is_in(phase, value_set=_INSTANT_PHASES), False), pc.is_valid(kind_index))))
    if not pc.all(keep).as_py():  # Kineto's own files: nearly always all kept, no copy then
        table, kind_index = table.filter(keep), kind_index.filter(keep)
    if table.num_rows == 0:
        return _empty_chunk()
    kind = _CATEGORY_CODES[pc.fill_null(kind_index, len(_CATEGORY_CODES) - 1).to_numpy(zero_copy_only=False)]
    encoded_category = pc.dictionary_encode(table.column("cat").combine_chunks())
    encoded = pc.dictionary_encode(pc.fill_null(table.column("name").combine_chunks(), ""))
    names: list[str] = encoded.dictionary.to_pylist()
    categories: list[str] = encoded_category.dictionary.to_pylist()
    codes = encoded.indices.to_numpy(zero_copy_only=False).astype(np.int32, copy=False)
    category_codes = encoded_category.indices.to_numpy(zero_copy_only=False).astype(np.int32, copy=False)
    kept = _allocator_rows(kind, codes, names)
    if kept is not None:
        table = table.filter(pa.array(kept))
        kind, codes, category_codes = kind[kept], codes[kept], category_codes[kept]
    if table.num_rows == 0:
        return _empty_chunk()
    args = table.column("args").combine_chunks()
    ints = {name: _ints(_field(args, name)) for name in _ARGS_TYPE.names}
    ints["ts"] = _micros_to_ns(table.column("ts"))
    ints["dur"] = _micros_to_ns(table.column("dur"))
    ints["pid"] = _ints(table.column("pid"))
    ints["tid"] = _ints(table.column("tid"))
    return _kineto_columns(kind, codes, names, category_codes, categories, ints)


def _empty_chunk() -> _Chunk:
    return _Chunk({}, np.zeros(0, dtype=np.int32), [], np.zeros(len(KINDS) + 1, dtype=np.int64))


def _allocator_rows(kind: np.ndarray, codes: np.ndarray, names: list[str]) -> np.ndarray | None:
    """Which rows stay, where some instants are not allocator records (None: all stay).
    Instant events are only kept when they are allocator records (named [memory])."""
    is_memory = kind == KIND_CODE["memory"]
    if not is_memory.any():
        return None
    memory_code = names.index("[memory]") if "[memory]" in names else -2
    kept = ~is_memory | (codes == memory_code)
    return None if kept.all() else kept


def _kineto_columns(kind: np.ndarray, codes: np.ndarray, names: list[str], category_codes: np.ndarray, categories: list[str], ints: dict[str, np.ndarray]) -> _Chunk:
    """A chunk's kept rows (either parser's) as the table's columns: sync calls told apart
    from other runtime calls, the `args` fields Kineto spells two ways merged, rows sorted
    by kind. `ints`: the raw integer columns (times in ns, MISSING where absent)."""
    if kind.size == 0:
        return _empty_chunk()
    sync_codes = np.array([code for code, name in enumerate(names) if name in _SYNC_SET], dtype=np.int32)
    if sync_codes.size:
        kind = np.where((kind == KIND_CODE["runtime"]) & np.isin(codes, sync_codes), np.int8(KIND_CODE["sync"]), kind)
    device, transfer = ints["device"], ints["bytes"]
    columns = {
        "kind": kind.astype(np.int8, copy=False),
        "ts_ns": ints["ts"],
        "dur_ns": np.maximum(ints["dur"], 0),
        "pid": ints["pid"],
        "tid": ints["tid"],
        "correlation": ints["correlation"],
        "external_id": ints["External id"],
        "device": np.where(device == MISSING, ints["Device Id"], device).astype(np.int32),
        "stream": ints["stream"].astype(np.int32),
        "bytes": np.where(transfer == MISSING, ints["Bytes"], transfer),
        "total_allocated": ints["Total Allocated"],
        "total_reserved": ints["Total Reserved"],
        "addr": ints["Addr"],
        "device_type": np.clip(ints["Device Type"], -1, 127).astype(np.int8),
    }
    order = np.argsort(kind, kind="stable")
    bounds = np.searchsorted(kind[order], np.arange(len(KINDS) + 1), side="left")
    return _Chunk({name: values[order] for name, values in columns.items()}, codes[order], names, bounds, 0, category_codes[order], categories)


def _native_chunk(module: Any, text: bytearray, start: int, end: int, where: str, offset: int) -> _Chunk | None:
    """The chunk parsed by the compiled extension, or None where it leaves the region to
    the pyarrow path (native.py)."""
    scanned = native.scan(module, text, start, end)
    if isinstance(scanned, native.Declined):
        logger.debug("%s: the compiled parser left the chunk at byte %d to pyarrow (%s at byte %d)", where, offset, scanned.reason, offset + scanned.position - start)
        return None
    kept = _allocator_rows(scanned.kind, scanned.codes, scanned.names)
    kind, codes, category_codes, ints = scanned.kind, scanned.codes, scanned.category_codes, scanned.ints
    if kept is not None:
        kind, codes, category_codes = kind[kept], codes[kept], category_codes[kept]
        ints = {name: values[kept] for name, values in ints.items()}
    chunk = _kineto_columns(kind, codes, scanned.names, category_codes, scanned.categories, ints)
    chunk.native = 1
    return chunk


_INSTANT_PHASES = pa.array(["i", "I"])
_SYNC_SET = frozenset(SYNC_CALLS)
_CATEGORY_VALUES = pa.array(list(CATEGORY_KIND))
# One code per known category, and a last one (`other`) for the unknown ones.
_CATEGORY_CODES = np.array([*(KIND_CODE[CATEGORY_KIND[c]] for c in CATEGORY_KIND), KIND_CODE["other"]], dtype=np.int8)


def _last_separator(buffer: bytearray, starts_at_event: bool = False) -> int | None:
    """Position of the last comma between two top-level events, or None. A candidate
    (see _is_separator) counts when the text between it and its neighbour candidate is
    one whole event (a JSON object with "ph"): that rejects a `}, {"` inside a nested
    array of objects. Looks back from the end a few `}` at a time, so cutting a chunk
    costs a few small parses next to pyarrow's of the chunk. `starts_at_event`: the
    buffer's start is an event boundary (else it may be mid-event)."""
    candidates = _candidates(buffer, backward=True)
    if starts_at_event and len(candidates) < _CUT_TRIES:
        candidates.append(-1)  # the start works as the boundary before the first event
    for index in range(len(candidates) - 1):
        if _is_event(buffer, candidates[index + 1] + 1, candidates[index]):
            return candidates[index]
    return None


def _first_separator(buffer: bytearray) -> int | None:
    """Position of the first comma between two top-level events, or None; the same rule
    as _last_separator, checked forward."""
    candidates = _candidates(buffer, backward=False)
    for index in range(len(candidates) - 1):
        if _is_event(buffer, candidates[index] + 1, candidates[index + 1]):
            return candidates[index]
    return None


_CUT_TRIES = 64


def _candidates(buffer: bytearray, backward: bool) -> list[int]:
    """Up to _CUT_TRIES separator candidates from one end of the buffer, nearest first."""
    found: list[int] = []
    position = len(buffer) if backward else 0
    for _ in range(8 * _CUT_TRIES):
        close = buffer.rfind(b"}", 0, position) if backward else buffer.find(b"}", position)
        if close < 0:
            break
        if _is_separator(buffer, close):
            found.append(_skip_space(buffer, close + 1))
            if len(found) == _CUT_TRIES:
                break
        position = close if backward else close + 1
    return found


def _is_event(buffer: bytearray, start: int, end: int) -> bool:
    try:
        event = orjson.loads(memoryview(buffer)[start:end])
    except orjson.JSONDecodeError:
        return False
    return isinstance(event, dict) and "ph" in event


def _is_separator(buffer: bytearray, close: int) -> bool:
    """Whether the `}` at `close` ends an event: `}` `,` `{` `"`, whitespace allowed between.
    The `{"` keeps a `},{` inside a string (C++ lambdas in kernel names) from counting:
    a string cannot hold an unescaped `"`."""
    comma = _skip_space(buffer, close + 1)
    if comma >= len(buffer) or buffer[comma] != 44:  # ','
        return False
    brace = _skip_space(buffer, comma + 1)
    if brace >= len(buffer) or buffer[brace] != 123:  # '{'
        return False
    quote = _skip_space(buffer, brace + 1)
    return quote < len(buffer) and buffer[quote] == 34  # '"'


def _skip_space(buffer: bytearray, position: int) -> int:
    limit = min(len(buffer), position + _MAX_SPACE)
    while position < limit and buffer[position] in b" \t\r\n":
        position += 1
    return position


_MAX_SPACE = 32  # whitespace between events that is skipped (Kineto indents with 2)


def _find_separators(view: np.ndarray) -> np.ndarray:
    """Positions of the commas between top-level events."""
    if view.size < 3:
        return np.zeros(0, dtype=np.int64)
    limit = view.size - 1
    closes = np.concatenate([np.flatnonzero(view[at : min(at + _BLOCK, limit - 1)] == 125) + at for at in range(0, limit - 1, _BLOCK)])  # '}'
    commas = _skip_spaces(view, closes + 1, limit)
    commas = commas[view[commas] == 44]  # ','
    braces = _skip_spaces(view, commas + 1, limit)
    commas, braces = commas[view[braces] == 123], braces[view[braces] == 123]  # '{'
    quotes = _skip_spaces(view, np.minimum(braces + 1, limit), limit)
    return commas[view[quotes] == 34]  # '"': see _is_separator


def _skip_spaces(view: np.ndarray, positions: np.ndarray, limit: int) -> np.ndarray:
    for _ in range(_MAX_SPACE):
        white = _WS[view[positions]]
        if not white.any():
            break
        positions = np.minimum(positions + white, limit)
    return positions


def _read_options(size: int) -> tuple[pj.ReadOptions, bool]:
    """pyarrow's options for a chunk of `size` bytes, and whether pyarrow will split it
    into blocks. Split (on more than two cores: its threads then share the chunk), a block
    may end at any newline, so the ones inside events (Kineto writes one key per line) must
    become spaces first; whole (one block, one thread), they are whitespace like any other
    and that pass over the bytes is saved."""
    if _CORES > PARSE_WORKERS:
        return _THREADED_READ, True
    return pj.ReadOptions(block_size=max(size + 1, 1 << 16), use_threads=False), False


def _separators(view: np.ndarray, in_blocks: bool = True) -> np.ndarray:
    """Positions of the commas between top-level events, overwritten with newlines. With
    `in_blocks`, every other newline becomes a space (JSON strings cannot hold a raw
    newline, so that changes no value) so that pyarrow can split blocks at newlines."""
    separators = _find_separators(view)
    if in_blocks:
        for at in range(0, view.size, _BLOCK):
            block = view[at : at + _BLOCK]
            np.copyto(block, np.uint8(32), where=block == 10)
    view[separators] = 10
    return separators


_BLOCK = 1 << 20  # bytes compared at a time: the masks stay small next to the chunk


def _rename_string_ids(buffer: bytearray, start: int, end: int) -> list[tuple[int, bytes]]:
    """Kineto writes string pids/tids for a few bookkeeping events ("Spans", "Traces"):
    rename those keys in place (same length) so that the integer columns keep their type."""
    renamed = []
    for pattern in (b'id": "', b'id":"'):  # one pass per spacing covers both keys
        position = buffer.find(pattern, start, end)
        while position != -1:
            key_start = position - 2
            if key_start >= start and buffer[key_start] == 34 and buffer[key_start + 1] in (112, 116):  # '"p' or '"t'
                original = bytes(buffer[key_start : key_start + 4])
                buffer[key_start + 3] = 115  # "pid" -> "pis", "tid" -> "tis"
                renamed.append((key_start, original))
            position = buffer.find(pattern, position + len(pattern), end)
    return renamed


def _object_end(buffer: bytearray, start: int) -> int | None:
    """End (exclusive) of the JSON object starting at or after `start`, or None."""
    length = len(buffer)
    position = _SPACE.match(buffer, start).end()  # type: ignore[union-attr]
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


def _micros_to_ns(column: pa.ChunkedArray | pa.Array) -> np.ndarray:
    """Integer nanoseconds from decimal(38, 3) microseconds, exactly: the decimal's unscaled
    value is the count of nanoseconds. Read from the 128-bit words directly (little-endian
    two's complement: the low word is the value when the high word only extends its sign).
    A missing value (JSON has no NaN) is 0."""
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks()
    array = pc.fill_null(column, _ZERO_MICROS) if column.null_count else column
    if len(array) == 0:
        return np.zeros(0, dtype=np.int64)
    words = np.frombuffer(array.buffers()[1], dtype=np.int64)[2 * array.offset : 2 * (array.offset + len(array))]
    low, high = words[0::2], words[1::2]
    if not bool(np.array_equal(high, low >> 63)):
        raise _TimeOverflow("a time beyond int64 nanoseconds")
    return low.copy()


class _TimeOverflow(ValueError):
    pass


_ZERO_MICROS = pa.scalar(decimal.Decimal(0), type=_MICROS)


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
    """Each event's step: host events by the ProfilerStep#N interval holding their start;
    GPU events by the step of the runtime call that launched them, found by correlation id
    (HTA's rule); GPU work with a correlation id whose call is not in the trace (launched
    before the profiler started) is BEFORE_FIRST_STEP; GPU records without a correlation id
    go by the interval holding their start. Lookups run on the rows that need them only."""
    step_numbers = np.full(len(dictionary), MISSING, dtype=np.int64)
    for code, name in enumerate(dictionary):
        match = STEP_NAME_RE.match(name)
        if match:
            step_numbers[code] = int(match.group(1))
    kind, ts, dur = arrays["kind"], arrays["ts_ns"], arrays["dur_ns"]
    markers = np.flatnonzero(((kind == KIND_CODE["annotation"]) | (kind == KIND_CODE["cpu_op"])) & (step_numbers[codes] != MISSING)) if codes.size else codes
    if markers.size == 0:
        return
    order = np.argsort(ts[markers], kind="stable")
    markers = markers[order]
    starts, ends, numbers = ts[markers], ts[markers] + dur[markers], step_numbers[codes[markers]].astype(np.int32)

    def interval_step(times: np.ndarray) -> np.ndarray:
        slot = np.maximum(np.searchsorted(starts, times, side="right") - 1, 0)
        inside = (times >= starts[0]) & (times < ends[slot])
        return np.where(inside, numbers[slot], np.int32(MISSING))

    gpu = np.isin(kind, [KIND_CODE[k] for k in ("kernel", "memcpy", "memset", "gpu_annotation", "gpu_sync")])
    step = np.full(kind.size, MISSING, dtype=np.int32)
    host_rows = np.flatnonzero(~gpu)
    step[host_rows] = interval_step(ts[host_rows])
    del host_rows
    gpu_rows = np.flatnonzero(gpu)
    del gpu
    gpu_step = interval_step(ts[gpu_rows])
    correlation = arrays["correlation"]
    launches = np.flatnonzero(((kind == KIND_CODE["runtime"]) | (kind == KIND_CODE["sync"])) & (correlation != MISSING))
    wanted = correlation[gpu_rows]
    if gpu_rows.size:
        # Launched work (not sync records, whose ids may name calls Kineto did not record).
        launched = np.isin(kind[gpu_rows], [KIND_CODE[k] for k in ("kernel", "memcpy", "memset")])
        gpu_step = np.where(launched & (wanted > 0), np.int32(BEFORE_FIRST_STEP), gpu_step)  # unless its call is found below
    if launches.size and gpu_rows.size:
        launch_corr, launch_step = correlation[launches], step[launches]
        if launch_corr.size > 1 and not bool(np.all(launch_corr[1:] >= launch_corr[:-1])):  # Kineto's are in order already
            by_corr = np.argsort(launch_corr, kind="stable")
            launch_corr, launch_step = launch_corr[by_corr], launch_step[by_corr]
        position = np.minimum(np.searchsorted(launch_corr, wanted), launch_corr.size - 1)
        found = (wanted != MISSING) & (launch_corr[position] == wanted)
        gpu_step = np.where(found, launch_step[position], gpu_step)
    step[gpu_rows] = gpu_step
    arrays["step"] = step


def _to_table(arrays: dict[str, np.ndarray], codes: np.ndarray, dictionary: np.ndarray, category_codes: np.ndarray, categories: np.ndarray) -> pa.Table:
    coded = {
        "name": pa.DictionaryArray.from_arrays(pa.array(codes, type=pa.int32()), pa.array(dictionary, type=pa.string())),
        "category": pa.DictionaryArray.from_arrays(pa.array(category_codes, type=pa.int32()), pa.array(categories, type=pa.string())),
    }
    columns = [coded[name] if name in coded else pa.array(arrays[name], type=EVENT_SCHEMA.field(name).type) for name in EVENT_SCHEMA.names]
    return pa.Table.from_arrays(columns, schema=EVENT_SCHEMA)


_THOUSANDTH = decimal.Decimal("0.001")


def _micros(value: Any) -> decimal.Decimal | None:
    """A JSON number of microseconds as a decimal with three places (nanoseconds), rounded
    half to even where the trace has more places; None for anything else."""
    if isinstance(value, bool) or not isinstance(value, (int, decimal.Decimal, str)):
        return None
    try:
        exact = decimal.Decimal(value)
        return exact.quantize(_THOUSANDTH, rounding=decimal.ROUND_HALF_EVEN) if exact.is_finite() else None
    except (decimal.InvalidOperation, ValueError):
        return None


_INT64_MIN, _INT64_MAX = -(1 << 63), (1 << 63) - 1


def _utf8(text: str) -> str:
    """`text`, its lone surrogates (a `\\ud800` escape alone) replaced: Arrow strings are UTF-8."""
    try:
        text.encode()
    except UnicodeEncodeError:
        return text.encode("utf-8", "replace").decode()
    return text


def _rows_to_table(rows: list[dict[str, Any]]) -> pa.Table:
    """The slow path's events in the fast path's raw schema (bad values become nulls)."""

    def number(value: Any, kind: type) -> Any:
        if isinstance(value, bool) or value is None:
            return None
        try:
            number = kind(value)
        except (TypeError, ValueError, ArithmeticError):
            return None
        return number if _INT64_MIN <= number <= _INT64_MAX else None  # beyond int64: not a value Kineto writes

    columns: dict[str, list[Any]] = {name: [] for name in _RAW_SCHEMA.names}
    for row in rows:
        for key in ("ph", "cat", "name"):
            value = row.get(key)
            columns[key].append(_utf8(value) if isinstance(value, str) else None)
        for key in ("pid", "tid"):
            columns[key].append(number(row.get(key), int))
        for key in ("ts", "dur"):
            columns[key].append(_micros(row.get(key)))
        args = row.get("args")
        args = args if isinstance(args, dict) else {}
        columns["args"].append({f.name: number(args.get(f.name), int) for f in _ARGS_TYPE})
    return pa.Table.from_pydict(columns, schema=_RAW_SCHEMA)

