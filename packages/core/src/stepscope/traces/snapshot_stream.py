"""Allocator snapshots too large to load whole (a `_dump_snapshot` pickle of several GB):
summarised in one streamed read with memory bounded by the summary, not the file.

The pickle is read twice as a stream (gzip or plain, local or s3://), never held whole:
1. an opcode walk that only notes which memo slots the pickle refers back to (a pickle
   memoizes every object, but refers back only to the ones it shares: strings, frames);
2. a restricted unpickler (plain data only: any class, function or extension opcode is
   refused, so a hostile file cannot run code) that keeps only those memo slots and, as
   each trace entry, block and segment is appended to its list, folds it into running
   aggregates and drops it.

What stays in memory: the distinct stacks (as strings, each once), the shared objects the
pickle refers back to, the allocations live at any moment of the replay (per device), the
entries around the last OOM, and a timeline of at most `max_points` points per device. The
results are those of `AllocatorSnapshot` (same columns; tests hold the two together), less
what needs the whole history (`timeline` is bucketed here, `around` is fixed to the last
OOM, else the end). Format and bounds in docs/traces.md ("Allocator snapshots")."""

from __future__ import annotations

import gzip
import os
import struct
import time
from collections import deque
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import IO, Any

import pandas as pd

from ..exceptions import CorruptRecord
from .snapshot import _INTERNAL_PARTS, _INTERNAL_SUFFIXES, BEFORE_TRACE, NO_FRAME, SUMMARY_COLUMNS, frame_labels

_CHUNK = 4 << 20
_PEAK_LOG_LIMIT = 65_536  # deltas kept after a peak before its per-stack state is copied out
_ALLOC, _FREE, _OOM = "alloc", "free_completed", "oom"
_unpack_i, _unpack_d, _unpack_H, _unpack_I, _unpack_Q = (struct.Struct(f).unpack_from for f in ("<i", ">d", "<H", "<I", "<Q"))

# Opcodes (pickle.py's names). Those that build objects of a class, call or extend are refused.
_REFUSED = {
    ord("c"): "GLOBAL", 0x93: "STACK_GLOBAL", ord("R"): "REDUCE", ord("b"): "BUILD", ord("i"): "INST", ord("o"): "OBJ",
    0x81: "NEWOBJ", 0x92: "NEWOBJ_EX", ord("P"): "PERSID", ord("Q"): "BINPERSID", 0x82: "EXT1", 0x83: "EXT2", 0x84: "EXT4",
    0x97: "NEXT_BUFFER", 0x98: "READONLY_BUFFER",
}  # fmt: skip
# Argument sizes for the opcode walk: fixed bytes, or ("len", size of the length prefix).
_FIXED = {
    0x80: 1, ord("K"): 1, ord("M"): 2, ord("J"): 4, ord("G"): 8, ord("q"): 1, ord("r"): 4, ord("h"): 1, ord("j"): 4, 0x8A: None,
    0x8B: None, ord("N"): 0, 0x88: 0, 0x89: 0, ord("("): 0, ord("}"): 0, ord("]"): 0, ord(")"): 0, ord("t"): 0, 0x85: 0, 0x86: 0,
    0x87: 0, ord("a"): 0, ord("e"): 0, ord("s"): 0, ord("u"): 0, 0x94: 0, ord("0"): 0, ord("1"): 0, ord("2"): 0, ord("l"): 0,
    ord("d"): 0, 0x8F: 0, 0x90: 0, 0x91: 0, ord("."): 0, 0x95: 8,
}  # fmt: skip
_PREFIXED = {0x8C: 1, ord("X"): 4, 0x8D: 8, ord("C"): 1, ord("B"): 4, 0x8E: 8, 0x96: 8, 0x8A: 1, 0x8B: 4}
_MARK = object()
_MARGIN = 1 << 16  # bytes kept readable past an opcode: every fixed argument fits
# Per opcode: its fixed argument size, or -width of its length prefix, or -99: not taken.
_ARG = [-99] * 256
for _op, _size in _FIXED.items():
    _ARG[_op] = _size if _size is not None else -99
for _op, _width in _PREFIXED.items():
    _ARG[_op] = -_width


class _Source:
    """The decompressed bytes of a snapshot file, read forward in chunks."""

    def __init__(self, path: str, max_bytes: int | None):
        self.path = path
        self.max_bytes = max_bytes
        self.read_bytes = 0

    def open(self) -> tuple[IO[bytes], IO[bytes]]:
        """(the decompressed stream, the file under it)."""
        if self.path.startswith("s3://"):
            from ..store import open_store

            parent, _, name = self.path.rpartition("/")
            raw: IO[bytes] = open_store(parent).open_file(name)
        else:
            raw = open(self.path, "rb")  # noqa: SIM115 - closed in chunks()
        head = raw.read(2)
        raw.seek(0)
        return (gzip.GzipFile(fileobj=raw) if head == b"\x1f\x8b" else raw), raw  # type: ignore[return-value]

    def chunks(self) -> Iterator[bytes]:
        handle, raw = self.open()
        try:
            self.read_bytes = 0
            while True:
                try:
                    chunk = handle.read(_CHUNK)
                except (OSError, EOFError) as exc:
                    raise CorruptRecord(self.path, None, f"bad gzip ({exc})") from None
                if not chunk:
                    return
                self.read_bytes += len(chunk)
                if self.max_bytes is not None and self.read_bytes > self.max_bytes:
                    raise CorruptRecord(self.path, None, f"over {self.max_bytes:,} bytes once decompressed (max_bytes)")
                yield chunk
        finally:
            handle.close()
            raw.close()


class _Buffer:
    """A window over the chunks: `need(pos, n)` makes bytes [pos, pos+n) readable and
    returns the (possibly moved) buffer and position."""

    def __init__(self, chunks: Iterator[bytes], where: str):
        self.chunks = chunks
        self.where = where
        self.data = b""
        self.eof = False
        self.consumed = 0  # bytes dropped before data[0]

    def need(self, pos: int, n: int) -> tuple[bytes, int]:
        data, pos = self.more(pos, n)
        if pos + n > len(data):
            raise CorruptRecord(self.where, None, f"the pickle ends early (at byte {self.consumed + len(data):,})")
        return data, pos

    def more(self, pos: int, n: int) -> tuple[bytes, int]:
        """As `need`, but at the end of the stream returns what there is."""
        data = self.data
        while pos + n > len(data) and not self.eof:
            chunk = next(self.chunks, None)
            if chunk is None:
                self.eof = True
                continue
            self.consumed += pos
            data = data[pos:] + chunk
            pos = 0
        self.data = data
        return data, pos

    def limit(self) -> int:
        """The last position from which `_MARGIN` bytes are readable (all of them at the end)."""
        return len(self.data) if self.eof else len(self.data) - _MARGIN


def _walk_refs(source: _Source) -> set[int]:
    """Pass 1: the memo slots the pickle refers back to (GET / BINGET / LONG_BINGET)."""
    buffer = _Buffer(source.chunks(), source.path)
    refs: set[int] = set()
    data, pos = buffer.more(0, _MARGIN)
    limit = buffer.limit()
    arg = _ARG
    try:
        while True:
            if pos > limit:
                data, pos = buffer.more(pos, _MARGIN)
                limit = buffer.limit()
            op = data[pos]
            size = arg[op]
            if op == 0x68:  # BINGET
                refs.add(data[pos + 1])
            elif op == 0x6A:  # LONG_BINGET
                refs.add(_unpack_I(data, pos + 1)[0])
            elif size < 0:  # a length, then that many bytes
                if size == -99:
                    raise _refused(op, source.path)
                width = -size
                length = data[pos + 1] if width == 1 else (_unpack_I(data, pos + 1)[0] if width == 4 else _unpack_Q(data, pos + 1)[0])
                size = width + length
                if pos + 1 + size > len(data):
                    data, pos = buffer.need(pos, 1 + size)
                    limit = buffer.limit()
            elif op == 0x2E:  # STOP
                return refs
            pos += 1 + size
    except (IndexError, struct.error):
        raise CorruptRecord(source.path, None, f"the pickle ends early (at byte {buffer.consumed + pos:,})") from None


def _refused(op: int, where: str) -> CorruptRecord:
    name = _REFUSED.get(op)
    if name is not None:
        return CorruptRecord(where, None, f"the pickle uses {name}: an allocator snapshot holds plain data only (refused, nothing run)")
    return CorruptRecord(where, None, f"not an allocator snapshot pickle (opcode 0x{op:02x} is not one this reader takes)")


# --- aggregates -------------------------------------------------------------------------


class _StackTable:
    """Each distinct stack once, keyed by its frames' (filename, line, name)."""

    def __init__(self, cache_size: int = 4096) -> None:
        self.index: dict[tuple[Any, ...], int] = {}
        self.texts: list[tuple[str, ...]] = []
        self.user: list[str] = []
        # By the frame dicts' identities: a snapshot shares its frame dicts between entries.
        # The cache holds the frames it keys (so an identity is not reused while cached) and
        # is emptied when full (unshared frames then cost a lookup by content each).
        self._by_ids: dict[tuple[int, ...], tuple[int, list[Any]]] = {}
        self._cache_size = cache_size

    def add(self, frames: Any) -> int:
        if type(frames) is not list or not frames:
            return -1
        ids = tuple(map(id, frames))
        cached = self._by_ids.get(ids)
        if cached is not None:
            return cached[0]
        found = self._by_content(frames)
        if len(self._by_ids) >= self._cache_size:
            self._by_ids.clear()
        self._by_ids[ids] = (found, list(frames))
        return found

    def _by_content(self, frames: list[Any]) -> int:
        key = tuple((f.get("filename", "?"), f.get("line", "?"), f.get("name", "?")) if isinstance(f, Mapping) else ("?", "?", "?") for f in frames)
        found = self.index.get(key)
        if found is None:
            found = self.index[key] = len(self.texts)
            texts = tuple("?" if k == ("?", "?", "?") and not isinstance(f, Mapping) else f"{k[2]} ({k[0]}:{k[1]})" for k, f in zip(key, frames))
            self.texts.append(texts)
            self.user.append(_user_of(key, texts))
        return found


def _user_of(key: tuple[Any, ...], texts: tuple[str, ...]) -> str:
    for (filename, _, _), text in zip(key, texts):
        name = str(filename)
        if name in ("", "?", "??") or name.endswith(_INTERNAL_SUFFIXES) or any(part in name for part in _INTERNAL_PARTS):
            continue
        return text
    return texts[0] if texts else NO_FRAME


def _add(table: dict[int, list[int]], stack: int, size: int, count: int) -> None:
    cell = table.get(stack)
    if cell is None:
        table[stack] = [size, count]
    else:
        cell[0] += size
        cell[1] += count


@dataclass
class _Blocks:
    """One segment's blocks."""

    allocated: int = 0
    requested: int = 0
    cached_free: int = 0
    largest_free: int = 0
    active: int = 0  # allocated or awaiting a free: the replay's end point
    live: dict[int, list[int]] = field(default_factory=dict)  # stack -> [bytes, blocks] of active_allocated


@dataclass
class _Trace:
    """One device's history, replayed as it streams by."""

    around: int
    max_points: int
    entries: int = 0
    ooms: int = 0
    oom_request: int = 0
    net: int = 0  # the replay's active bytes, less the unknown start
    peak: int | None = None
    peak_index: int = -1
    peak_time: int = -1
    live: dict[int, list[tuple[int, int]]] = field(default_factory=dict)  # addr -> [(size, stack)] in order
    by_stack: dict[int, list[int]] = field(default_factory=dict)  # stack -> [bytes, blocks] live now
    log: list[tuple[int, int, int]] | None = field(default_factory=list)  # deltas since the peak (None: copied out)
    at_peak: dict[int, list[int]] | None = None
    recent: deque[tuple[Any, ...]] = field(default_factory=deque)
    window: list[tuple[Any, ...]] | None = None  # the entries around the last OOM
    after: int = 0  # entries still to add after that OOM
    points: list[list[int]] = field(default_factory=list)  # [first index, time_us, highest net]
    bucket: int = 1

    def __post_init__(self) -> None:
        self.recent = deque(maxlen=self.around + 1)

    def add(self, entry: Mapping[str, Any], stack: int, where: str) -> None:
        index = self.entries
        self.entries += 1
        action = entry.get("action")
        if not isinstance(action, str):
            raise CorruptRecord(where, None, f"trace entry {index} has no 'action'")
        time_us, addr, size = entry.get("time_us", index), entry.get("addr", -1), entry.get("size", 0)
        if type(time_us) is not int or type(addr) is not int or type(size) is not int:
            for name, value in (("time_us", time_us), ("addr", addr), ("size", size)):
                if type(value) is not int:
                    raise CorruptRecord(where, None, f"trace entry {index} {name} is {value!r}, not an integer")
        row = (index, time_us, action, addr, size, stack)
        if self.window is not None and self.after:
            self.window.append(row)
            self.after -= 1
        self.recent.append(row)
        if action == _OOM:
            self.ooms += 1
            self.oom_request = max(self.oom_request, size)
            self.window, self.after = list(self.recent), self.around
        elif action == _ALLOC:
            self.live.setdefault(addr, []).append((size, stack))
            self._change(stack, size, 1)
            self._moved(index, time_us)
        elif action == _FREE:
            queue = self.live.get(addr)
            if queue:
                _, was = queue.pop(0)
                if not queue:
                    del self.live[addr]
                self._change(was, -size, -1)
            else:  # allocated before the history began
                self._change(None, -size, 0)
            self._moved(index, time_us)

    def _change(self, stack: int | None, size: int, count: int) -> None:
        self.net += size
        if stack is None:
            return
        _add(self.by_stack, stack, size, count)
        log = self.log
        if log is not None:
            log.append((stack, size, count))
            if len(log) > _PEAK_LOG_LIMIT:
                self.at_peak, self.log = self._peak_state(), None

    def _moved(self, index: int, time_us: int) -> None:
        if self.peak is None or self.net > self.peak:
            self.peak, self.peak_index, self.peak_time = self.net, index, time_us
            self.log, self.at_peak = [], None
        points = self.points
        if points and index - points[-1][0] < self.bucket:
            if self.net > points[-1][2]:
                points[-1][1:] = [time_us, self.net]
            return
        points.append([index, time_us, self.net])
        if len(points) > self.max_points:  # halve: neighbours merge, keeping each pair's highest
            merged = [max(points[i : i + 2], key=lambda p: p[2]) for i in range(0, len(points), 2)]
            for i, point in enumerate(merged):
                point[0] = points[2 * i][0]
            self.points, self.bucket = merged, self.bucket * 2

    def _peak_state(self) -> dict[int, list[int]]:
        if self.log is None:
            return self.at_peak or {}
        state = {stack: list(cell) for stack, cell in self.by_stack.items()}
        for stack, size, count in self.log:
            _add(state, stack, -size, -count)
        return state


class _Aggregator:
    """Folds trace entries, blocks and segments in as the unpickler appends them."""

    def __init__(self, where: str, around: int, max_points: int):
        self.where = where
        self.stacks = _StackTable()
        self.traces: dict[int, _Trace] = {}  # by id of the device's (emptied) list
        self.blocks: dict[int, _Blocks] = {}  # by id of the segment's (emptied) blocks list
        self.devices: dict[int, dict[str, Any]] = {}
        self.around, self.max_points = around, max_points

    def take(self, container: list[Any], item: Any) -> bool:
        """True when `item` (appended to `container`) was folded in and is to be dropped."""
        if type(item) is not dict:
            return False
        if "action" in item:
            trace = self.traces.get(id(container))
            if trace is None:
                trace = self.traces[id(container)] = _Trace(self.around, self.max_points)
            trace.add(item, self.stacks.add(item.get("frames")), self.where)
            return True
        if "blocks" in item and "total_size" in item:
            self._segment(item)
            return True
        if "state" in item and "size" in item:
            blocks = self.blocks.get(id(container))
            if blocks is None:
                blocks = self.blocks[id(container)] = _Blocks()
            self._block(blocks, item)
            return True
        return False

    def _block(self, blocks: _Blocks, block: Mapping[str, Any]) -> None:
        size = block["size"]
        if isinstance(size, bool) or not isinstance(size, int):
            raise CorruptRecord(self.where, None, f"a block size is {size!r}, not an integer")
        state = str(block.get("state", ""))
        if state == "active_allocated":
            blocks.allocated += size
            blocks.requested += int(block.get("requested_size", size))
            _add(blocks.live, self.stacks.add(block.get("frames")), size, 1)
        elif state == "inactive":
            blocks.cached_free += size
            blocks.largest_free = max(blocks.largest_free, size)
        if state.startswith("active"):
            blocks.active += size

    def _segment(self, segment: Mapping[str, Any]) -> None:
        device, total = segment.get("device", 0), segment.get("total_size")
        for name, value in (("device", device), ("total_size", total)):
            if isinstance(value, bool) or not isinstance(value, int):
                raise CorruptRecord(self.where, None, f"a segment's {name} is {value!r}, not an integer")
        listed = segment["blocks"]
        blocks = self.blocks.pop(id(listed), None) if isinstance(listed, list) else None
        if isinstance(listed, list) and listed:  # blocks this reader did not recognise
            raise CorruptRecord(self.where, None, "a segment's blocks are not dicts with 'size' and 'state'")
        row = self.devices.setdefault(device, {"segments": 0, "reserved": 0, "blocks": _Blocks()})
        row["segments"] += 1
        row["reserved"] += total
        if blocks is not None:
            merged: _Blocks = row["blocks"]
            merged.allocated += blocks.allocated
            merged.requested += blocks.requested
            merged.cached_free += blocks.cached_free
            merged.largest_free = max(merged.largest_free, blocks.largest_free)
            merged.active += blocks.active
            for stack, (size, count) in blocks.live.items():
                _add(merged.live, stack, size, count)


# --- pass 2: the restricted unpickler -----------------------------------------------------


def _unpickle(source: _Source, refs: set[int], take: Callable[[list[Any], Any], bool]) -> tuple[Any, int]:
    """The pickle's top object, with what `take` folded in left out of its lists; and how
    many memo slots were kept."""
    buffer = _Buffer(source.chunks(), source.path)
    stack: list[Any] = []
    marks: list[int] = []
    memo: dict[int, Any] = {}
    count = 0  # memo slots assigned so far
    data, pos = buffer.more(0, _MARGIN)
    limit = buffer.limit()
    push = stack.append
    where = source.path
    try:
        while True:
            if pos > limit:
                data, pos = buffer.more(pos, _MARGIN)
                limit = buffer.limit()
                if len(stack) > 1_000_000:  # (checked per chunk read: a step costs no more)
                    raise CorruptRecord(where, None, "the pickle's stack grows past a million objects")
            op = data[pos]
            pos += 1
            # (The most frequent first: a snapshot is mostly keys referred back to, stored
            # containers, integers and MARK / SETITEMS / APPENDS.)
            if op == 0x68:  # BINGET
                push(memo[data[pos]])
                pos += 1
            elif op == 0x94:  # MEMOIZE
                if count in refs:
                    memo[count] = stack[-1]
                count += 1
            elif op == 0x8A:  # LONG1
                length = data[pos]
                push(int.from_bytes(data[pos + 1 : pos + 1 + length], "little", signed=True))
                pos += 1 + length
            elif op == 0x4A:  # BININT
                push(_unpack_i(data, pos)[0])
                pos += 4
            elif op == 0x4B:  # BININT1
                push(data[pos])
                pos += 1
            elif op == 0x28:  # MARK
                marks.append(len(stack))
                push(_MARK)
            elif op == 0x7D:  # EMPTY_DICT
                push({})
            elif op == 0x5D:  # EMPTY_LIST
                push([])
            elif op == 0x75:  # SETITEMS
                start = marks.pop()
                target = stack[start - 1]
                items = stack[start + 1 :]
                del stack[start:]
                if type(target) is not dict or len(items) % 2:
                    raise CorruptRecord(where, None, "SETITEMS on something that is not a dict")
                for i in range(0, len(items), 2):
                    target[items[i]] = items[i + 1]
            elif op == 0x65:  # APPENDS
                start = marks.pop()
                target = stack[start - 1]
                items = stack[start + 1 :]
                del stack[start:]
                if type(target) is not list:
                    raise CorruptRecord(where, None, "APPENDS on something that is not a list")
                for item in items:
                    if not take(target, item):
                        target.append(item)
            elif op == 0x8C or op == 0x58 or op == 0x8D or op == 0x43 or op == 0x42 or op == 0x8E or op == 0x96:
                # SHORT_BINUNICODE, BINUNICODE, BINUNICODE8; SHORT_BINBYTES, BINBYTES, BINBYTES8, BYTEARRAY8
                width = 1 if op in (0x8C, 0x43) else 4 if op in (0x58, 0x42) else 8
                length = data[pos] if width == 1 else (_unpack_I(data, pos)[0] if width == 4 else _unpack_Q(data, pos)[0])
                pos += width
                if pos + length > len(data):
                    data, pos = buffer.need(pos, length)
                    limit = buffer.limit()
                raw = data[pos : pos + length]
                pos += length
                if op in (0x8C, 0x58, 0x8D):
                    try:
                        push(raw.decode("utf-8", "surrogatepass"))
                    except UnicodeDecodeError as exc:
                        raise CorruptRecord(where, None, f"a string is not UTF-8 ({exc})") from None
                else:
                    push(bytearray(raw) if op == 0x96 else raw)
            elif op == 0x4D:  # BININT2
                push(_unpack_H(data, pos)[0])
                pos += 2
            elif op == 0x6A:  # LONG_BINGET
                push(memo[_unpack_I(data, pos)[0]])
                pos += 4
            elif op == 0x47:  # BINFLOAT
                push(_unpack_d(data, pos)[0])
                pos += 8
            elif op == 0x4E:  # NONE
                push(None)
            elif op == 0x88 or op == 0x89:  # NEWTRUE, NEWFALSE
                push(op == 0x88)
            elif op == 0x85 or op == 0x86 or op == 0x87:  # TUPLE1..3
                n = op - 0x84
                items = stack[-n:]
                del stack[-n:]
                push(tuple(items))
            elif op == 0x29:  # EMPTY_TUPLE
                push(())
            elif op == 0x74 or op == 0x6C or op == 0x64 or op == 0x91:  # TUPLE, LIST, DICT, FROZENSET
                start = marks.pop()
                items = stack[start + 1 :]
                del stack[start:]
                if op == 0x74:
                    push(tuple(items))
                elif op == 0x6C:
                    push(items)
                elif op == 0x91:
                    push(frozenset(items))
                else:
                    push({items[i]: items[i + 1] for i in range(0, len(items) - 1, 2)})
            elif op == 0x61:  # APPEND
                item = stack.pop()
                target = stack[-1]
                if type(target) is not list:
                    raise CorruptRecord(where, None, "APPEND on something that is not a list")
                if not take(target, item):
                    target.append(item)
            elif op == 0x73:  # SETITEM
                value = stack.pop()
                key = stack.pop()
                target = stack[-1]
                if type(target) is not dict:
                    raise CorruptRecord(where, None, "SETITEM on something that is not a dict")
                target[key] = value
            elif op == 0x8B:  # LONG4
                length = _unpack_i(data, pos)[0]
                if length < 0:
                    raise CorruptRecord(where, None, "a negative LONG4 length")
                pos += 4
                if pos + length > len(data):
                    data, pos = buffer.need(pos, length)
                    limit = buffer.limit()
                push(int.from_bytes(data[pos : pos + length], "little", signed=True))
                pos += length
            elif op == 0x95:  # FRAME: a hint of the next bytes' size; nothing to do
                pos += 8
            elif op == 0x80:  # PROTO
                if data[pos] > 5:
                    raise CorruptRecord(where, None, f"pickle protocol {data[pos]} is newer than this reader")
                pos += 1
            elif op == 0x2E:  # STOP
                if len(stack) != 1 or marks:
                    raise CorruptRecord(where, None, "the pickle ends with an unbalanced stack")
                return stack[0], len(memo)
            elif op == 0x71 or op == 0x72:  # BINPUT, LONG_BINPUT
                slot = data[pos] if op == 0x71 else _unpack_I(data, pos)[0]
                pos += 1 if op == 0x71 else 4
                if slot in refs:
                    memo[slot] = stack[-1]
                count = max(count, slot + 1)
            elif op == 0x30:  # POP
                if stack.pop() is _MARK:
                    marks.pop()
            elif op == 0x31:  # POP_MARK
                del stack[marks.pop() :]
            elif op == 0x32:  # DUP
                push(stack[-1])
            elif op == 0x8F:  # EMPTY_SET
                push(set())
            elif op == 0x90:  # ADDITEMS
                start = marks.pop()
                items = stack[start + 1 :]
                del stack[start:]
                stack[-1].update(items)
            else:
                raise _refused(op, where)
    except KeyError as exc:
        raise CorruptRecord(where, None, f"the pickle refers to memo slot {exc.args[0]}, never stored") from None
    except (IndexError, struct.error):
        raise CorruptRecord(where, None, f"the pickle ends early or its stack is broken (near byte {buffer.consumed + pos:,})") from None
    except (TypeError, AttributeError) as exc:
        raise CorruptRecord(where, None, f"not an allocator snapshot pickle ({exc})") from None


# --- the result -------------------------------------------------------------------------


@dataclass
class StreamedSnapshot:
    """A snapshot summarised by `summarize`; the same tables as `AllocatorSnapshot`."""

    summary: pd.DataFrame
    stacks: list[tuple[str, ...]]
    user_frames: list[str]
    source: str
    read_bytes: int = 0
    seconds: float = 0.0
    memo_kept: int = 0
    _live: dict[int, dict[int, list[int]]] = field(default_factory=dict, repr=False)
    _traces: dict[int, _Trace] = field(default_factory=dict, repr=False)
    _baseline: dict[int, int] = field(default_factory=dict, repr=False)

    def devices(self) -> list[int]:
        return [int(d) for d in self.summary["device"].tolist()]

    def by_frame(self, device: int | None = None, k: int | None = 20, frame: str = "user") -> pd.DataFrame:
        """Live (active_allocated) bytes at the snapshot by frame: frame, blocks, bytes."""
        merged: dict[int, list[int]] = {}
        for dev, live in self._live.items():
            if device is None or dev == device:
                for stack, (size, count) in live.items():
                    _add(merged, stack, size, count)
        return _frames_table(merged, self._labels(frame), k)

    def peak(self, device: int, k: int | None = 20, frame: str = "user") -> tuple[dict[str, Any], pd.DataFrame]:
        """The history's highest active moment ({index, time_us, allocated}) and what was
        live then by frame, with the bytes from before the history as BEFORE_TRACE."""
        trace = self._traces.get(device)
        if trace is None or trace.peak is None:
            return {"index": -1, "time_us": -1, "allocated": 0}, pd.DataFrame(columns=["frame", "blocks", "bytes"])
        allocated = self._baseline[device] + trace.peak
        table = _frames_table(trace._peak_state(), self._labels(frame), None)
        before = allocated - int(table["bytes"].sum())
        if before > 0:
            table = pd.concat([table, pd.DataFrame([{"frame": BEFORE_TRACE, "blocks": 0, "bytes": before}])], ignore_index=True)
        return {"index": trace.peak_index, "time_us": trace.peak_time, "allocated": allocated}, (table if k is None else table.head(k))

    def around(self, device: int) -> pd.DataFrame:
        """The entries around the last OOM (else the last ones): index, time_us, action,
        addr, size, frame, stack (as `AllocatorSnapshot.around(device)` with its count)."""
        columns = ["index", "time_us", "action", "addr", "size", "frame", "stack"]
        trace = self._traces.get(device)
        rows = [] if trace is None else (trace.window if trace.window is not None else list(trace.recent))
        out = [
            (i, t, a, addr, size, self.user_frames[s] if s >= 0 else NO_FRAME, " <- ".join(self.stacks[s]) if s >= 0 else "")
            for i, t, a, addr, size, s in rows
        ]
        return pd.DataFrame(out, columns=columns)

    def timeline(self, device: int) -> pd.DataFrame:
        """The replayed active bytes, bucketed to at most `max_points` points, each its
        bucket's highest: index (the bucket's first entry), time_us, allocated."""
        trace = self._traces.get(device)
        if trace is None:
            return pd.DataFrame(columns=["index", "time_us", "allocated"])
        base = self._baseline[device]
        return pd.DataFrame([(i, t, base + v) for i, t, v in trace.points], columns=["index", "time_us", "allocated"])

    def stats(self) -> str:
        entries = int(self.summary["trace_entries"].sum()) if len(self.summary) else 0
        return (f"{self.source}: {self.read_bytes:,} bytes of pickle, {entries:,} history entries, {len(self.stacks):,} distinct stacks, "
                f"{self.memo_kept:,} shared objects kept, {self.seconds:.1f} s")  # fmt: skip

    def _labels(self, frame: str) -> list[str]:
        return frame_labels(frame, self.user_frames, self.stacks)


def _frames_table(cells: Mapping[int, list[int]], labels: list[str], k: int | None) -> pd.DataFrame:
    grouped: dict[str, list[int]] = {}
    for stack, (size, count) in cells.items():
        if count <= 0 and size <= 0:
            continue
        cell = grouped.setdefault(labels[stack] if stack >= 0 else NO_FRAME, [0, 0])
        cell[0] += count
        cell[1] += size
    out = pd.DataFrame([(f, c, b) for f, (c, b) in grouped.items()], columns=["frame", "blocks", "bytes"])
    out = out.sort_values(["bytes", "frame"], ascending=[False, True], ignore_index=True)
    out["blocks"] = out["blocks"].astype("int64")
    out["bytes"] = out["bytes"].astype("int64")
    return out if k is None else out.head(k)


def summarize(path: str | os.PathLike[str], *, around: int = 10, max_points: int = 4000, max_bytes: int | None = None) -> StreamedSnapshot:
    """Summarise a `_dump_snapshot` pickle (optionally gzip) of any size in one streamed
    read (two passes over the stream); local or s3://. `max_bytes` bounds the decompressed
    size (None: no bound: memory does not grow with it)."""
    started = time.perf_counter()
    source = _Source(os.fspath(path), max_bytes)
    refs = _walk_refs(source)
    aggregator = _Aggregator(source.path, around, max_points)
    top, kept = _unpickle(source, refs, aggregator.take)
    if not isinstance(top, dict) or not isinstance(top.get("segments"), list):
        raise CorruptRecord(source.path, None, "not an allocator snapshot: no 'segments' list (torch.cuda.memory._snapshot() writes one)")
    if top["segments"]:
        raise CorruptRecord(source.path, None, "a segment is not a dict with 'blocks' and 'total_size'")
    listed = top.get("device_traces") or []
    if not isinstance(listed, list):
        raise CorruptRecord(source.path, None, "'device_traces' is not a list")
    traces: dict[int, _Trace] = {}
    for device, entries in enumerate(listed):
        if not isinstance(entries, list) or entries:
            raise CorruptRecord(source.path, None, f"device_traces[{device}] is not a list of trace entries")
        trace = aggregator.traces.get(id(entries))
        if trace is not None:
            traces[device] = trace
    rows, live, baseline = [], {}, {}
    for device in sorted(set(aggregator.devices) | set(traces)):
        segment = aggregator.devices.get(device, {"segments": 0, "reserved": 0, "blocks": _Blocks()})
        blocks: _Blocks = segment["blocks"]
        trace = traces.get(device) or _Trace(around, max_points)
        reserved = segment["reserved"]
        rows.append({
            "device": device, "segments": segment["segments"], "reserved": reserved, "allocated": blocks.allocated,
            "requested": blocks.requested, "cached_free": blocks.cached_free,
            "fragmentation": blocks.cached_free / reserved if reserved else 0.0, "largest_free_block": blocks.largest_free,
            "trace_entries": trace.entries, "ooms": trace.ooms, "oom_request": trace.oom_request,
            "oom_fragmented": bool(trace.oom_request and blocks.largest_free < trace.oom_request <= blocks.cached_free),
        })  # fmt: skip
        live[device] = blocks.live
        baseline[device] = blocks.active - trace.net  # what was active before the history began
    return StreamedSnapshot(
        summary=pd.DataFrame(rows, columns=SUMMARY_COLUMNS), stacks=aggregator.stacks.texts, user_frames=aggregator.stacks.user,
        source=source.path, read_bytes=source.read_bytes, seconds=time.perf_counter() - started, memo_kept=kept,
        _live=live, _traces=traces, _baseline=baseline,
    )  # fmt: skip


__all__ = ["StreamedSnapshot", "summarize"]
