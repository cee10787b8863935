"""PyTorch's CUDA allocator snapshots (`torch.cuda.memory._snapshot()`, saved by
`torch.cuda.memory._dump_snapshot()` as a pickle, with the allocation history that
`_record_memory_history()` keeps): read as untrusted input into compact tables (segments,
blocks, trace entries; each distinct stack stored once) and summarised without a browser:
reserved, allocated and fragmentation per device, the largest free block against an OOM's
request, live bytes by stack frame, the history's peak and what was live at it, and the
entries around a chosen time. Format and definitions in docs/traces.md ("Allocator
snapshots"). A snapshot too large to load whole: snapshot_stream.summarize."""

from __future__ import annotations

import gzip
import io
import os
import pickle
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from ..exceptions import ConfigError, CorruptRecord

MAX_SNAPSHOT_BYTES = 4 << 30  # a larger file is refused (by name), not read into memory
# Frames of these files are the allocator's and torch's own machinery: the "user" frame of
# a stack is the innermost frame outside them (the line of the model or training code).
_INTERNAL_PARTS = ("/torch/", "\\torch\\", "<frozen ", "/site-packages/", "/dist-packages/", "/lib/python3")
_INTERNAL_SUFFIXES = (".cpp", ".h", ".cu", ".cuh", ".c")
NO_FRAME = "(no stack)"
BEFORE_TRACE = "(before the trace)"
_ALLOC, _FREE = "alloc", "free_completed"


class _PlainUnpickler(pickle.Unpickler):
    """A snapshot is dicts, lists, tuples, strings and numbers: any class or function in the
    pickle is refused, so a hostile file cannot run code."""

    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(f"the snapshot names {module}.{name}; an allocator snapshot holds plain data only")


def _plain_load(data: bytes, where: str) -> Any:
    try:
        return _PlainUnpickler(io.BytesIO(data)).load()
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError, AttributeError, IndexError, KeyError, MemoryError, RecursionError) as exc:
        raise CorruptRecord(where, None, f"not an allocator snapshot pickle ({exc})") from None


@dataclass
class AllocatorSnapshot:
    """One snapshot as tables. `segments`: device, address, total_size, allocated_size,
    active_size, stream, segment_type, is_expandable. `blocks`: device, segment, address,
    size, requested_size, state, stack. `trace`: device, index, time_us, action, addr, size,
    stream, stack, device_free. `stack` indexes `stacks` (tuples of "name (file:line)",
    innermost first), -1 without frames."""

    segments: pd.DataFrame
    blocks: pd.DataFrame
    trace: pd.DataFrame
    stacks: list[tuple[str, ...]] = field(default_factory=list)
    user_frames: list[str] = field(default_factory=list)  # per stack: its innermost user frame
    source: str = ""

    # --- reading -------------------------------------------------------------------------

    @classmethod
    def load(cls, path: str | os.PathLike[str], max_bytes: int = MAX_SNAPSHOT_BYTES) -> AllocatorSnapshot:
        """A snapshot file: `_dump_snapshot`'s pickle (optionally gzip), or the same dict as
        JSON (.json / .json.gz); local or s3://."""
        text = os.fspath(path)
        if text.startswith("s3://"):
            from ..store import open_store

            parent, _, name = text.rpartition("/")
            data = open_store(parent).read(name, max_size=max_bytes)
        else:
            size = os.path.getsize(text)
            if size > max_bytes:
                raise ConfigError(f"{text}: {size:,} bytes, over the {max_bytes:,} this reader takes (max_bytes); "
                                  "stepscope.traces.snapshot_stream.summarize (`stepscope memory summary`) reads any size")  # fmt: skip
            with open(text, "rb") as handle:
                data = handle.read()
        return cls.from_bytes(data, where=text, max_bytes=max_bytes)

    @classmethod
    def from_bytes(cls, data: bytes, where: str = "<snapshot>", max_bytes: int = MAX_SNAPSHOT_BYTES) -> AllocatorSnapshot:
        if data[:2] == b"\x1f\x8b":
            try:
                with gzip.GzipFile(fileobj=io.BytesIO(data)) as handle:
                    data = handle.read(max_bytes + 1)
            except (OSError, EOFError) as exc:
                raise CorruptRecord(where, None, f"bad gzip ({exc})") from None
            if len(data) > max_bytes:
                raise ConfigError(f"{where}: over {max_bytes:,} bytes once decompressed (max_bytes)")
        if data.lstrip()[:1] == b"{":
            import json

            try:
                raw = json.loads(data)
            except ValueError as exc:
                raise CorruptRecord(where, None, f"not JSON ({exc})") from None
        else:
            raw = _plain_load(data, where)
        return cls.from_dict(raw, where)

    @classmethod
    def from_dict(cls, raw: Any, where: str = "<snapshot>") -> AllocatorSnapshot:
        """The tables of `torch.cuda.memory._snapshot()`'s dict (segments, device_traces)."""
        if not isinstance(raw, Mapping) or not isinstance(raw.get("segments"), list):
            raise CorruptRecord(where, None, "not an allocator snapshot: no 'segments' list (torch.cuda.memory._snapshot() writes one)")
        stacks = _Stacks()
        segments, blocks = _segment_rows(raw["segments"], stacks, where)
        traces = raw.get("device_traces") or []
        if not isinstance(traces, list):
            raise CorruptRecord(where, None, "'device_traces' is not a list")
        trace = _trace_rows(traces, stacks, where)
        return cls(segments, blocks, trace, stacks.stacks, stacks.user, where)

    # --- summaries -----------------------------------------------------------------------

    def devices(self) -> list[int]:
        return sorted(set(self.segments["device"].tolist()) | set(self.trace["device"].tolist()))

    def summary(self) -> pd.DataFrame:
        """Per device at the moment of the snapshot: segments, reserved (their sizes),
        allocated and requested (active_allocated blocks), cached_free (inactive blocks),
        fragmentation = cached_free / reserved, largest_free_block, trace entries, OOMs and
        the largest OOM request, and whether that request would have fit the cached free
        memory but no single free block (`oom_fragmented`)."""
        rows = []
        for device in self.devices():
            segments = self.segments[self.segments["device"] == device]
            blocks = self.blocks[self.blocks["device"] == device]
            live = blocks[blocks["state"] == "active_allocated"]
            free = blocks[blocks["state"] == "inactive"]
            reserved = int(segments["total_size"].sum())
            cached_free = int(free["size"].sum())
            largest = int(free["size"].max()) if len(free) else 0
            ooms = self.trace[(self.trace["device"] == device) & (self.trace["action"] == "oom")]
            request = int(ooms["size"].max()) if len(ooms) else 0
            rows.append(
                {
                    "device": device,
                    "segments": len(segments),
                    "reserved": reserved,
                    "allocated": int(live["size"].sum()),
                    "requested": int(live["requested_size"].sum()),
                    "cached_free": cached_free,
                    "fragmentation": cached_free / reserved if reserved else 0.0,
                    "largest_free_block": largest,
                    "trace_entries": int((self.trace["device"] == device).sum()),
                    "ooms": len(ooms),
                    "oom_request": request,
                    "oom_fragmented": bool(request and largest < request <= cached_free),
                }
            )
        return pd.DataFrame(rows, columns=SUMMARY_COLUMNS)

    def by_frame(self, device: int | None = None, k: int | None = 20, frame: str = "user") -> pd.DataFrame:
        """The live (active_allocated) blocks at the snapshot by stack frame: frame, blocks,
        bytes, largest first. `frame="user"`: the innermost frame outside torch and
        site-packages (the model's or training script's line), `"top"`: the innermost frame."""
        blocks = self.blocks[self.blocks["state"] == "active_allocated"]
        if device is not None:
            blocks = blocks[blocks["device"] == device]
        return _group_by_frame(blocks["stack"].to_numpy(), blocks["size"].to_numpy(), self._frames(frame), k)

    def timeline(self, device: int) -> pd.DataFrame:
        """The history of one device replayed: after each alloc / free_completed entry, the
        bytes active (allocated, or freed but awaiting another stream): index, time_us,
        action, size, allocated. The history is a ring buffer: what was active before its
        first entry is the snapshot's active blocks minus the history's net, so the curve
        ends at the snapshot's active bytes."""
        entries = self.trace[(self.trace["device"] == device) & self.trace["action"].isin([_ALLOC, _FREE])]
        sizes = np.where(entries["action"].to_numpy() == _ALLOC, entries["size"].to_numpy(), -entries["size"].to_numpy())
        # A block is reusable once its free completes (free_completed), so the replayed bytes
        # are the active ones: allocated, or freed but awaiting another stream.
        blocks = self.blocks[(self.blocks["device"] == device) & self.blocks["state"].astype(str).str.startswith("active")]
        baseline = int(blocks["size"].sum()) - int(sizes.sum())
        out = entries[["index", "time_us", "action", "size"]].reset_index(drop=True)
        out["allocated"] = baseline + np.cumsum(sizes)
        return out

    def peak(self, device: int, k: int | None = 20, frame: str = "user") -> tuple[dict[str, Any], pd.DataFrame]:
        """The history's highest allocated moment on `device` ({index, time_us, allocated})
        and what was live then by stack frame (frame, blocks, bytes); the bytes allocated
        before the history began are one row BEFORE_TRACE."""
        line = self.timeline(device)
        if line.empty:
            return {"index": -1, "time_us": -1, "allocated": 0}, pd.DataFrame(columns=["frame", "blocks", "bytes"])
        top = int(np.argmax(line["allocated"].to_numpy()))
        at = line.iloc[top]
        entries = self.trace[(self.trace["device"] == device) & self.trace["action"].isin([_ALLOC, _FREE])].reset_index(drop=True)
        upto = entries.iloc[: top + 1]
        allocs = upto[upto["action"] == _ALLOC]
        frees = upto[upto["action"] == _FREE]
        # Live at the peak: allocations of the history not yet freed (by address, in order).
        freed_at: dict[int, list[int]] = {}
        for position, addr in zip(frees.index.tolist(), frees["addr"].tolist()):
            freed_at.setdefault(int(addr), []).append(position)
        live = []
        for position, addr in zip(allocs.index.tolist(), allocs["addr"].tolist()):
            later = [p for p in freed_at.get(int(addr), ()) if p > position]
            if later:
                freed_at[int(addr)].remove(later[0])
            else:
                live.append(position)
        rows = entries.loc[live]
        out = _group_by_frame(rows["stack"].to_numpy(), rows["size"].to_numpy(), self._frames(frame), None)
        before = int(at["allocated"]) - int(rows["size"].sum())
        if before > 0:
            out = pd.concat([out, pd.DataFrame([{"frame": BEFORE_TRACE, "blocks": 0, "bytes": before}])], ignore_index=True)
        return {"index": int(at["index"]), "time_us": int(at["time_us"]), "allocated": int(at["allocated"])}, (out if k is None else out.head(k))

    def around(self, device: int, time_us: int | None = None, index: int | None = None, count: int = 10) -> pd.DataFrame:
        """The `count` history entries before and after a moment (`time_us`, else the entry
        `index`, else the last OOM, else the end): index, time_us, action, addr, size,
        frame (user frame) and stack (the whole stack, innermost first, joined by ' <- ')."""
        entries = self.trace[self.trace["device"] == device].reset_index(drop=True)
        if entries.empty:
            return pd.DataFrame(columns=["index", "time_us", "action", "addr", "size", "frame", "stack"])
        if time_us is not None:
            center = int(np.searchsorted(entries["time_us"].to_numpy(), time_us))
        elif index is not None:
            center = int(np.searchsorted(entries["index"].to_numpy(), index))
        else:
            ooms = np.flatnonzero(entries["action"].to_numpy() == "oom")
            center = int(ooms[-1]) if ooms.size else len(entries) - 1
        window = entries.iloc[max(center - count, 0) : center + count + 1].copy()
        stacks = window["stack"].to_numpy()
        window["frame"] = [self.user_frames[s] if s >= 0 else NO_FRAME for s in stacks]
        window["stack"] = [" <- ".join(self.stacks[s]) if s >= 0 else "" for s in stacks]
        return window[["index", "time_us", "action", "addr", "size", "frame", "stack"]].reset_index(drop=True)

    def _frames(self, frame: str) -> list[str]:
        return frame_labels(frame, self.user_frames, self.stacks)


SUMMARY_COLUMNS = [
    "device", "segments", "reserved", "allocated", "requested", "cached_free", "fragmentation", "largest_free_block",
    "trace_entries", "ooms", "oom_request", "oom_fragmented",
]  # fmt: skip


class _Stacks:
    """Each distinct stack once: snapshots repeat the same few stacks thousands of times."""

    def __init__(self) -> None:
        self.index: dict[tuple[str, ...], int] = {}
        self.stacks: list[tuple[str, ...]] = []
        self.user: list[str] = []  # per stack: its innermost user frame
        self.by_id: dict[int, int] = {}

    def add(self, frames: Any) -> int:
        if not isinstance(frames, list) or not frames:
            return -1
        # The same list object (a pickle shares repeated values) is keyed once; the raw
        # snapshot holds every list alive while it is read, so an id is not reused meanwhile.
        seen = self.by_id.get(id(frames))
        if seen is not None:
            return seen
        key = tuple(_frame_text(f) for f in frames)
        found = self.index.get(key)
        if found is None:
            found = self.index[key] = len(self.stacks)
            self.stacks.append(key)
            self.user.append(_user_frame(frames, key))
        self.by_id[id(frames)] = found
        return found


def _frame_text(frame: Any) -> str:
    if not isinstance(frame, Mapping):
        return "?"
    return f"{frame.get('name', '?')} ({frame.get('filename', '?')}:{frame.get('line', '?')})"


def _user_frame(frames: list[Any], texts: tuple[str, ...]) -> str:
    """The innermost frame of the user's code: not C++ (no file, `??`, .cpp), not torch's,
    not an installed package's, not the standard library's; the innermost frame if none."""
    for frame, text in zip(frames, texts):
        filename = str(frame.get("filename", "")) if isinstance(frame, Mapping) else ""
        if filename in ("", "?", "??") or filename.endswith(_INTERNAL_SUFFIXES) or any(part in filename for part in _INTERNAL_PARTS):
            continue
        return text
    return texts[0] if texts else NO_FRAME


def _int(value: Any, where: str, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise CorruptRecord(where, None, f"{what} is {value!r}, not an integer")
    return value


def _segment_rows(segments: list[Any], stacks: _Stacks, where: str) -> tuple[pd.DataFrame, pd.DataFrame]:
    seg_rows: dict[str, list[Any]] = {c: [] for c in ("device", "address", "total_size", "allocated_size", "active_size", "stream", "segment_type", "is_expandable")}
    block_rows: dict[str, list[Any]] = {c: [] for c in ("device", "segment", "address", "size", "requested_size", "state", "stack")}
    for number, segment in enumerate(segments):
        if not isinstance(segment, Mapping):
            raise CorruptRecord(where, None, f"segment {number} is not a dict")
        device = segment.get("device", 0)
        address = _int(segment.get("address"), where, f"segment {number} address")
        seg_rows["device"].append(_int(device, where, f"segment {number} device"))
        seg_rows["address"].append(address)
        seg_rows["total_size"].append(_int(segment.get("total_size"), where, f"segment {number} total_size"))
        seg_rows["allocated_size"].append(_int(segment.get("allocated_size", 0), where, f"segment {number} allocated_size"))
        seg_rows["active_size"].append(_int(segment.get("active_size", 0), where, f"segment {number} active_size"))
        seg_rows["stream"].append(_int(segment.get("stream", 0), where, f"segment {number} stream"))
        seg_rows["segment_type"].append(str(segment.get("segment_type", "")))
        seg_rows["is_expandable"].append(bool(segment.get("is_expandable", False)))
        blocks = segment.get("blocks") or []
        if not isinstance(blocks, list):
            raise CorruptRecord(where, None, f"segment {number} blocks is not a list")
        for position, block in enumerate(blocks):
            if not isinstance(block, Mapping):
                raise CorruptRecord(where, None, f"segment {number} block {position} is not a dict")
            size = _int(block.get("size"), where, f"segment {number} block {position} size")
            block_rows["device"].append(device)
            block_rows["segment"].append(address)
            block_rows["address"].append(_int(block.get("address", -1), where, f"segment {number} block {position} address"))
            block_rows["size"].append(size)
            block_rows["requested_size"].append(_int(block.get("requested_size", size), where, f"segment {number} block {position} requested_size"))
            block_rows["state"].append(str(block.get("state", "")))
            block_rows["stack"].append(stacks.add(block.get("frames")))
    seg = pd.DataFrame({k: np.asarray(v, dtype=np.int64) if k not in ("segment_type", "is_expandable") else v for k, v in seg_rows.items()})
    blk = pd.DataFrame({k: np.asarray(v, dtype=np.int64) if k != "state" else pd.Categorical(v) for k, v in block_rows.items()})
    return seg, blk


def _trace_rows(traces: list[Any], stacks: _Stacks, where: str) -> pd.DataFrame:
    rows: dict[str, list[Any]] = {c: [] for c in ("device", "index", "time_us", "action", "addr", "size", "stream", "stack", "device_free")}
    for device, entries in enumerate(traces):
        if not isinstance(entries, list):
            raise CorruptRecord(where, None, f"device_traces[{device}] is not a list")
        for index, entry in enumerate(entries):
            if not isinstance(entry, Mapping) or not isinstance(entry.get("action"), str):
                raise CorruptRecord(where, None, f"device_traces[{device}][{index}] is not a trace entry (a dict with an 'action')")
            rows["device"].append(device)
            rows["index"].append(index)
            rows["time_us"].append(_int(entry.get("time_us", index), where, f"device_traces[{device}][{index}] time_us"))
            rows["action"].append(entry["action"])
            rows["addr"].append(_int(entry.get("addr", -1), where, f"device_traces[{device}][{index}] addr"))
            rows["size"].append(_int(entry.get("size", 0), where, f"device_traces[{device}][{index}] size"))
            rows["stream"].append(_int(entry.get("stream", 0), where, f"device_traces[{device}][{index}] stream"))
            rows["stack"].append(stacks.add(entry.get("frames")))
            rows["device_free"].append(_int(entry.get("device_free", -1), where, f"device_traces[{device}][{index}] device_free"))
    return pd.DataFrame({k: pd.Categorical(v) if k == "action" else np.asarray(v, dtype=np.int64) for k, v in rows.items()})


def _group_by_frame(stack_ids: np.ndarray, sizes: np.ndarray, frames: list[str], k: int | None) -> pd.DataFrame:
    labels = [frames[s] if s >= 0 else NO_FRAME for s in stack_ids.tolist()]
    frame = pd.DataFrame({"frame": labels, "size": sizes})
    out = frame.groupby("frame", sort=False).agg(blocks=("size", "size"), bytes=("size", "sum")).reset_index()
    out = out.sort_values(["bytes", "frame"], ascending=[False, True], ignore_index=True)
    return out if k is None else out.head(k)


def load(path: str | os.PathLike[str]) -> AllocatorSnapshot:
    """`AllocatorSnapshot.load(path)`."""
    return AllocatorSnapshot.load(path)


def snapshot_keys(names: Iterable[str]) -> list[str]:
    """The allocator snapshots among file names (what stepscope and torch name them)."""
    return sorted(n for n in names if n.endswith((".pickle", ".pickle.gz", ".snapshot.json", ".snapshot.json.gz")))


def frame_labels(frame: str, user_frames: list[str], stacks: list[tuple[str, ...]]) -> list[str]:
    """Per stack, the label its bytes are grouped under: its innermost user frame (`user`) or its
    innermost frame whatever its file (`top`); shared by the in-memory and the streamed reader."""
    if frame == "user":
        return user_frames
    if frame == "top":
        return [s[0] if s else NO_FRAME for s in stacks]
    raise ConfigError(f"frame must be 'user' or 'top', got {frame!r}")
