"""A seeded generator of CUDA allocator snapshots in the format of
`torch.cuda.memory._snapshot()` (segments with blocks, per-device trace entries with frames;
docs/traces.md "Allocator snapshots"), with ground truth computed while they are made, for
tests and benchmarks on machines without a GPU.

The allocator is simple but plausible: each device reserves segments of `segment_bytes`
(one `segment_alloc` entry each) and places each allocation after the last one of the
first segment that has room; freed space is not reused (cached as inactive blocks). Each
allocation has a stack of frames: a user frame (the model's layer, a known file and line)
under torch's own frames, so the reader's "user frame" is known. An OOM can be planted:
a request larger than every free block though smaller than all free memory together."""

from __future__ import annotations

import functools
import random
import struct
from dataclasses import dataclass, field
from typing import Any

SEGMENT_BASE = 0x7F00_0000_0000
LAYERS = ("model.py:41 encoder", "model.py:57 attention", "model.py:73 mlp", "train.py:120 loss_fn")
_FREE_FRAMES = [{"filename": "/home/user/project/train.py", "line": 150, "name": "train_step"}]  # where tensors are dropped
_TORCH_FRAMES = [
    {"filename": "/usr/lib/python3/site-packages/torch/nn/modules/module.py", "line": 1762, "name": "_call_impl"},
    {"filename": "??", "line": 0, "name": "c10::cuda::CUDACachingAllocator::Native::DeviceCachingAllocator::malloc"},
]


@dataclass(frozen=True)
class SnapshotSpec:
    devices: int = 1
    steps: int = 4
    allocations_per_step: int = 12
    segment_bytes: int = 20 << 20
    keep_per_step: int = 1  # allocations of each step never freed (a leak, or long-lived state)
    oom: bool = False  # end each device's history with an OOM that fragmentation caused
    seed: int = 0
    start_time_us: int = 1_790_000_000_000_000


@dataclass
class SnapshotTruth:
    """What the reader must find, per device."""

    reserved: dict[int, int] = field(default_factory=dict)
    allocated: dict[int, int] = field(default_factory=dict)
    cached_free: dict[int, int] = field(default_factory=dict)
    largest_free_block: dict[int, int] = field(default_factory=dict)
    segments: dict[int, int] = field(default_factory=dict)
    live_by_frame: dict[int, dict[str, int]] = field(default_factory=dict)  # user frame -> bytes live at the snapshot
    peak: dict[int, int] = field(default_factory=dict)  # the history's highest active bytes
    peak_index: dict[int, int] = field(default_factory=dict)
    peak_by_frame: dict[int, dict[str, int]] = field(default_factory=dict)
    oom_request: dict[int, int] = field(default_factory=dict)
    trace_entries: dict[int, int] = field(default_factory=dict)


def user_frame_text(layer: str) -> str:
    """The reader's text for a layer's user frame (name (file:line))."""
    location, name = layer.split(" ")
    filename, line = location.split(":")
    return f"{name} (/home/user/project/{filename}:{line})"


def _frames(layer: str) -> list[dict[str, Any]]:
    """Innermost first, as torch writes them: the allocator's C++ frame, torch's module
    call, the user's layer, the training script."""
    location, name = layer.split(" ")
    filename, line = location.split(":")
    user = {"filename": f"/home/user/project/{filename}", "line": int(line), "name": name}
    return [_TORCH_FRAMES[1], _TORCH_FRAMES[0], user, {"filename": "/home/user/project/train.py", "line": 200, "name": "<module>"}]


def make_snapshot(spec: SnapshotSpec) -> tuple[dict[str, Any], SnapshotTruth]:
    """The snapshot dict (as `_snapshot()` returns it) and its truth."""
    rng = random.Random(spec.seed)
    truth = SnapshotTruth()
    segments: list[dict[str, Any]] = []
    traces: list[list[dict[str, Any]]] = []
    time_us = spec.start_time_us
    for device in range(spec.devices):
        entries: list[dict[str, Any]] = []
        device_segments: list[dict[str, Any]] = []  # {"address", "total_size", "used"}
        live: dict[int, tuple[int, str, list[dict[str, Any]]]] = {}  # addr -> size, layer, frames
        active = peak = 0
        peak_live: dict[int, tuple[int, str]] = {}
        clock = _Clock(time_us)
        place = _Placer(spec.segment_bytes, SEGMENT_BASE + device * (1 << 40), device_segments, entries, clock)
        for _ in range(spec.steps):
            made: list[int] = []
            for _ in range(spec.allocations_per_step):
                layer = LAYERS[rng.randrange(len(LAYERS))]
                size = rng.choice((512, 4096, 1 << 20, 2 << 20, 5 << 20))
                addr = place(size)
                frames = _frames(layer)
                entries.append({"action": "alloc", "addr": addr, "size": size, "stream": 0, "time_us": clock.now, "frames": frames, "pool_id": (0, 0)})
                clock.now += rng.randint(1, 50)
                live[addr] = (size, layer, frames)
                made.append(addr)
                active += size
                if active > peak:
                    peak, peak_live = active, {a: (v[0], v[1]) for a, v in live.items()}
                    truth.peak_index[device] = len(entries) - 1
            for addr in made[spec.keep_per_step :]:
                size = live.pop(addr)[0]
                for action in ("free_requested", "free_completed"):
                    entries.append({"action": action, "addr": addr, "size": size, "stream": 0, "time_us": clock.now, "frames": _FREE_FRAMES, "pool_id": (0, 0)})
                    clock.now += 1
                active -= size
        # Blocks: the live allocations and, between and after them, inactive (cached) space.
        largest = cached = 0
        for segment in device_segments:
            blocks = []
            cursor = segment["address"]
            end = segment["address"] + segment["total_size"]
            for addr in sorted(a for a in live if segment["address"] <= a < end):
                if addr > cursor:
                    blocks.append({"address": cursor, "size": addr - cursor, "requested_size": 0, "state": "inactive", "frames": []})
                    largest, cached = max(largest, addr - cursor), cached + addr - cursor
                size, _, frames = live[addr]
                blocks.append({"address": addr, "size": size, "requested_size": size, "state": "active_allocated", "frames": frames})
                cursor = addr + size
            if cursor < end:
                blocks.append({"address": cursor, "size": end - cursor, "requested_size": 0, "state": "inactive", "frames": []})
                largest, cached = max(largest, end - cursor), cached + end - cursor
            allocated = sum(b["size"] for b in blocks if b["state"] == "active_allocated")
            segments.append(
                {
                    "device": device, "address": segment["address"], "total_size": segment["total_size"], "stream": 0,
                    "segment_type": "large", "segment_pool_id": (0, 0), "allocated_size": allocated, "active_size": allocated,
                    "requested_size": allocated, "is_expandable": False, "frames": [], "blocks": blocks,
                }
            )  # fmt: skip
        if spec.oom and largest:
            request = largest + 512  # fits the cached free memory together, no single block
            if request <= cached:
                entries.append({"action": "oom", "size": request, "stream": 0, "time_us": clock.now, "device_free": 1 << 20, "frames": _frames(LAYERS[1])})
                clock.now += 1
                truth.oom_request[device] = request
        time_us = clock.now
        traces.append(entries)
        truth.reserved[device] = sum(s["total_size"] for s in device_segments)
        truth.allocated[device] = sum(v[0] for v in live.values())
        truth.cached_free[device] = cached
        truth.largest_free_block[device] = largest
        truth.segments[device] = len(device_segments)
        truth.live_by_frame[device] = _by_frame({a: (v[0], v[1]) for a, v in live.items()})
        truth.peak[device] = peak
        truth.peak_by_frame[device] = _by_frame(peak_live)
        truth.trace_entries[device] = len(entries)
    snapshot = {"segments": segments, "device_traces": traces, "allocator_settings": {"PYTORCH_CUDA_ALLOC_CONF": ""}}
    return snapshot, truth


class _Clock:
    def __init__(self, now: int):
        self.now = now


class _Placer:
    """Places an allocation after the last one of the first segment with room, else in a
    new segment (recorded as a segment_alloc entry)."""

    def __init__(self, segment_bytes: int, base: int, segments: list[dict[str, Any]], entries: list[dict[str, Any]], clock: _Clock):
        self.segment_bytes, self.base, self.segments, self.entries, self.clock = segment_bytes, base, segments, entries, clock

    def __call__(self, size: int) -> int:
        for segment in self.segments:
            if segment["total_size"] - segment["used"] >= size:
                addr = segment["address"] + segment["used"]
                segment["used"] += size
                return int(addr)
        total = max(self.segment_bytes, size)
        base = self.base + sum(s["total_size"] for s in self.segments)
        self.segments.append({"address": base, "total_size": total, "used": size})
        self.entries.append({"action": "segment_alloc", "addr": base, "size": total, "stream": 0, "time_us": self.clock.now, "frames": [], "pool_id": (0, 0)})
        self.clock.now += 1
        return int(base)


def _by_frame(live: dict[int, tuple[int, str]]) -> dict[str, int]:
    out: dict[str, int] = {}
    for size, layer in live.values():
        out[user_frame_text(layer)] = out.get(user_frame_text(layer), 0) + size
    return out


# --- snapshots larger than memory: written as a pickle stream ---------------------------


@dataclass(frozen=True)
class LargeSnapshotSpec:
    """A snapshot of `devices` x `steps` x (alloc + free_requested + free_completed per
    allocation) history entries, written straight to a file as a pickle stream (nothing is
    held in memory): each step allocates `allocations_per_step` blocks and frees all but
    the first (`leak_bytes`: a leak), so the history's peak is known."""

    devices: int = 1
    steps: int = 1000
    allocations_per_step: int = 30
    leak_bytes: int = 1 << 20
    sizes: tuple[int, ...] = (4096, 2 << 20, 512, 8 << 20, 1 << 20)
    start_time_us: int = 1_790_000_000_000_000

    def entries_per_device(self) -> int:
        return self.steps * (1 + 3 * (self.allocations_per_step - 1))


class _Pickle:
    """Protocol-4 opcodes for `write_large_snapshot`, with pickle's memo numbering: every
    string and container is stored in the next slot (MEMOIZE) as it is written; a string
    seen before is referred back to (BINGET / LONG_BINGET). Callers use the returned bytes
    in the order they asked for them (the slots are numbered in that order)."""

    def __init__(self) -> None:
        self.slots = 0
        self.strings: dict[str, int] = {}
        self.objects: dict[str, int] = {}

    def _memoize(self) -> bytes:
        self.slots += 1
        return b"\x94"

    @staticmethod
    def get(slot: int) -> bytes:
        return b"h" + bytes([slot]) if slot < 256 else b"j" + struct.pack("<I", slot)

    def text(self, value: str) -> bytes:
        slot = self.strings.get(value)
        if slot is not None:
            return self.get(slot)
        data = value.encode()
        self.strings[value] = self.slots
        head = b"\x8c" + bytes([len(data)]) if len(data) < 256 else b"X" + struct.pack("<I", len(data))
        return head + data + self._memoize()

    def container(self, opcode: bytes) -> bytes:  # EMPTY_DICT / EMPTY_LIST, stored
        return opcode + self._memoize()

    @staticmethod
    def integer(value: int) -> bytes:
        return b"J" + struct.pack("<i", value) if -(1 << 31) <= value < (1 << 31) else b"\x8a\x08" + struct.pack("<q", value)

    def shared_dict(self, name: str, items: dict[str, Any]) -> bytes:
        """A dict written once (and stored), then referred back to by `name`."""
        slot = self.objects.get(name)
        if slot is not None:
            return self.get(slot)
        self.objects[name] = self.slots
        body = self.container(b"}") + b"("
        for key, value in items.items():
            body += self.text(key) + (self.text(value) if isinstance(value, str) else self.integer(value))
        return body + b"u"

    def frames(self, layer: str) -> bytes:
        """A new list of the layer's (shared) frame dicts."""
        body = self.container(b"]") + b"("
        for number, frame in enumerate(_frames(layer)):
            body += self.shared_dict(f"{layer}#{number}", frame)
        return body + b"e"

    def record(self, items: list[tuple[str, Any]]) -> bytes:
        """A new dict of (key, value) items; a value is a str, an int, or a function giving
        its pickled bytes (called in turn, so that its slots follow the dict's)."""
        body = self.container(b"}") + b"("
        for key, value in items:
            body += self.text(key) + (value() if callable(value) else self.text(value) if isinstance(value, str) else self.integer(value))
        return body + b"u"


def write_large_snapshot(handle: Any, spec: LargeSnapshotSpec) -> dict[str, int]:
    """Write the snapshot of `spec` to the binary `handle` as pickle protocol 4 (what
    `pickle.dump` writes for such a dict, less the optional framing: keys and frames
    shared by memo reference, a new frames list per entry, lists appended 1,000 items at a
    time), holding at most 1,000 entries in memory; return its truth: entries_per_device
    and peak (the history's highest active bytes, the same on every device)."""
    p = _Pickle()
    handle.write(b"\x80\x04" + p.container(b"}") + b"(" + p.text("segments") + p.container(b"]") + b"(")
    leaked = spec.steps * spec.leak_bytes
    reserved = max(sum(spec.sizes) * 4, 2 * leaked)
    for device in range(spec.devices):  # one segment per device: the leaked blocks, then the free rest
        base = SEGMENT_BASE + device * (1 << 40)
        out = p.record([("device", device), ("address", base), ("total_size", reserved), ("stream", 0), ("segment_type", "large"),
                        ("allocated_size", leaked), ("active_size", leaked)])[:-1]  # fmt: skip  # (its SETITEMS after the blocks)
        out += p.text("blocks") + p.container(b"]") + b"("
        for step in range(spec.steps):
            out += p.record([("address", base + step * spec.leak_bytes), ("size", spec.leak_bytes), ("requested_size", spec.leak_bytes),
                             ("state", "active_allocated"), ("frames", lambda: p.frames(LAYERS[0]))])  # fmt: skip
            if step % 1000 == 999:
                handle.write(out + b"e(")
                out = b""
        out += p.record([("address", base + leaked), ("size", reserved - leaked), ("requested_size", 0), ("state", "inactive")])
        handle.write(out + b"eu")  # the blocks' APPENDS, the segment's SETITEMS
    handle.write(b"e" + p.text("device_traces") + p.container(b"]") + b"(")
    peak = 0
    for device in range(spec.devices):
        base = SEGMENT_BASE + device * (1 << 40)
        scratch = base + (1 << 36)  # where the allocations freed in their step live
        time_us, net = spec.start_time_us, 0
        handle.write(p.container(b"]") + b"(")
        batch: list[bytes] = []
        for step in range(spec.steps):
            made = []
            for number in range(spec.allocations_per_step):
                leak = number == 0
                size = spec.leak_bytes if leak else spec.sizes[(step + number) % len(spec.sizes)]
                addr = base + step * spec.leak_bytes if leak else scratch + number * (16 << 20)
                batch.append(p.record([("action", "alloc"), ("addr", addr), ("size", size), ("stream", 0), ("time_us", time_us),
                                       ("frames", functools.partial(p.frames, LAYERS[number % len(LAYERS)]))]))  # fmt: skip
                time_us += 3
                net += size
                peak = max(peak, net)
                if not leak:
                    made.append((addr, size))
            for addr, size in made:
                for action in ("free_requested", "free_completed"):
                    batch.append(p.record([("action", action), ("addr", addr), ("size", size), ("stream", 0), ("time_us", time_us),
                                           ("frames", lambda: p.container(b"]"))]))  # fmt: skip
                    time_us += 1
                net -= size
            if len(batch) >= 1000:
                handle.write(b"".join(batch) + b"e(")
                batch.clear()
        handle.write(b"".join(batch) + b"e")  # this device's last APPENDS
        batch.clear()
    handle.write(b"eu.")  # device_traces' APPENDS, the top dict's SETITEMS, STOP
    return {"entries_per_device": spec.entries_per_device(), "peak": peak}
