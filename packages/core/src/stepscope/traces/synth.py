"""A seeded generator of Kineto GPU traces with exact ground truth, for tests and benchmarks
on machines without a GPU.

A generated trace has profiler steps, user annotations, CPU operators that launch kernels
and memcpy/memset on several streams with known launch delays, memcopies of known sizes,
device synchronizations and idle gaps. The ground truth is computed here, while the events
are made, by plain per-event arithmetic that shares no code with the engine: tests compare
the engine's tables and analyses against it."""

from __future__ import annotations

import gzip
import io
import json
import os
import random
from collections import defaultdict
from dataclasses import dataclass, field
from typing import IO, Any

from ..exceptions import ConfigError

KERNEL_NAMES = (
    ("ampere_sgemm_128x64_nn", 40_000, 120_000),
    ("ampere_fp16_s16816gemm_fp16_128x128_ldg8_f2f_nn", 20_000, 60_000),
    ("void cutlass::Kernel<cutlass_80_tensorop_bf16_s16816gemm_bf16_64x64_32x6_tn_align8>(Params)", 15_000, 50_000),
    ("void at::native::vectorized_elementwise_kernel<4, at::native::{lambda(float)#1}, at::detail::Array<char*, 2> >(int)", 1_000, 4_000),
    ("void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, at::native::MeanOps<float, float> > >(float)", 3_000, 9_000),
    ("void cudnn::bn_fw_tr_1C11_kernel_NCHW<float, float, int, 512, true, 1>(float)", 8_000, 20_000),
)
CPU_OPS = ("aten::linear", "aten::relu", "aten::add", "aten::mean", "aten::batch_norm", "aten::mul")
KERNEL_WAIT_NS = 30_000  # HTA's consecutive_kernel_delay, in the trace's microseconds


@dataclass(frozen=True)
class SynthSpec:
    """What to generate. Every time is an integer number of nanoseconds."""

    steps: int = 4
    ops_per_step: int = 24
    streams: tuple[int, ...] = (7, 20)
    seed: int = 0
    rank: int = 0
    world_size: int = 1
    first_step: int = 0
    memcpy_every: int = 6  # every n-th op copies instead of computing
    memset_every: int = 11
    slow_factor: float = 1.0  # > 1 makes this rank's kernels slower (a straggler)
    correlation_start: int = 1_000_000  # HTA 0.5 with pandas 3 fails when all ids are small
    base_time_ns: int = 1_790_000_000_000_000_000
    pid: int = 4242
    tid: int = 4242
    memory: bool = False  # allocator events ([memory], as profile_memory=True writes them) on cuda:0
    leak_bytes: int = 0  # with `memory`: bytes each step allocates and never frees (a leak)
    activation_bytes: int = 4 << 20  # with `memory`: the largest activation a forward op allocates
    segment_bytes: int = 2 << 20  # with `memory`: the caching allocator reserves in segments of this size

    def __post_init__(self) -> None:
        for name in ("leak_bytes", "activation_bytes", "segment_bytes"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ConfigError(f"SynthSpec.{name} must be an integer >= 0, got {value!r}")
        for name in ("steps", "ops_per_step", "memcpy_every", "memset_every"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"SynthSpec.{name} must be an integer >= 1, got {value!r}")
        if not self.streams:
            raise ConfigError("SynthSpec.streams must name at least one stream")
        if not 0 <= self.rank < self.world_size:
            raise ConfigError(f"SynthSpec.rank must be in [0, world_size), got {self.rank!r}")


@dataclass
class GroundTruth:
    """What the engine must find in the generated trace (nanoseconds, bytes)."""

    kernels: dict[str, dict[str, int]] = field(default_factory=dict)  # name -> count, total_ns, max_ns
    kernel_ns_by_stream: dict[int, int] = field(default_factory=dict)
    kernel_ns_by_step: dict[int, int] = field(default_factory=dict)
    kernel_ns_by_annotation: dict[str, int] = field(default_factory=dict)
    launch_delay: dict[str, dict[str, int]] = field(default_factory=dict)  # kernel name -> count, total_ns, max_ns
    memcpy: dict[str, dict[str, int]] = field(default_factory=dict)  # direction -> count, bytes, total_ns
    syncs: dict[str, dict[str, int]] = field(default_factory=dict)  # call -> count, total_ns
    idle_ns_by_stream: dict[int, int] = field(default_factory=dict)  # gaps between GPU activities on the stream
    idle_by_category: dict[str, int] = field(default_factory=dict)  # host_wait / kernel_wait / other, all streams
    gpu_span_ns: int = 0  # first GPU start to last GPU end
    gpu_busy_ns: int = 0  # union of all GPU activity
    step_ns: dict[int, int] = field(default_factory=dict)
    cpu_ops: dict[str, dict[str, int]] = field(default_factory=dict)  # name -> count, total_ns
    events: int = 0
    # Allocator events (SynthSpec.memory), per step on cuda:0: peak_allocated, peak_reserved,
    # reserved_at_peak, allocations, frees, start_allocated, end_allocated, unfreed_bytes; and the op at the peak.
    memory_by_step: dict[int, dict[str, int]] = field(default_factory=dict)
    memory_peak_op: dict[int, str] = field(default_factory=dict)
    leak_op: dict[int, str] = field(default_factory=dict)  # step -> the op that allocated the leaked block
    allocated_bytes_by_op: dict[str, int] = field(default_factory=dict)

    @property
    def gpu_idle_ns(self) -> int:
        return self.gpu_span_ns - self.gpu_busy_ns

    def to_json(self) -> dict[str, Any]:
        out = {k: v for k, v in self.__dict__.items()}
        out["gpu_idle_ns"] = self.gpu_idle_ns
        return json.loads(json.dumps(out, default=str))


def write_trace(spec: SynthSpec, target: str | os.PathLike[str] | IO[str]) -> GroundTruth:
    """Write the trace of `spec` (gzip when the path ends in .gz) and return its truth."""
    if isinstance(target, (str, os.PathLike)):
        path = os.fspath(target)
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        opener = gzip.open if path.endswith(".gz") else open
        with opener(path, "wt", encoding="utf-8", newline="\n") as handle:
            return _Generator(spec, handle).run()
    return _Generator(spec, target).run()


def trace_bytes(spec: SynthSpec) -> tuple[bytes, GroundTruth]:
    buffer = io.StringIO()
    truth = write_trace(spec, buffer)
    return buffer.getvalue().encode(), truth


def _us(ns: int) -> str:
    return f"{ns // 1000}.{ns % 1000:03d}"


class _Generator:
    def __init__(self, spec: SynthSpec, out: IO[str]):
        self.spec = spec
        self.out = out
        self.rng = random.Random(spec.seed * 1_000_003 + spec.rank)
        self.truth = GroundTruth()
        self.lines: list[str] = []
        self.first = True
        self.gpu: list[tuple[int, int, int, int]] = []  # (stream, start, end, launch start) of every GPU activity
        # The allocator's state (SynthSpec.memory): live activations, totals, the next address.
        self.live: list[tuple[int, int]] = []  # (addr, bytes)
        self.allocated = 0
        self.reserved = 0
        self.next_addr = 140_000_000_000_000

    def run(self) -> GroundTruth:
        spec = self.spec
        header = {
            "schemaVersion": 1,
            "deviceProperties": [{"id": 0, "name": "Synthetic GPU", "totalGlobalMem": 85899345920, "computeMajor": 9, "computeMinor": 0}],
            "distributedInfo": {"backend": "nccl", "rank": spec.rank, "world_size": spec.world_size},
            "baseTimeNanoseconds": spec.base_time_ns,
        }
        # HTA finds the rank with the regex `"rank":\s+(\d+)`: keep json.dumps' ": " spacing.
        self.out.write(json.dumps(header)[:-1] + ',\n"traceEvents": [\n')
        self._meta()
        t = 1_000_000  # ns on the trace clock (relative to baseTimeNanoseconds)
        free = {stream: 0 for stream in spec.streams}
        correlation = spec.correlation_start
        external = 1
        for step_index in range(spec.steps):
            step = spec.first_step + step_index
            step_start = t
            t += self.rng.randint(5_000, 40_000)  # data loading on the host before any launch
            half = spec.ops_per_step // 2
            annotation_start = t
            for op_index in range(spec.ops_per_step):
                annotation = "## forward ##" if op_index < half else "## backward ##"
                if op_index == half:
                    self._x("user_annotation", "## forward ##", annotation_start, t - annotation_start, spec.pid, spec.tid, {"External id": external})
                    external += 1
                    annotation_start = t
                op_name = CPU_OPS[self.rng.randrange(len(CPU_OPS))]
                op_start = t
                if spec.memory:
                    self._memory_op(step, op_name, op_start, forward=op_index < half, leak=op_index == 0)
                launch_start = op_start + self.rng.randint(1_000, 4_000)
                launch_dur = self.rng.randint(3_000, 9_000)
                launch_end = launch_start + launch_dur
                stream = spec.streams[self.rng.randrange(len(spec.streams))]
                delay = self.rng.choice((1_000, 2_000, 5_000, 20_000, 150_000)) if self.rng.random() < 0.9 else 0
                gpu_start = max(launch_end + delay, free[stream] + self.rng.choice((0, 0, 1_000, 10_000)))
                if op_index % spec.memcpy_every == spec.memcpy_every - 1:
                    call, gpu_kind = "cudaMemcpyAsync", "gpu_memcpy"
                    direction = self.rng.choice(("HtoD", "DtoH", "DtoD"))
                    host = self.rng.choice(("Pinned", "Pageable"))
                    label = {"HtoD": f"Memcpy HtoD ({host} -> Device)", "DtoH": f"Memcpy DtoH (Device -> {host})", "DtoD": "Memcpy DtoD (Device -> Device)"}[direction]
                    size = self.rng.choice((4096, 1 << 20, 3 << 20, 64 << 20))
                    gpu_dur = max(500, size // 20)  # ~20 GB/s
                    gpu_name = label
                    direction_key = {"HtoD": "H2D", "DtoH": "D2H", "DtoD": "D2D"}[direction]
                    entry = self.truth.memcpy.setdefault(direction_key, {"count": 0, "bytes": 0, "total_ns": 0})
                    entry["count"] += 1
                    entry["bytes"] += size
                    entry["total_ns"] += gpu_dur
                    gpu_args: dict[str, Any] = {"device": 0, "context": 1, "stream": stream, "correlation": correlation, "bytes": size, "memory bandwidth (GB/s)": round(size / gpu_dur, 3)}
                elif op_index % spec.memset_every == spec.memset_every - 1:
                    call, gpu_kind, gpu_name = "cudaMemsetAsync", "gpu_memset", "Memset (Device)"
                    size = self.rng.choice((512, 8192))
                    gpu_dur = 800
                    entry = self.truth.memcpy.setdefault("memset", {"count": 0, "bytes": 0, "total_ns": 0})
                    entry["count"] += 1
                    entry["bytes"] += size
                    entry["total_ns"] += gpu_dur
                    gpu_args = {"device": 0, "context": 1, "stream": stream, "correlation": correlation, "bytes": size}
                else:
                    call, gpu_kind = "cudaLaunchKernel", "kernel"
                    gpu_name, low, high = KERNEL_NAMES[self.rng.randrange(len(KERNEL_NAMES))]
                    gpu_dur = int(self.rng.randint(low, high) * spec.slow_factor)
                    gpu_args = {"queued": 0, "device": 0, "context": 1, "stream": stream, "correlation": correlation, "registers per thread": 64, "shared memory": 0, "grid": [64, 1, 1], "block": [256, 1, 1], "External id": external}
                    k = self.truth.kernels.setdefault(gpu_name, {"count": 0, "total_ns": 0, "max_ns": 0})
                    k["count"] += 1
                    k["total_ns"] += gpu_dur
                    k["max_ns"] = max(k["max_ns"], gpu_dur)
                    self.truth.kernel_ns_by_stream[stream] = self.truth.kernel_ns_by_stream.get(stream, 0) + gpu_dur
                    self.truth.kernel_ns_by_step[step] = self.truth.kernel_ns_by_step.get(step, 0) + gpu_dur
                    self.truth.kernel_ns_by_annotation[annotation] = self.truth.kernel_ns_by_annotation.get(annotation, 0) + gpu_dur
                    d = self.truth.launch_delay.setdefault(gpu_name, {"count": 0, "total_ns": 0, "max_ns": 0})
                    measured = max(0, gpu_start - launch_end)
                    d["count"] += 1
                    d["total_ns"] += measured
                    d["max_ns"] = max(d["max_ns"], measured)
                free[stream] = gpu_start + gpu_dur
                op_end = launch_end + self.rng.randint(500, 3_000)
                cpu = self.truth.cpu_ops.setdefault(op_name, {"count": 0, "total_ns": 0})
                cpu["count"] += 1
                cpu["total_ns"] += op_end - op_start
                self._x("cpu_op", op_name, op_start, op_end - op_start, spec.pid, spec.tid, {"External id": external, "Sequence number": external, "Input Dims": [[64, 128], [128]]})
                self._x("cuda_runtime", call, launch_start, launch_dur, spec.pid, spec.tid, {"External id": external, "cbid": 211, "correlation": correlation})
                self._x(gpu_kind, gpu_name, gpu_start, gpu_dur, 0, stream, gpu_args)
                self._flow(correlation, launch_start, gpu_start, stream)
                self.gpu.append((stream, gpu_start, gpu_start + gpu_dur, launch_start))
                correlation += 1
                external += 1
                t = op_end + self.rng.choice((1_000, 2_000, 50_000)) if self.rng.random() < 0.97 else op_end + 400_000  # host stalls
            self._x("user_annotation", "## backward ##", annotation_start, t - annotation_start, spec.pid, spec.tid, {"External id": external})
            external += 1
            if spec.memory:  # the step's activations freed outside any op (references dropped)
                while self.live:
                    addr, size = self.live.pop()
                    self._allocator(step, t, -size, addr, "")
                    t += 100
                self.truth.memory_by_step[step]["end_allocated"] = self.allocated
            # Synchronize at the end of the step: the host blocks until the GPU is done.
            sync_start = t
            sync_name = "cudaDeviceSynchronize" if step_index % 2 == 0 else "cudaStreamSynchronize"
            sync_end = max(max(free.values()), sync_start) + 2_000
            self._x("cuda_runtime", sync_name, sync_start, sync_end - sync_start, spec.pid, spec.tid, {"cbid": 165, "correlation": correlation})
            correlation += 1
            s = self.truth.syncs.setdefault(sync_name, {"count": 0, "total_ns": 0})
            s["count"] += 1
            s["total_ns"] += sync_end - sync_start
            t = sync_end + 3_000
            self._x("user_annotation", f"ProfilerStep#{step}", step_start, t - step_start, spec.pid, spec.tid, {"External id": external})
            external += 1
            self.truth.step_ns[step] = t - step_start
            t += 1_000
        self._finish_truth()
        self._flush(final=True)
        self.out.write('\n],\n"traceName": "synthetic", "displayTimeUnit": "ms"}\n')
        return self.truth

    def _memory_op(self, step: int, op: str, start: int, forward: bool, leak: bool) -> None:
        """Allocator events inside one op (all before its launch call, 1 µs after its start):
        a forward op allocates an activation kept until the step ends; a backward op frees
        the newest activation and allocates and frees a gradient buffer; the step's first op
        also allocates the leaked block."""
        truth = self.truth
        if step not in truth.memory_by_step:
            truth.memory_by_step[step] = {"peak_allocated": -1, "peak_reserved": -1, "reserved_at_peak": -1, "allocations": 0, "frees": 0, "start_allocated": self.allocated, "end_allocated": 0, "unfreed_bytes": 0}
        ts = start + 100
        if leak and self.spec.leak_bytes:
            self._allocator(step, ts, self.spec.leak_bytes, self._new_addr(self.spec.leak_bytes), op)
            truth.memory_by_step[step]["unfreed_bytes"] += self.spec.leak_bytes
            truth.leak_op[step] = op
            ts += 100
        if forward:
            size = self.rng.choice((1, 2, 4, 8)) * (self.spec.activation_bytes // 8) or 512
            addr = self._new_addr(size)
            self._allocator(step, ts, size, addr, op)
            self.live.append((addr, size))
            return
        if self.live:
            addr, size = self.live.pop()
            self._allocator(step, ts, -size, addr, op)
            ts += 100
        size = self.rng.choice((1, 2)) * (self.spec.activation_bytes // 4) or 512
        addr = self._new_addr(size)
        self._allocator(step, ts, size, addr, op)
        self._allocator(step, ts + 100, -size, addr, op)

    def _new_addr(self, size: int) -> int:
        addr = self.next_addr
        self.next_addr += -(-size // 512) * 512 + 512
        return addr

    def _allocator(self, step: int, ts: int, size: int, addr: int, op: str) -> None:
        """One [memory] instant; the caching allocator's totals by plain arithmetic: reserved
        grows in segments (SynthSpec.segment_bytes) when the allocated bytes need it and never shrinks."""
        self.allocated += size
        segment = max(self.spec.segment_bytes, 1)
        self.reserved = max(self.reserved, -(-self.allocated // segment) * segment)
        entry = self.truth.memory_by_step[step]
        if size > 0:
            entry["allocations"] += 1
            self.truth.allocated_bytes_by_op[op or "(no op)"] = self.truth.allocated_bytes_by_op.get(op or "(no op)", 0) + size
        else:
            entry["frees"] += 1
        if self.allocated > entry["peak_allocated"]:
            entry["peak_allocated"] = self.allocated
            entry["reserved_at_peak"] = self.reserved
            self.truth.memory_peak_op[step] = op or "(no op)"
        entry["peak_reserved"] = max(entry["peak_reserved"], self.reserved)
        args = {"Total Reserved": self.reserved, "Total Allocated": self.allocated, "Bytes": size, "Device Id": 0, "Device Type": 1, "Addr": addr}
        self.lines.append(f'{{"ph": "i", "cat": "cpu_instant_event", "s": "t", "name": "[memory]", "pid": {self.spec.pid}, "tid": {self.spec.tid}, "ts": {_us(ts)}, "args": {json.dumps(args)}}}')
        self.truth.events += 1

    def _meta(self) -> None:
        self.lines.append(json.dumps({"ph": "M", "name": "process_name", "pid": self.spec.pid, "tid": 0, "args": {"name": "python"}}))
        for stream in self.spec.streams:
            self.lines.append(json.dumps({"ph": "M", "name": "thread_name", "pid": 0, "tid": stream, "args": {"name": f"stream {stream}"}}))
        # Kineto's bookkeeping events carry string pids and tids.
        self.lines.append('{"ph": "i", "s": "g", "name": "Iteration Start: PyTorch Profiler", "pid": "Traces", "tid": "Trace PyTorch Profiler", "ts": 1000.000}')

    def _x(self, cat: str, name: str, ts: int, dur: int, pid: int, tid: int, args: dict[str, Any]) -> None:
        self.lines.append(
            f'{{"ph": "X", "cat": "{cat}", "name": {json.dumps(name)}, "pid": {pid}, "tid": {tid}, '
            f'"ts": {_us(ts)}, "dur": {_us(dur)}, "args": {json.dumps(args)}}}'
        )
        self.truth.events += 1
        if len(self.lines) >= 4096:
            self._flush()

    def _flow(self, correlation: int, launch_ts: int, gpu_ts: int, stream: int) -> None:
        self.lines.append(f'{{"ph": "s", "id": {correlation}, "pid": {self.spec.pid}, "tid": {self.spec.tid}, "ts": {_us(launch_ts)}, "cat": "ac2g", "name": "ac2g"}}')
        self.lines.append(f'{{"ph": "f", "id": {correlation}, "pid": 0, "tid": {stream}, "ts": {_us(gpu_ts)}, "cat": "ac2g", "name": "ac2g", "bp": "e"}}')

    def _flush(self, final: bool = False) -> None:
        if not self.lines:
            return
        text = ",\n".join(self.lines)
        self.out.write(text if self.first else ",\n" + text)
        self.first = False
        self.lines = []

    def _finish_truth(self) -> None:
        """Idle time from the GPU activities, by the definitions in docs/traces.md."""
        truth = self.truth
        by_stream: dict[int, list[tuple[int, int, int, int]]] = defaultdict(list)
        for activity in self.gpu:
            by_stream[activity[0]].append(activity)
        categories = {"host_wait": 0, "kernel_wait": 0, "other": 0}
        for stream, activities in by_stream.items():
            activities.sort(key=lambda a: a[1])
            idle = 0
            for previous, current in zip(activities, activities[1:]):
                gap = current[1] - previous[2]
                idle += gap
                if current[3] > previous[2]:
                    categories["host_wait"] += gap
                elif gap < KERNEL_WAIT_NS:
                    categories["kernel_wait"] += gap
                else:
                    categories["other"] += gap
            truth.idle_ns_by_stream[stream] = idle
        truth.idle_by_category = categories
        ordered = sorted((a[1], a[2]) for a in self.gpu)
        busy, current_start, current_end = 0, ordered[0][0], ordered[0][1]
        for start, end in ordered[1:]:
            if start > current_end:
                busy += current_end - current_start
                current_start, current_end = start, end
            else:
                current_end = max(current_end, end)
        busy += current_end - current_start
        truth.gpu_busy_ns = busy
        truth.gpu_span_ns = max(a[2] for a in self.gpu) - ordered[0][0]
