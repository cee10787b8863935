"""The columns of a trace table and how Kineto categories map onto event kinds.

One table per trace (one rank, one profiling window) holds every event the analyses use,
one row each; `kind` says which table of the issue's list a row belongs to (kernels,
runtime calls, CPU ops, memcpy/memset, syncs, annotations, memory events). Times are
integer nanoseconds: epoch nanoseconds where the trace gives its base time, else the
trace's own clock."""

from __future__ import annotations

import re

import pyarrow as pa

# Kinds, in the order of their int8 codes.
KINDS = (
    "kernel",
    "memcpy",
    "memset",
    "runtime",  # CUDA/HIP runtime and driver calls on the host (launches among them)
    "sync",  # host synchronize calls: runtime calls that block the host (cudaStreamSynchronize ...)
    "cpu_op",
    "annotation",  # user annotations on the host (record_function, stepscope.annotate, steps)
    "gpu_annotation",
    "python",
    "memory",  # allocator instants ([memory]): bytes allocated (+) or freed (-)
    "gpu_sync",  # GPU-side sync records (`cuda_sync`: stream/event/context syncs, stream waits)
    "other",  # duration events of a category not listed below (e.g. mtia_*): kept, not analysed
)
KIND_CODE = {name: code for code, name in enumerate(KINDS)}
GPU_KINDS = ("kernel", "memcpy", "memset")
# Categories Kineto writes for its own bookkeeping, not for work: kept as `other` rows like
# any unknown category, but not named in the "not analysed" warning.
BOOKKEEPING_CATEGORIES = frozenset({"Trace", "trace", "overhead", "cuda_profiler_range", "ac2g", "fwdbwd"})
# GPU work whose launching runtime call is not in the trace (it was launched before the
# profiler started): it belongs to no profiled step; per-step tables show it in its own row.
BEFORE_FIRST_STEP = -2

# Kineto / Chrome-trace `cat` values -> kind. Upper-case forms are older Kineto releases.
CATEGORY_KIND = {
    "kernel": "kernel",
    "Kernel": "kernel",
    "gpu_memcpy": "memcpy",
    "Memcpy": "memcpy",
    "gpu_memset": "memset",
    "Memset": "memset",
    "cuda_runtime": "runtime",
    "Runtime": "runtime",
    "cuda_driver": "runtime",
    "Driver": "runtime",
    "hip_runtime": "runtime",
    "cuda_sync": "gpu_sync",
    "cpu_op": "cpu_op",
    "Operator": "cpu_op",
    "operator": "cpu_op",
    "user_annotation": "annotation",
    "gpu_user_annotation": "gpu_annotation",
    "python_function": "python",
    "cpu_instant_event": "memory",  # only the ones named [memory] are kept
}

# Runtime calls that block the host until the device (or a stream, or an event) is done.
SYNC_CALLS = (
    "cudaDeviceSynchronize",
    "cudaStreamSynchronize",
    "cudaEventSynchronize",
    "cudaStreamWaitEvent",
    "hipDeviceSynchronize",
    "hipStreamSynchronize",
    "hipEventSynchronize",
    "hipStreamWaitEvent",
)
# Runtime calls that put work on the GPU (their correlation id names a GPU activity).
LAUNCH_CALL_RE = re.compile(r"^(cuda|hip)(LaunchKernel|LaunchKernelExC|LaunchCooperativeKernel|Memcpy|MemcpyAsync|Memset|MemsetAsync|GraphLaunch)|^cuLaunchKernel")

STEP_NAME_RE = re.compile(r"^ProfilerStep#(\d+)$")
MISSING = -1  # integer columns use -1 for "not in the trace"

EVENT_SCHEMA = pa.schema(
    [
        ("kind", pa.int8()),
        ("name", pa.dictionary(pa.int32(), pa.string())),
        ("ts_ns", pa.int64()),
        ("dur_ns", pa.int64()),
        ("pid", pa.int64()),
        ("tid", pa.int64()),
        ("correlation", pa.int64()),
        ("external_id", pa.int64()),
        ("device", pa.int32()),
        ("stream", pa.int32()),
        ("bytes", pa.int64()),
        ("total_allocated", pa.int64()),
        ("total_reserved", pa.int64()),
        ("addr", pa.int64()),
        ("device_type", pa.int8()),
        ("step", pa.int32()),
        ("category", pa.dictionary(pa.int32(), pa.string())),
    ]
)
COLUMNS = tuple(EVENT_SCHEMA.names)

# Precision classes read from kernel names (cuBLAS/cuDNN/CUTLASS naming), first match wins.
_PRECISION_PATTERNS = (
    ("fp8", re.compile(r"fp8|e4m3|e5m2|f8f8", re.I)),
    ("int8", re.compile(r"int8|i8i8|imma|s8s8", re.I)),
    ("bf16", re.compile(r"bf16|bfloat16|__nv_bfloat16", re.I)),
    ("fp16", re.compile(r"fp16|f16f16|half|h884|h1688|h16816|hmma|__half", re.I)),
    ("tf32", re.compile(r"tf32|xmma.*f32f32_tf32|s1688|s16816", re.I)),
    ("fp32", re.compile(r"fp32|float|sgemm|f32|s884|scudnn", re.I)),
)


# Collective-communication kernels (NCCL, RCCL, oneCCL): their names carry the element
# type of the reduction (ncclKernel_AllReduce_RING_LL_Sum_int8_t), not a math precision.
COMMUNICATION_RE = re.compile(r"nccl|rccl|ccl[A-Z_]|allreduce|all_reduce|allgather|all_gather|reducescatter|reduce_scatter|alltoall|all_to_all|sendrecv", re.I)


def is_communication(kernel_name: str) -> bool:
    return COMMUNICATION_RE.search(kernel_name) is not None


def precision_class(kernel_name: str) -> str:
    """communication for collective kernels, else fp8 / int8 / bf16 / fp16 / tf32 / fp32 from
    a kernel's name, or "unknown"."""
    if is_communication(kernel_name):
        return "communication"
    for label, pattern in _PRECISION_PATTERNS:
        if pattern.search(kernel_name):
            return label
    return "unknown"


def memcpy_direction(name: str) -> str:
    """H2D / D2H / D2D / P2P / memset from a memcpy or memset activity's name."""
    if "Memset" in name or "memset" in name:
        return "memset"
    for token, label in (("HtoD", "H2D"), ("DtoH", "D2H"), ("DtoD", "D2D"), ("PtoP", "P2P"), ("HtoH", "H2H")):
        if token in name:
            return label
    return "unknown"


def memcpy_host_memory(name: str) -> str:
    """Whether the host side was pinned or pageable memory, where Kineto's name says so."""
    if "Pinned" in name:
        return "pinned"
    if "Pageable" in name:
        return "pageable"
    return "unknown"
