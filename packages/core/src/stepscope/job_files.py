"""Parsing of a job's own JSON files (collections, per-step index files, step tables) into
checked values. A job folder is input like any other: each parser takes the bytes of one
file and either returns what it means or raises `CorruptRecord` naming the file and what is
wrong with it, never a bare KeyError/TypeError/MemoryError. Sizes are bounded before a file
is read (`MAX_*_BYTES`) and regular expressions from a job run under a time bound.
`parsing_in_bulk()` keeps the garbage collector out of the way while many are parsed."""

from __future__ import annotations

import contextlib
import gc
import json
import logging
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from operator import attrgetter
from typing import Annotated, Any

import msgspec

from . import layout
from .capture.cost import MAX_COST_BYTES, HookCost
from .capture.scopes import Scope, parse_scopes
from .exceptions import ConfigError, CorruptRecord, StepscopeError
from .modes import ModeKeys
from .store.base import check_key

logger = logging.getLogger("stepscope")

try:  # orjson parses index files ~4x faster; it is optional
    from orjson import JSONDecodeError as _OrjsonError
    from orjson import loads as _json_loads

    _JSON_ERRORS: tuple[type[BaseException], ...] = (ValueError, _OrjsonError, RecursionError)
except ImportError:  # pragma: no cover
    _json_loads = json.loads  # type: ignore[assignment]
    _JSON_ERRORS = (ValueError, RecursionError)

# Far above what a real job writes (an index of 100,000 tensors is ~8 MB), far below what
# would exhaust a reader's memory.
MAX_INDEX_BYTES = 64 * 1024 * 1024
MAX_TABLE_BYTES = 256 * 1024 * 1024
MAX_COLLECTIONS_BYTES = 64 * 1024 * 1024
MAX_STATUS_BYTES = 1024 * 1024
MAX_WORKERS = 1_000_000
MAX_RECORD_BYTES = 1 << 40  # one tensor record; larger offsets or lengths are corrupt
MAX_REGEX_LENGTH = 4096


@dataclass(frozen=True)
class IndexEntry:
    """One step of one worker: where each saved tensor sits in the event file."""

    mode: ModeKeys
    mode_step: int
    event_key: str  # "" when the index does not say (the default name applies)
    names: tuple[str, ...]
    starts: Sequence[int]
    lengths: Sequence[int]
    shapes: Mapping[str, tuple[int, ...]]
    # The held table ("meta.step_table") that holds the steps before this one back to the
    # start of its held batch (docs/format.md); "" for every other index file.
    step_table: str = ""


# One step of a step table: (mode, mode_step, layout number, starts, lengths, shapes).
# A plain tuple: a table holds up to 1,000 steps and a 64-worker job 64 tables per 1,000
# steps, so a row costs one tuple, not an object.
TableRow = tuple[ModeKeys, int, int, Sequence[int], Sequence[int], Mapping[str, tuple[int, ...]]]


@dataclass(frozen=True)
class StepTable:
    """One worker's step table: the index entries of many steps, row by row. Rows share
    the table's layouts (tuples of tensor names); the reader turns a row into a step's
    tensor locations only when that step is read."""

    worker: str
    layouts: tuple[tuple[str, ...], ...]
    rows: Mapping[int, TableRow]  # step -> row (a step listed twice: its last row)
    shape_names: frozenset[str]  # every name with a saved shape, in any row
    # step -> event file, for the steps whose records are not in their own step's file (a
    # writer's batch of scalar-only steps shares the first one's)
    event_keys: Mapping[int, str] = field(default_factory=dict)

    def entry(self, step: int) -> IndexEntry:
        """The row of `step` as an index entry (without an event key: the default name)."""
        mode, mode_step, number, starts, lengths, shapes = self.rows[step]
        return IndexEntry(mode, mode_step, self.event_keys.get(step, ""), self.layouts[number], starts, lengths, shapes)


@dataclass(frozen=True)
class CollectionsFile:
    num_workers: int
    ours: bool  # written by stepscope with real payload CRCs
    collections: list[Mapping[str, Any]]  # the raw bodies; Collection.from_json checks each
    module_classes: dict[str, str]  # module name -> class name, where the writer recorded them
    scopes: list[Scope] = field(default_factory=list)  # networks / optimizers the hook declared


_gc_lock = threading.Lock()
_gc_pauses = 0  # parsing_in_bulk() calls under way, in any thread
_gc_was_enabled = False


@contextlib.contextmanager
def parsing_in_bulk():
    """Python's cyclic garbage collector off while many job files are parsed. Parsing
    builds many short-lived JSON containers (a 64-worker x 1,000-step job: 64 step tables of
    ~10,000 each), and each collection they trigger walks every object of the process
    (botocore's models alone are ~10^5): opening such a job spent more than half its CPU
    there. What is parsed holds no cycles, so reference counting frees it all the same.
    Nested and concurrent pauses (trials refreshed in several threads) count; the last
    one out turns the collector back on if it was on before the first."""
    global _gc_pauses, _gc_was_enabled
    with _gc_lock:
        if _gc_pauses == 0:
            _gc_was_enabled = gc.isenabled()
            gc.disable()
        _gc_pauses += 1
    try:
        yield
    finally:
        with _gc_lock:
            _gc_pauses -= 1
            if _gc_pauses == 0 and _gc_was_enabled:
                gc.enable()


MAX_JSON_DEPTH = 1024  # orjson's own bound; the fallback checks the same before parsing


def load_json(data: bytes | str, where: str, allow_nan: bool = False) -> Any:
    """One job file's JSON, parsed in C (orjson: UTF-8 checked, nesting bounded at 1,024
    levels, no Python object until the whole text is valid), or CorruptRecord naming the
    file. With `allow_nan`, a file that Python's json wrote with NaN/Infinity (rule reports
    and cost files may hold them) is read by json after a depth check, never recursing
    deeper than orjson would."""
    try:
        return _json_loads(data)
    except _JSON_ERRORS as exc:
        if allow_nan and (b"NaN" in data or b"Infinity" in data if isinstance(data, bytes) else "NaN" in data or "Infinity" in data):
            if _nesting(data) > MAX_JSON_DEPTH:
                raise CorruptRecord(where, None, f"nested deeper than {MAX_JSON_DEPTH} levels") from None
            try:
                return json.loads(data)
            except (ValueError, RecursionError) as again:
                raise CorruptRecord(where, None, f"not valid JSON: {again}") from None
        raise CorruptRecord(where, None, f"not valid JSON: {exc}") from None


def _nesting(data: bytes | str) -> int:
    """An upper bound of the JSON nesting depth (brackets inside strings count too), in
    numpy: no Python loop over the text."""
    import numpy as np

    raw = np.frombuffer(data if isinstance(data, bytes) else data.encode(), dtype=np.uint8)
    steps = (raw == ord("[")).astype(np.int32) + (raw == ord("{")) - (raw == ord("]")) - (raw == ord("}"))
    return int(np.cumsum(steps).max(initial=0))


def read_json(store: Any, key: str, max_bytes: int = MAX_STATUS_BYTES, allow_nan: bool = False) -> Any:
    """`key` of `store`, read under its size bound and parsed by load_json."""
    return load_json(store.read(key, max_size=max_bytes), store.describe(key), allow_nan)


def _fail(where: str, reason: str) -> CorruptRecord:
    return CorruptRecord(where, None, reason)


def _int(value: Any, where: str, what: str, minimum: int = 0, maximum: int = MAX_RECORD_BYTES) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        if isinstance(value, str) and value.strip().lstrip("-").isdigit() and len(value) < 20:
            value = int(value)
        else:
            raise _fail(where, f"{what} must be an integer, got {_short(value)}")
    if not minimum <= value <= maximum:
        raise _fail(where, f"{what} must be in [{minimum}, {maximum}], got {value}")
    return value


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _mode(value: Any, where: str) -> ModeKeys:
    try:
        return ModeKeys.parse(value)
    except (ValueError, TypeError):
        raise _fail(where, f"unknown mode {_short(value)}; expected one of {', '.join(ModeKeys.__members__)}") from None


def _mapping(value: Any, where: str, what: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise _fail(where, f"{what} must be a JSON object, got {type(value).__name__}")
    return value


def _list(value: Any, where: str, what: str) -> list[Any]:
    if not isinstance(value, list):
        raise _fail(where, f"{what} must be a JSON list, got {type(value).__name__}")
    return value


def _name(value: Any, where: str, what: str) -> str:
    if not isinstance(value, str) or not value:
        raise _fail(where, f"{what} must be a non-empty string, got {_short(value)}")
    return value


def _shape(value: Any, where: str, what: str) -> tuple[int, ...]:
    return tuple(_int(d, where, what, 0, 1 << 62) for d in _list(value, where, what))


def event_key_of(name: Any, where: str) -> str:
    """The event file an index entry points to, as a key inside the job. smdebug wrote
    full paths on some versions: only the part from `events/` on is kept, and it must stay
    inside the job's events folder."""
    if name is None or name == "":
        return ""
    if not isinstance(name, str):
        raise _fail(where, f"event_file_name must be a string, got {_short(name)}")
    tail = name.rsplit(layout.EVENTS_DIR + "/", 1)[-1] if layout.EVENTS_DIR + "/" in name else name
    key = f"{layout.EVENTS_DIR}/{tail}"
    try:
        check_key(key)
    except Exception:
        raise _fail(where, f"event_file_name {_short(name)} points outside the job's events folder") from None
    return key


def step_table_of(name: Any, where: str) -> str:
    """An index file's `meta.step_table`, the held table of its batch (written by the
    writer since 2026-12-06): a key inside the job's step tables folder, or ""."""
    if name is None or name == "":
        return ""
    if not isinstance(name, str):
        raise _fail(where, f"step_table must be a string, got {_short(name)}")
    try:
        inside = check_key(name).startswith(layout.STEP_TABLE_DIR + "/") and name.endswith(layout.HELD_TABLE_SUFFIX)
    except Exception:
        inside = False
    if not inside:
        raise _fail(where, f"step_table {_short(name)} points outside the job's step tables")
    return name


# --- index files decoded and validated in one pass, in C ------------------------------------
# The schema below accepts a strict subset of what _parse_index_checked accepts (exact JSON
# types, every bound, no unknown field, so nesting is bounded by the schema itself) and
# yields the same IndexEntry. Anything else (a digit string for an integer, an extra field,
# a malformed file) is parsed again by _parse_index_checked, which says what is wrong.
_Offset = Annotated[int, msgspec.Meta(ge=0, le=MAX_RECORD_BYTES)]
_Length = Annotated[int, msgspec.Meta(ge=1, le=MAX_RECORD_BYTES)]
_Dimension = Annotated[int, msgspec.Meta(ge=0, le=1 << 62)]
_NonEmpty = Annotated[str, msgspec.Meta(min_length=1)]


class _Meta(msgspec.Struct, forbid_unknown_fields=True, gc=False):
    mode: str | int = "GLOBAL"
    mode_step: Annotated[int, msgspec.Meta(ge=-1, le=1 << 62)] | None = -1
    event_file_name: str | None = None
    step_table: str | None = None


class _Payload(msgspec.Struct, forbid_unknown_fields=True, gc=False):
    tensorname: _NonEmpty
    start_idx: _Offset
    length: _Length


class _ShapeEntry(msgspec.Struct, forbid_unknown_fields=True, gc=False):
    tensorname: _NonEmpty
    shape: list[_Dimension]  # required, as _parse_index_checked has it
    originalname: str | None = None


class _Index(msgspec.Struct, forbid_unknown_fields=True, gc=False):
    meta: _Meta
    tensor_payload: list[_Payload] | None = None
    shape_payload: list[_ShapeEntry] | None = None


class _IndexHead(msgspec.Struct, forbid_unknown_fields=True, gc=False):
    """An index file's members before its payloads: the meta alone (see IndexParser)."""

    meta: _Meta


class _IndexTail(msgspec.Struct, forbid_unknown_fields=True, gc=False):
    """An index file's members from its payloads on: no meta (see IndexParser)."""

    tensor_payload: list[_Payload] | None = None
    shape_payload: list[_ShapeEntry] | None = None


_MODES_BY_TEXT: dict[Any, ModeKeys] = {m.name: m for m in ModeKeys} | {int(m): m for m in ModeKeys}


_index_decoder = msgspec.json.Decoder(_Index)
_head_decoder = msgspec.json.Decoder(_IndexHead)
_tail_decoder = msgspec.json.Decoder(_IndexTail)
_names_of = attrgetter("tensorname")
_starts_of = attrgetter("start_idx")
_lengths_of = attrgetter("length")

# (names, starts, lengths, shapes) of an index file's payloads
_Payloads = tuple[tuple[str, ...], tuple[int, ...], tuple[int, ...], Mapping[str, tuple[int, ...]]]


def _payloads(body: _Index | _IndexTail) -> _Payloads:
    payload = body.tensor_payload or ()
    shapes = {s.tensorname: tuple(s.shape) for s in body.shape_payload} if body.shape_payload else {}
    return tuple(map(_names_of, payload)), tuple(map(_starts_of, payload)), tuple(map(_lengths_of, payload)), shapes


def _entry(meta: _Meta, payloads: _Payloads, data: bytes, where: str) -> IndexEntry:
    mode = _MODES_BY_TEXT.get(meta.mode)
    if mode is None or type(meta.mode) is bool:
        return _parse_index_checked(data, where)
    mode_step = -1 if meta.mode_step is None else meta.mode_step
    return IndexEntry(mode, mode_step, event_key_of(meta.event_file_name, where), *payloads, step_table_of(meta.step_table, where))


def parse_index(data: bytes, where: str) -> IndexEntry:
    """One per-step index file (smdebug's format)."""
    try:
        body = _index_decoder.decode(data)
    except Exception:  # not the plain schema (or not JSON): the checked parse says why
        return _parse_index_checked(data, where)
    return _entry(body.meta, _payloads(body), data, where)


class IndexParser:
    """parse_index for the many index files of one job, which repeat their payloads: the
    steps of a training save the same tensors at the same sizes, so from the payloads on
    (`, "tensor_payload": [...], "shape_payload": [...]}`, as smdebug and stepscope write
    them) most files are byte for byte one that came before. Those bytes are decoded once
    and their names, offsets and lengths shared; each file's meta is still decoded (and its
    event file checked). Same result as parse_index on every input: the split is used only
    when both halves are complete JSON objects of the plain schema, the first holding only
    the meta and the second none, so that the whole file holds exactly their members; a
    file split otherwise, or failing either half, is parsed whole. One parser per reader;
    threads may share it (each dict operation is whole under the GIL, and a layout lost
    to a clear only costs a decode)."""

    SPLIT = b', "tensor_payload"'
    MAX_KEPT = 64  # payload layouts kept (a job has a few: a layout per set of saved tensors)
    MAX_KEPT_BYTES = 1 << 20  # per layout; larger payloads are decoded with their file

    def __init__(self) -> None:
        self._kept: dict[bytes, _Payloads] = {}
        self._last: tuple[bytes, _Payloads] | None = None  # the tail before: most files repeat it

    def parse(self, data: bytes, where: str) -> IndexEntry:
        split = data.find(self.SPLIT)
        if split > 0 and len(data) - split <= self.MAX_KEPT_BYTES:
            payloads = self._payloads_from(data, split)
            if payloads is not None:
                try:
                    head = _head_decoder.decode(data[:split] + b"}")
                except Exception:  # not split at a member of the file's object
                    return parse_index(data, where)
                return _entry(head.meta, payloads, data, where)
        return parse_index(data, where)

    def _payloads_from(self, data: bytes, split: int) -> _Payloads | None:
        """The payloads `data[split:]` holds, decoded once per distinct bytes; None when
        those bytes are not the plain schema's payload members closing the object."""
        last = self._last
        if last is not None and len(last[0]) == len(data) - split and data.endswith(last[0]):
            return last[1]  # compared in place: no copy, no hash
        tail = data[split:]
        payloads = self._kept.get(tail)
        if payloads is None:
            try:
                body = _tail_decoder.decode(b"{" + tail[1:])
            except Exception:
                return None
            payloads = _payloads(body)
            if len(self._kept) >= self.MAX_KEPT:
                self._kept.clear()
            self._kept[tail] = payloads
        self._last = (tail, payloads)
        return payloads


def _parse_index_checked(data: bytes, where: str) -> IndexEntry:
    """parse_index for whatever the C schema does not take, one check at a time, so that
    a malformed file gets an error naming the file and the field."""
    body = _mapping(load_json(data, where), where, "the index file")
    meta = _mapping(body.get("meta"), where, "meta")
    mode = _mode(meta.get("mode", "GLOBAL"), where)
    mode_step = meta.get("mode_step", -1)
    mode_step = -1 if mode_step in (-1, None) else _int(mode_step, where, "meta.mode_step", 0, 1 << 62)
    event_key = event_key_of(meta.get("event_file_name"), where)
    names, starts, lengths = [], [], []
    for i, entry in enumerate(_list(body.get("tensor_payload") or [], where, "tensor_payload")):
        entry = _mapping(entry, where, f"tensor_payload[{i}]")
        names.append(_name(entry.get("tensorname"), where, f"tensor_payload[{i}].tensorname"))
        starts.append(_int(entry.get("start_idx"), where, f"tensor_payload[{i}].start_idx"))
        lengths.append(_int(entry.get("length"), where, f"tensor_payload[{i}].length", 1))
    shapes = {}
    for i, entry in enumerate(_list(body.get("shape_payload") or [], where, "shape_payload")):
        entry = _mapping(entry, where, f"shape_payload[{i}]")
        shapes[_name(entry.get("tensorname"), where, f"shape_payload[{i}].tensorname")] = _shape(entry.get("shape"), where, f"shape_payload[{i}].shape")
    return IndexEntry(mode, mode_step, event_key, tuple(names), tuple(starts), tuple(lengths), shapes, step_table_of(meta.get("step_table"), where))


def _plain_int(value: Any, minimum: int = 0) -> bool:
    return type(value) is int and minimum <= value <= MAX_RECORD_BYTES


def parse_step_table(data: bytes, where: str, worker: str | None = None) -> StepTable:
    """A step table (see Writer). All or nothing: a table with one bad entry is rejected
    whole, and the reader falls back to the index files. Offsets and lengths are checked
    here only for type and count (a table holds a million of them); the reader checks each
    value's range when it reads the value."""
    body = _mapping(load_json(data, where), where, "the step table")
    table_worker = _name(body.get("worker"), where, "worker")
    if worker is not None and table_worker != worker:
        raise _fail(where, f"names worker {table_worker!r} but lies in the folder of {worker!r}")
    layouts = []
    for i, names in enumerate(_list(body.get("layouts"), where, "layouts")):
        layouts.append(tuple(_name(n, where, f"layouts[{i}][]") for n in _list(names, where, f"layouts[{i}]")))
    rows: dict[int, TableRow] = {}
    event_keys: dict[int, str] = {}
    no_shapes: dict[str, tuple[int, ...]] = {}
    shape_names: set[str] = set()
    for i, entry in enumerate(_list(body.get("steps"), where, "steps")):
        # The common case costs a few type checks; anything odd goes to _table_entry_error.
        try:
            step, number, starts, lengths = entry["step"], entry["layout"], entry["starts"], entry["lengths"]
            mode, mode_step = entry["mode"], entry["mode_step"]
            shapes = entry.get("shapes")
        except (KeyError, TypeError, AttributeError):
            raise _table_entry_error(entry, i, where) from None
        mode = _MODES_BY_TEXT.get(mode) if isinstance(mode, (str, int)) else None
        if mode is None:
            mode = _mode(entry["mode"], where)  # other spellings, or CorruptRecord
        if (
            not _plain_int(step)
            or not _plain_int(mode_step)
            or type(number) is not int
            or not 0 <= number < len(layouts)
            or type(starts) is not list
            or type(lengths) is not list
            or not len(layouts[number]) == len(starts) == len(lengths)
        ):
            raise _table_entry_error(entry, i, where, len(layouts), layouts[number] if type(number) is int and 0 <= number < len(layouts) else None)
        if shapes:
            shapes = {_name(n, where, f"steps[{i}].shapes"): _shape(s, where, f"steps[{i}].shapes[{n!r}]") for n, s in _mapping(shapes, where, f"steps[{i}].shapes").items()}
            shape_names.update(shapes)
        rows[step] = (mode, mode_step, number, starts, lengths, shapes or no_shapes)
        event = entry.get("event")
        if event is not None:
            event_keys[step] = event_key_of(event, f"{where} steps[{i}].event")
        else:
            event_keys.pop(step, None)
    return StepTable(table_worker, tuple(layouts), rows, frozenset(shape_names), event_keys)


def _table_entry_error(entry: Any, i: int, where: str, n_layouts: int = 0, names: tuple[str, ...] | None = None) -> CorruptRecord:
    what = f"steps[{i}]"
    if not isinstance(entry, Mapping):
        return _fail(where, f"{what} must be a JSON object, got {type(entry).__name__}")
    for key in ("step", "mode", "mode_step", "layout", "starts", "lengths"):
        if key not in entry:
            return _fail(where, f"{what} has no {key!r}")
    for key in ("step", "mode_step"):
        if not _plain_int(entry[key]):
            return _fail(where, f"{what}.{key} must be a non-negative integer, got {_short(entry[key])}")
    if type(entry["layout"]) is not int or not 0 <= entry["layout"] < n_layouts:
        return _fail(where, f"{what}.layout {_short(entry['layout'])} is out of range ({n_layouts} layouts)")
    for key in ("starts", "lengths"):
        if type(entry[key]) is not list:
            return _fail(where, f"{what}.{key} must be a JSON list, got {type(entry[key]).__name__}")
    return _fail(where, f"{what}: {len(names or ())} names, {len(entry['starts'])} starts and {len(entry['lengths'])} lengths")


def check_location(start: Any, length: Any, where: str, name: str) -> tuple[int, int]:
    """A tensor's (start, length) from a step table, checked when it is read."""
    if not _plain_int(start) or not _plain_int(length, 1):
        raise _fail(where, f"tensor {name!r}: bad offset {_short(start)} or length {_short(length)}")
    return start, length


def parse_collections(data: bytes, where: str) -> CollectionsFile:
    """A worker's collections file: how many workers the job has, whether stepscope wrote
    it, and the collection bodies (checked one by one by the caller)."""
    body = _mapping(load_json(data, where), where, "the collections file")
    meta = body.get("_meta")
    meta = {} if meta is None else _mapping(meta, where, "_meta")
    num_workers = _int(meta.get("num_workers", 1), where, "_meta.num_workers", 1, MAX_WORKERS)
    writer = meta.get("writer", "")
    crc = meta.get("payload_crc", "crc32c")
    ours = isinstance(writer, str) and writer.split(" ")[0] == "stepscope" and crc == "crc32c"
    collections = body.get("collections") or {}
    if isinstance(collections, Mapping):
        bodies = list(collections.values())
    else:
        raise _fail(where, f"'collections' must be a JSON object of name -> collection, got {type(collections).__name__}")
    classes = meta.get("module_classes")
    module_classes = {str(k): str(v) for k, v in classes.items() if isinstance(v, (str, int, float))} if isinstance(classes, Mapping) else {}
    try:
        scopes = parse_scopes(meta.get("scopes"), where)
    except ConfigError as exc:  # bad scopes must not hide the collections: judged as one scope
        logging.getLogger("stepscope").warning("stepscope: ignoring the scopes: %s", exc)
        scopes = []
    return CollectionsFile(num_workers, ours, bodies, module_classes, scopes)


REGEX_TIMEOUT_S = 0.05  # one match of one tensor name; real patterns take microseconds


class UntrustedPattern:
    """A regular expression read from a job file, matched under a time bound (the `regex`
    engine's timeout): a crafted pattern such as `^(a+)+$` cannot hang a reader. The
    first match that runs out of time disables the pattern (it then matches nothing) and
    logs a warning naming where it came from, so the total cost stays bounded too."""

    def __init__(self, pattern: str, where: str):
        import regex

        self.pattern = pattern
        self.where = where
        try:
            self._compiled = regex.compile(pattern)
        except (regex.error, RecursionError, OverflowError) as exc:
            raise ConfigError(f"{where}: bad regular expression {_short(pattern)}: {exc}") from None
        self.disabled = False

    def search(self, text: str) -> Any:
        if self.disabled:
            return None
        try:
            return self._compiled.search(text, timeout=REGEX_TIMEOUT_S)
        except TimeoutError:
            self.disabled = True
            logging.getLogger("stepscope").warning(
                "stepscope: regular expression %s from %s took over %g s on one name and is now ignored", _short(self.pattern), self.where, REGEX_TIMEOUT_S
            )
            return None

    def __repr__(self) -> str:
        return f"UntrustedPattern({self.pattern!r})"


def compile_untrusted_regex(pattern: Any, where: str) -> UntrustedPattern:
    """A pattern (with `.search`) for a regex read from a job file; see UntrustedPattern."""
    if not isinstance(pattern, str) or len(pattern) > MAX_REGEX_LENGTH:
        raise ConfigError(f"{where}: include_regex must be a string of at most {MAX_REGEX_LENGTH} characters, got {_short(pattern)}")
    return UntrustedPattern(pattern, where)


def read_costs(store: Any) -> dict[str, HookCost]:
    """{worker: HookCost} of every cost file in the job (empty when the hooks wrote none;
    an unreadable one is skipped with a warning naming it)."""
    out = {}
    for key in store.list(layout.COST_DIR + "/"):
        try:
            cost = HookCost.from_json(read_json(store, key, MAX_COST_BYTES, allow_nan=True))
        except (StepscopeError, ValueError, KeyError, TypeError, AttributeError, OverflowError, OSError) as exc:
            logger.warning("stepscope: skipping unreadable cost file %s: %s", store.describe(key), exc)
            continue
        out[cost.worker] = cost
    return out


__all__ = [
    "read_costs",
    "IndexEntry",
    "StepTable",
    "TableRow",
    "CollectionsFile",
    "parse_index",
    "IndexParser",
    "parsing_in_bulk",
    "parse_step_table",
    "parse_collections",
    "event_key_of",
    "step_table_of",
    "check_location",
    "compile_untrusted_regex",
    "UntrustedPattern",
    "load_json",
    "read_json",
    "MAX_INDEX_BYTES",
    "MAX_TABLE_BYTES",
    "MAX_COLLECTIONS_BYTES",
]
