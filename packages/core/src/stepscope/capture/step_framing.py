"""The writer's first stage, apart from its threads: one step's tensors framed as records
(`StepFramer`), and the step tables that repeat a block of steps' index entries in one
file (`StepTables`). Both run on the writer's threads; neither touches the store.

The training thread wants the GIL back after every framework op, so the framer holds it
as little as it can. Each array's record (the Event's fields around the array's bytes, the
TFRecord framing, the CRC-32C and, for the black box, whether a float array is finite) is
made in one call of the C extension `_encode.frame_array`, with the GIL released over
large arrays: in Python that was some sixty bytecodes and a dozen calls per array, holding
the GIL. Values it leaves (strings, bfloat16, arrays that are not contiguous) are framed
in Python as before. Between values the framer hands the GIL over on purpose once it has
held it for `yield_every_s` (see `_GilYield`), instead of making the training thread wait
out the interpreter's 5 ms switch interval.

A held batch of scalar steps (held_steps.py: the losses of a hundred steps at a time) is
framed in one call of the C extension `_encode` where it is built (`frame_held`): the same
bytes, without the few dozen bytecodes per value that the training thread would otherwise
wait for at the GIL."""

from __future__ import annotations

import functools
import json
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from .. import events, layout, records
from ..compiled import load_extension
from ..modes import ModeKeys
from ..store.direct_io import PLACE_FROM, buffer_address
from ..tf_dtypes import NUMPY_TO_DT
from .host_arena import Scanned

logger = logging.getLogger("stepscope")

# Held scalar steps and arrays framed in C, or None: not built, or $STEPSCOPE_PURE_PYTHON.
_encode = load_extension(__package__, "_encode")


def _buffer_formats() -> dict[str, int]:
    """The TensorFlow dtype code of each buffer format a numpy array of a savable dtype
    exports (int64 is "l" and "q", one dtype under two type characters), for frame_array."""
    formats = {}
    for char in np.typecodes["All"]:
        dtype = np.dtype(char)
        if dtype.kind not in "USOV" and dtype in NUMPY_TO_DT:
            formats[memoryview(np.empty(0, dtype)).format] = NUMPY_TO_DT[dtype]  # type: ignore[arg-type]
    return formats


_FORMATS = _buffer_formats()
# Index i: (the name, its JSON) of mode number i, as a step's index gives it.
_MODE_NAMES = tuple(
    (ModeKeys(i).name, json.dumps(ModeKeys(i).name).encode()) if i in ModeKeys._value2member_map_ else None for i in range(max(ModeKeys) + 1)
)

# The most the framer holds the GIL between hand-overs, and the pause that hands it over:
# long enough for a waiting thread to wake and take it (a zero sleep is re-won by the
# thread that released it before the waiter is scheduled).
YIELD_EVERY_S = 0.0002
YIELD_PAUSE_S = 0.00005


# A payload at least this large has its CRC computed with the GIL released (the crc32c
# extension releases it from 32 KiB): the training thread has had its turn during it.
GIL_RELEASED_FROM = 64 * 1024


class _GilYield:
    """Counts the time the calling thread has held the GIL since it last let go of it (a
    pause, or C work that releases it) and pauses once it passes the bound."""

    __slots__ = ("_every", "_since")

    def __init__(self, every_s: float) -> None:
        self._every = every_s
        self._since = time.perf_counter()

    def let_go(self) -> None:
        """The GIL was just released by other work: no pause owed for the time before."""
        self._since = time.perf_counter()

    def __call__(self) -> None:
        now = time.perf_counter()
        if now - self._since >= self._every:
            time.sleep(YIELD_PAUSE_S)
            self._since = time.perf_counter()


_FINITE_FROM = 9  # bytes: a float array this large has its finiteness judged by frame_array
_ENTRY_KEYS = ("tensorname", "start_idx", "length")  # an index entry's keys, in order (frame_values makes them)


def as_array(value: Any) -> np.ndarray:
    """A step value as a numpy array (a PendingValue or Deferred resolved here)."""
    if hasattr(value, "resolve"):
        value = value.resolve()
    array = np.asarray(value)
    if array.dtype == object:
        raise TypeError(f"cannot save an object array ({array.shape}); convert it to numbers or strings")
    return array


@dataclass
class FramedHeld:
    """A held batch framed at once (`StepFramer.frame_held`): the event file `event_key`
    holding every record, and per step (in order) its index file's body and its step-table
    entry (as StepTables keeps them)."""

    event_key: str
    data: bytes
    bodies: list[bytes]
    entries: list[tuple[Any, ...]]


class StepFramer:
    """Frames one step's tensors into an event file's buffers and its index entries.
    `drop(step, name, exc)` is told of each value that cannot be saved (that value only is
    skipped); `placeholder_crc` writes smdebug's constant instead of payload CRCs."""

    def __init__(self, worker: str, drop: Callable[[int, str, BaseException], None], *, placeholder_crc: bool = False, yield_every_s: float = YIELD_EVERY_S):
        self.worker = worker
        self._drop = drop
        self._placeholder_crc = placeholder_crc
        self._yield_every_s = yield_every_s
        self._json_names: set[str] = set()  # names known to go into the index's JSON
        # frame_held's value heads: name -> (type of its values, the Value's bytes up to the
        # content, the name as JSON, the content's size, a 0-d array's dtype), made by `_held_head`.
        self._held_heads: dict[str, tuple[type, bytes, bytes, int, np.dtype | None]] = {}
        # Arrays framed in C (`_encode.frame_array`), or None: each in Python; and a step's
        # values in one C loop around it (`_encode.frame_values`), or None: a Python loop.
        # (Attributes, so that a benchmark can compare them in one process.)
        self.frame_array = getattr(_encode, "frame_array", None)
        self.frame_values = getattr(_encode, "frame_values", None)

    def _checked_name(self, name: str) -> str:
        # The index must hold the name too: refuse what JSON cannot encode (a lone
        # surrogate) before the record is kept. Checked once per name.
        if name not in self._json_names:
            json.dumps(name, ensure_ascii=False).encode()
            self._json_names.add(name)
        return name

    def frame(self, step: int, mode: ModeKeys, mode_step: int, tensors: Mapping[str, Any], shapes: Mapping[str, Sequence[int]],
              arrays: dict[str, np.ndarray] | None = None, *, parts: list[Any] | None = None, event_key: str | None = None,
              offset: int = 0, finite: dict[str, bool] | None = None, align: int = 0) -> tuple[list[Any], dict[str, Any]]:
        """(the event file's buffers, its index). `arrays`, when given, receives each saved
        tensor's array (for step listeners), and `finite` whether a large float array holds
        no NaN or infinity, where its CRC's pass found that out (`_scanned`). With `parts`
        (the buffers of event file `event_key` so far, `offset` bytes), the step's records
        are appended to them: several steps in one file (Writer.write_steps). With `align`
        (the store's `data_alignment`), a tensor of `PLACE_FROM` bytes or more whose memory
        starts on that alignment is put at a file offset aligned alike, behind a padding
        record (`_padded`): the direct write takes it from where it is."""
        if parts is None or event_key is None:
            event_key = layout.event_file_key(step, self.worker)
            # (smdebug's reader, going through a file, wants its constant on every record)
            parts = records.frame([events.file_version_event()], placeholder_crc=self._placeholder_crc)
            offset = sum(len(p) for p in parts)
        payload_index: list[dict[str, Any]] = []
        kept_shapes = dict(shapes)
        wall_time = time.time()  # one time for the step's records: they are framed together
        pause = _GilYield(self._yield_every_s)
        frame_array = self.frame_array
        # (the Event's fields every record of the step shares: frame_array's and padding's)
        prefix, metadata = events.event_fields(step, mode, mode_step, wall_time)
        if frame_array is not None:
            # Judged in the CRC's pass for every float array of more than 8 bytes: the black
            # box then reads none of them again (for a bias, its two numpy reductions cost
            # more than the tensor's framing). One-element values (a loss) it keeps as their
            # number, read there.
            finite_from = _FINITE_FROM if finite is not None else -1
        # The values frame_array frames go through one C loop (`_encode.frame_values`) from
        # the step's second save on (their names known to the index); it hands back each
        # value it leaves, which the lines below frame, and stops for the GIL's pauses.
        frame_values = self.frame_values if frame_array is not None else None
        items = list(tensors.items())
        i, count = 0, len(items)
        while i < count:
            if frame_values is not None:
                i, offset, owed = frame_values(items, i, parts, payload_index, arrays, finite, self._json_names, Scanned, prefix, metadata, _FORMATS,
                                               self._placeholder_crc, finite_from, align, PLACE_FROM, offset, self._yield_every_s, _ENTRY_KEYS)  # fmt: skip
                if owed:
                    pause()
                    continue
                if i >= count:
                    break
            name, value = items[i]
            i += 1
            try:
                # A snapshot whose copy took its CRC (host_arena.Scanned): framed unread.
                scan = value.scan if value.__class__ is Scanned else None
                array = as_array(value)
                made = None
                if frame_array is not None and type(array) is np.ndarray:
                    # The same bytes as the lines below, in one call (None: those lines).
                    made = frame_array(name, array, prefix, metadata, _FORMATS, self._placeholder_crc, finite_from, scan)
                if made is not None:
                    framed, length, checked = made
                    if checked is not None:
                        finite[name] = checked  # type: ignore[index]
                else:
                    payload = events.encode_tensor_event(name, array, step, mode, mode_step, wall_time)
                    crc = None
                    if array.nbytes >= GIL_RELEASED_FROM and len(payload) == 3:
                        crc = self._scanned(name, array, payload, finite)
                    framed, length = records.frame_sized(payload, placeholder_crc=self._placeholder_crc, crc=crc)
                self._checked_name(name)
            except Exception as exc:
                # One value that cannot be saved costs that tensor, never the step or the run.
                self._drop(step, name, exc)
                kept_shapes.pop(name, None)
                continue
            if align and array.nbytes >= PLACE_FROM:
                padding = self._padded(framed, offset, align, prefix)
                if padding is not None:
                    parts.append(padding)
                    offset += len(padding)
            if arrays is not None:
                arrays[name] = array
            payload_index.append({"tensorname": name, "start_idx": offset, "length": length})
            parts.extend(framed)
            offset += length
            if array.nbytes >= GIL_RELEASED_FROM:
                pause.let_go()  # (a sleep here would only wake this thread once more per tensor)
            else:
                pause()
        index = {
            "meta": {"mode": mode.name, "mode_step": mode_step, "event_file_name": event_key},
            "tensor_payload": payload_index,
            "shape_payload": self._shape_payload(step, kept_shapes),
        }
        return parts, index

    def _padded(self, framed: list[Any], offset: int, align: int, prefix: bytes) -> bytes | None:
        """The padding record (events.padding_record) that puts the tensor bytes of record
        `framed`, due at file offset `offset`, on a multiple of `align`; None where those
        bytes are not one part starting on that alignment in memory (a copy of a
        non-contiguous array, say, which the direct write stages anyway) or need no padding."""
        before = 0
        for part in framed:
            size = part.nbytes if type(part) is memoryview else len(part)
            if size >= PLACE_FROM:
                if buffer_address(part) % align:
                    return None
                gap = -(offset + before) % align
                if not gap:
                    return None
                padding = events.padding_record(gap, prefix, placeholder_crc=self._placeholder_crc)
                # (too small a gap for a record, or a size no record has: one block more)
                return padding if padding is not None else events.padding_record(gap + align, prefix, placeholder_crc=self._placeholder_crc)
            before += size
        return None

    def _scanned(self, name: str, array: np.ndarray, payload: list[Any], finite: dict[str, bool] | None) -> int | None:
        """The CRC-32C of a large tensor's record payload (event head, the tensor's bytes, tail)
        from one pass of `_encode.scan` over the tensor's bytes, which also tells `finite`
        whether a float array holds only finite numbers (the black box's question, which
        would otherwise take two more passes over the same megabytes); None where the
        extension is not there, the CPU cannot, or the payload's CRC is smdebug's constant
        (then only the check is made, where `finite` asks)."""
        if _encode is None:
            return None
        kind = array.dtype
        itemsize = kind.itemsize if finite is not None and kind.kind == "f" and kind.itemsize in (2, 4, 8) and kind.isnative else 0
        head, content, tail = payload
        crc = None if self._placeholder_crc else records.crc32c(head)
        scanned = _encode.scan(content, crc, itemsize) if crc is not None or itemsize else None
        if scanned is None:
            return None
        if itemsize:
            finite[name] = scanned[1]  # type: ignore[index]
        return None if crc is None else records.crc32c(tail, scanned[0])

    def frame_held(self, steps: list[tuple[int, ModeKeys, int, Mapping[str, Any], Mapping[str, Sequence[int]]]]) -> FramedHeld | None:
        """Held steps (Writer.write_held_steps's) framed in C, as `frame` would frame them one
        after another into one event file: or None, and nothing kept, where the C extension
        is not there or the steps hold anything but numpy scalars, 0-d arrays and floats of
        plain numeric dtypes (a larger array, a shape, a name the index cannot hold), which `frame`
        then frames (and reports what it cannot save)."""
        if _encode is None or not steps or type(steps[0][0]) is not int:
            return None
        event_key = layout.event_file_key(steps[0][0], self.worker)
        wall_time = time.time()  # (one time for the batch's records: they are framed together)
        (head,) = records.frame([events.file_version_event(wall_time)], placeholder_crc=self._placeholder_crc)
        try:
            made = _encode.frame_held(steps, self._held_heads, self._held_head, head, event_key, json.dumps(event_key).encode(), _MODE_NAMES,
                                       wall_time, self._placeholder_crc)  # fmt: skip
        except Exception as exc:  # (out of memory, say): the Python path, which drops values one by one, frames them
            logger.debug("stepscope: held steps framed in Python (%r)", exc)
            return None
        return None if made is None else FramedHeld(event_key, *made)

    def _held_head(self, name: str, value: Any) -> tuple[type, bytes, bytes, int, np.dtype | None] | None:
        """frame_held's head for `value` saved as `name` (see `_held_heads`), or None: the
        Python path frames such a value. A 0-d array's entry holds its dtype, which frame_held
        checks too (a scalar's type says its dtype)."""
        kind = type(value)
        if kind is np.ndarray:
            dtype = value.dtype
            if value.ndim or dtype.kind not in "biuf" or not dtype.isnative:
                return None
            known: np.dtype | None = dtype
        elif kind is float or (issubclass(kind, np.generic) and np.dtype(kind).kind in "biuf"):
            dtype, known = np.dtype(kind), None
        else:
            return None
        try:
            head = events.small_value_head(self._checked_name(name), dtype, (), dtype.itemsize)
        except Exception:
            return None
        return kind, head, json.dumps(name).encode(), dtype.itemsize, known

    def _shape_payload(self, step: int, shapes: Mapping[str, Sequence[int]]) -> list[dict[str, Any]]:
        out = []
        for name, shape in shapes.items():
            try:
                out.append({"tensorname": self._checked_name(name), "originalname": name, "shape": [int(d) for d in shape]})
            except Exception as exc:
                self._drop(step, name, exc)
        return out


def index_json(index: dict[str, Any]) -> bytes:
    """`json.dumps(index).encode()` for a step's index (as `StepFramer.frame` builds it),
    byte for byte. An index without shapes is filled into a template made once per mode
    and tensor names (the step's event file and numbers filled in), which costs a fifth of
    json.dumps: the writer makes one index per step."""
    meta, payload = index["meta"], index["tensor_payload"]
    if index["shape_payload"] or len(index) != 3 or len(meta) != 3:
        return json.dumps(index).encode()
    event_file_name = meta["event_file_name"]
    if type(event_file_name) is not str:
        return json.dumps(index).encode()
    # (made once per mode and tensor names: each step's event file is new, so it is filled in)
    template = _index_template(meta["mode"], tuple([entry["tensorname"] for entry in payload]))
    values: list[Any] = [meta["mode_step"]]
    for entry in payload:
        values += (entry["start_idx"], entry["length"])
    if not all(type(v) is int for v in values):
        return json.dumps(index).encode()
    values.insert(1, json.dumps(event_file_name))
    return (template % tuple(values)).encode()


@functools.lru_cache(maxsize=64)
def _index_template(mode: str, names: tuple[str, ...]) -> str:
    # What json.dumps writes (its default separators, ASCII escapes), with %d where the
    # numbers go and %s where the event file's name goes as JSON: the strings are escaped
    # by json.dumps itself.
    def text(value: str) -> str:
        return json.dumps(value).replace("%", "%%")

    entries = ", ".join(f'{{"tensorname": {text(name)}, "start_idx": %d, "length": %d}}' for name in names)
    return f'{{"meta": {{"mode": {text(mode)}, "mode_step": %d, "event_file_name": %s}}, "tensor_payload": [{entries}], "shape_payload": []}}'


class StepTables:
    """A step table repeats the index entries of up to STEPS_PER_TABLE steps in one file, so
    that a reader opens a long job with a few reads instead of one per step. The per-step
    index files stay the source of truth (smdebug reads those); a table is published after
    the index files it repeats, and never rewritten."""

    def __init__(self, worker: str) -> None:
        self.worker = worker
        # The current block's steps, each kept as a tuple of strings, ints and tuples:
        # held for up to STEPS_PER_TABLE steps, dicts and lists would each be tracked by
        # the garbage collector and, once old, count towards its full collections (a
        # pass over every object of the training process, with the GIL held); such tuples
        # are untracked. (step, mode, mode_step, names, starts, lengths, shapes, event)
        self._entries: list[tuple[Any, ...]] = []

    def add(self, step: int, index: dict[str, Any]) -> tuple[str, bytes] | None:
        """Add a published step; returns the finished block's table (key, body) when `step`
        begins a new block, for the caller to publish."""
        done = None
        if self._entries and step // layout.STEPS_PER_TABLE != self._entries[0][0] // layout.STEPS_PER_TABLE:
            done = self.take()
        meta, payload = index["meta"], index["tensor_payload"]
        # (shapes as text: nested tuples would take the collector a pass per level to untrack)
        shapes = json.dumps({s["tensorname"]: s["shape"] for s in index["shape_payload"]}) if index["shape_payload"] else None
        event_key = meta["event_file_name"]
        if event_key == layout.event_file_key(step, self.worker):
            event_key = None  # else a batch's shared event file (Writer.write_steps)
        self._entries.append((
            step, meta["mode"], meta["mode_step"], tuple([p["tensorname"] for p in payload]), tuple([p["start_idx"] for p in payload]),
            tuple([p["length"] for p in payload]), shapes, event_key,
        ))
        return done

    def add_entries(self, entries: Sequence[tuple[Any, ...]]) -> list[tuple[str, bytes]]:
        """`add` for published steps whose entries are made already (FramedHeld's), in step
        order; returns the tables of the blocks they finished, for the caller to publish."""
        per_table = layout.STEPS_PER_TABLE
        block = entries[0][0] // per_table if entries else None
        if block is not None and entries[-1][0] // per_table == block and (not self._entries or self._entries[0][0] // per_table == block):
            self._entries.extend(entries)  # (the usual case: all in the current block)
            return []
        done = []
        for entry in entries:
            if self._entries and entry[0] // per_table != self._entries[0][0] // per_table:
                done.append(self.take())
            self._entries.append(entry)
        return [table for table in done if table is not None]

    def take(self) -> tuple[str, bytes] | None:
        """The current block's table (key, body), emptied; None when it holds no step."""
        if not self._entries:
            return None
        entries, self._entries = self._entries, []
        return layout.step_table_key(self.worker, entries[0][0], entries[-1][0]), self._body(entries)

    def held_table(self, entries: Sequence[tuple[Any, ...]]) -> tuple[str, bytes]:
        """The held table (key, body) of a held batch's entries (FramedHeld's): the same
        format as a block's table, under `layout.held_table_key`."""
        return layout.held_table_key(self.worker, entries[0][0], entries[-1][0]), self._body(entries)

    def _body(self, entries: Sequence[tuple[Any, ...]]) -> bytes:
        # Steps of a block usually save the same tensors: store each name list once.
        layouts: dict[tuple[str, ...], int] = {}
        table = []
        for step, mode, mode_step, names, starts, lengths, shapes, event_key in entries:
            row: dict[str, Any] = {"step": step, "mode": mode, "mode_step": mode_step, "starts": list(starts), "lengths": list(lengths)}
            if shapes is not None:
                row["shapes"] = json.loads(shapes)
            if event_key is not None:
                row["event"] = event_key
            row["layout"] = layouts.setdefault(names, len(layouts))
            table.append(row)
        body = {"version": 1, "worker": self.worker, "layouts": [list(names) for names in layouts], "steps": table}
        return json.dumps(body, separators=(",", ":")).encode()


__all__ = ["FramedHeld", "StepFramer", "StepTables", "as_array", "index_json", "YIELD_EVERY_S"]
