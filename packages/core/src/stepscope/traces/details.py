"""Operator and kernel views from the fields the trace tables do not keep: operators by name
and by input shapes (torch.profiler's record_shapes=True writes "Input Dims") with their
Python call stack (with_stack=True writes `python_function` events around them), and
kernels by name and by the operator that launched them, with the launch configuration
Kineto records on GPU (`grid`, `block`, `registers per thread`, `shared memory`,
`est. achieved occupancy %`).

The trace engine's tables (stepscope.traces.reader) stay as they are: these views read the
trace files again, only when asked (`stepscope profile --view operators|kernels`, the app's
Statistics tab), and keep only the events they need."""

from __future__ import annotations

import gzip
import io
import json
from collections import Counter
from collections.abc import Iterable
from typing import Any

import numpy as np
import pandas as pd

from ..exceptions import StepscopeError
from ..store import Store

# A trace larger than this (after decompression) is refused here: the views load it whole.
MAX_TRACE_BYTES = 1 << 30
_INFLATION = 100  # gzip that inflates more than this is a bomb, not a trace
STACK_FRAMES = 3  # innermost user frames shown per operator

# Kernels that run on tensor cores, by the names NVIDIA's and PyTorch's libraries give them
# (Kineto records no tensor-core counter: this is the name-based reading the TensorBoard
# plugin also used).
_TENSOR_CORE_MARKS = ("884", "1688", "16816", "hmma", "imma", "xmma", "wgmma", "tensorop", "_tc_", "mma_", "gemmsm80", "sm90_xmma", "cutlass_80", "cutlass_90")


class TraceDetailError(StepscopeError):
    """A trace file the operator/kernel views cannot read (named, with why)."""


def read_events(store: Store, key: str, max_bytes: int = MAX_TRACE_BYTES) -> list[dict[str, Any]]:
    """The complete ('X') events of the categories these views use, from one Kineto trace
    (plain or gzip JSON)."""
    raw = store.read(key)
    if raw[:2] == b"\x1f\x8b":
        out = io.BytesIO()
        with gzip.GzipFile(fileobj=io.BytesIO(raw)) as stream:
            while chunk := stream.read(1 << 20):
                out.write(chunk)
                if out.tell() > max_bytes or out.tell() > max(64 << 20, _INFLATION * len(raw)):
                    raise TraceDetailError(f"{key}: decompresses to more than {min(max_bytes, max(64 << 20, _INFLATION * len(raw))) >> 20} MiB: refused")
        raw = out.getvalue()
    if len(raw) > max_bytes:
        raise TraceDetailError(f"{key}: {len(raw) >> 20} MiB, over the {max_bytes >> 20} MiB these views load")
    try:
        data = json.loads(raw)
    except (ValueError, RecursionError) as exc:
        raise TraceDetailError(f"{key}: not a JSON trace ({exc})") from None
    events = data.get("traceEvents") if isinstance(data, dict) else data
    if not isinstance(events, list):
        raise TraceDetailError(f"{key}: no traceEvents list")
    wanted = {"cpu_op", "python_function", "kernel", "cuda_runtime", "cuda_driver"}
    return [e for e in events if isinstance(e, dict) and e.get("ph") == "X" and e.get("cat") in wanted]


def _args(event: dict[str, Any]) -> dict[str, Any]:
    args = event.get("args")
    return args if isinstance(args, dict) else {}


def _shapes(args: dict[str, Any]) -> str:
    dims = args.get("Input Dims")
    if not isinstance(dims, list):
        return ""
    return ", ".join("[" + ", ".join(str(d) for d in dim) + "]" if isinstance(dim, list) else str(dim) for dim in dims)


def _frames(events: list[dict[str, Any]]) -> pd.DataFrame:
    """cpu_op and python_function events as one frame: kind, name, thread, start, end (ns)."""
    rows = []
    for e in events:
        cat = e.get("cat")
        if cat not in ("cpu_op", "python_function"):
            continue
        try:
            start = int(round(float(e["ts"]) * 1000))
            end = start + int(round(float(e.get("dur", 0)) * 1000))
        except (KeyError, TypeError, ValueError):
            continue
        args = _args(e)
        rows.append((cat, str(e.get("name", "")), f"{e.get('pid')}/{e.get('tid')}", start, end, _shapes(args) if cat == "cpu_op" else "",
                     args.get("External id")))
    return pd.DataFrame(rows, columns=["cat", "name", "thread", "start", "end", "shapes", "external_id"])


def _user_frame(name: str) -> bool:
    """A Python frame of the user's code, not of torch, a library or the interpreter."""
    return not (name.startswith(("torch/", "<built-in", "threading.py", "<frozen")) or "site-packages/" in name or "/lib/python" in name
                or name.startswith("nn.Module:") or name.startswith("contextlib.py") or name.startswith("functools.py"))


def _annotate(frames: pd.DataFrame) -> pd.DataFrame:
    """Per cpu_op: self time (ns; minus the cpu_ops nested in it on its thread), its call stack
    (the innermost user frames of the python_function events around it), and whether it
    sits directly inside an operator of the same name."""
    frames = frames.sort_values(["thread", "start", "end"], ascending=[True, True, False], kind="stable").reset_index(drop=True)
    n = len(frames)
    child = np.zeros(n, dtype=np.int64)
    parent_op = np.full(n, -1, dtype=np.int64)
    stacks = [""] * n
    open_ops: list[int] = []
    open_py: list[int] = []
    last = None
    cat, names, thread = frames["cat"].tolist(), frames["name"].tolist(), frames["thread"].tolist()
    start, end = frames["start"].to_numpy(), frames["end"].to_numpy()
    for i in range(n):
        if thread[i] != last:
            open_ops.clear()
            open_py.clear()
            last = thread[i]
        while open_ops and end[open_ops[-1]] <= start[i]:
            open_ops.pop()
        while open_py and end[open_py[-1]] <= start[i]:
            open_py.pop()
        if cat[i] == "python_function":
            open_py.append(i)
            continue
        if open_ops and end[i] <= end[open_ops[-1]]:
            child[open_ops[-1]] += end[i] - start[i]
            parent_op[i] = open_ops[-1]
        user = [names[j] for j in open_py if _user_frame(names[j])]
        stacks[i] = " <- ".join(reversed(user[-STACK_FRAMES:]))
        open_ops.append(i)
    frames["self_ns"] = (end - start) - child
    # an operator directly inside one of the same name (aten::sum calling aten::sum) is not
    # a call of its own: its time is already in its parent's (torch's key_averages agrees)
    parent_name = np.array([names[j] if j >= 0 else None for j in parent_op.tolist()], dtype=object)
    frames["repeat"] = parent_name == np.array(names, dtype=object)
    frames["stack"] = stacks
    return frames[frames["cat"] == "cpu_op"].reset_index(drop=True)


def operator_table(events: list[dict[str, Any]], by: str = "name") -> pd.DataFrame:
    """CPU operators grouped by `name`, `shapes` (name and input shapes) or `stack` (name and
    call stack): calls, total_us (inclusive), self_us, mean_us, and the most frequent call
    stack; by total time, largest first. The figures are torch.profiler's key_averages'
    (an operator directly inside one of its own name is counted in its parent's call)."""
    if by not in ("name", "shapes", "stack"):
        raise ValueError(f"by must be 'name', 'shapes' or 'stack', not {by!r}")
    columns = ["name", "input_shapes", "calls", "total_us", "self_us", "mean_us", "stack"]
    ops = _annotate(_frames(events)) if events else pd.DataFrame()
    if ops.empty:
        return pd.DataFrame(columns=columns)
    ops["dur_ns"] = (ops["end"] - ops["start"]).where(~ops["repeat"], 0)
    keys = {"name": ["name"], "shapes": ["name", "shapes"], "stack": ["name", "stack"]}[by]
    rows = []
    for key, group in ops.groupby(keys, sort=False):
        key = key if isinstance(key, tuple) else (key,)
        stack = Counter(s for s in group["stack"] if s).most_common(1)
        rows.append({
            "name": key[0], "input_shapes": key[1] if by == "shapes" else (group["shapes"].iloc[0] if group["shapes"].nunique() == 1 else "(several)"),
            "calls": int((~group["repeat"]).sum()), "total_us": group["dur_ns"].sum() / 1000.0, "self_us": group["self_ns"].sum() / 1000.0,
            "mean_us": group["dur_ns"].sum() / 1000.0 / max(1, int((~group["repeat"]).sum())), "stack": key[1] if by == "stack" else (stack[0][0] if stack else ""),
        })
    return pd.DataFrame(rows, columns=columns).sort_values(["total_us", "name"], ascending=[False, True], ignore_index=True)


def _uses_tensor_cores(name: str) -> bool:
    lowered = name.lower()
    return any(mark in lowered for mark in _TENSOR_CORE_MARKS)


def _number(value: Any) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        return float("nan")


def _dims(value: Any) -> str:
    return "x".join(str(int(v)) for v in value) if isinstance(value, list) and all(isinstance(v, (int, float)) for v in value) else ""


def kernel_table(events: list[dict[str, Any]], by: str = "name") -> pd.DataFrame:
    """GPU kernels grouped by `name` or by `op` (name and the CPU operator that launched it,
    through the launch's correlation id and the operator's External id): calls, total_us,
    mean_us, the launch configuration (grid, block; '(several)' when it varied), registers
    per thread, shared memory bytes, mean est. achieved occupancy %, and tensor-core use
    read from the kernel's name. Fields a trace does not record are empty/NaN."""
    if by not in ("name", "op"):
        raise ValueError(f"by must be 'name' or 'op', not {by!r}")
    columns = ["name", "launched_by", "calls", "total_us", "mean_us", "grid", "block", "registers_per_thread", "shared_memory", "occupancy_pct", "tensor_cores"]
    kernels = [e for e in events if e.get("cat") == "kernel"]
    if not kernels:
        return pd.DataFrame(columns=columns)
    # the operator of each External id (the innermost one: the last seen on its thread wins
    # over its enclosing ones, which start earlier)
    op_of: dict[Any, tuple[float, str]] = {}
    for e in events:
        if e.get("cat") == "cpu_op":
            args = _args(e)
            ext = args.get("External id")
            if ext is not None and (ext not in op_of or _number(e.get("ts")) >= op_of[ext][0]):
                op_of[ext] = (_number(e.get("ts")), str(e.get("name", "")))
    ext_of_launch = {}
    for e in events:
        if e.get("cat") in ("cuda_runtime", "cuda_driver"):
            args = _args(e)
            if args.get("correlation") is not None:
                ext_of_launch[args["correlation"]] = args.get("External id")
    rows = []
    for e in kernels:
        args = _args(e)
        ext = args.get("External id", ext_of_launch.get(args.get("correlation")))
        rows.append((str(e.get("name", "")), op_of.get(ext, (0.0, ""))[1], _number(e.get("dur")), _dims(args.get("grid")), _dims(args.get("block")),
                     _number(args.get("registers per thread")), _number(args.get("shared memory")), _number(args.get("est. achieved occupancy %"))))
    frame = pd.DataFrame(rows, columns=["name", "launched_by", "dur_us", "grid", "block", "registers", "shared", "occupancy"])
    keys = ["name"] if by == "name" else ["name", "launched_by"]
    out = []
    for key, group in frame.groupby(keys, sort=False):
        key = key if isinstance(key, tuple) else (key,)

        ops = group["launched_by"][group["launched_by"] != ""].unique()
        out.append({
            "name": key[0], "launched_by": key[1] if by == "op" else (ops[0] if len(ops) == 1 else f"({len(ops)} operators)" if len(ops) else ""),
            "calls": len(group), "total_us": float(group["dur_us"].sum()), "mean_us": float(group["dur_us"].mean()),
            "grid": _one(group["grid"]), "block": _one(group["block"]), "registers_per_thread": float(group["registers"].max()),
            "shared_memory": float(group["shared"].max()), "occupancy_pct": float(group["occupancy"].mean()) if group["occupancy"].notna().any() else float("nan"),
            "tensor_cores": _uses_tensor_cores(key[0]),
        })
    return pd.DataFrame(out, columns=columns).sort_values(["total_us", "name"], ascending=[False, True], ignore_index=True)


def _one(values: pd.Series) -> str:
    """The value every launch had, '(several)' when they differ, '' when none was recorded."""
    found = values[values != ""].unique()
    return str(found[0]) if len(found) == 1 else ("(several)" if len(found) else "")


def views(store: Store, keys: Iterable[str], k: int | None = None) -> dict[str, pd.DataFrame]:
    """The operator and kernel views over the given traces (a `rank`/`trace` column first
    when there are several), each cut to its top `k` rows by total time."""
    tables: dict[str, list[pd.DataFrame]] = {name: [] for name in ("operators", "operators_by_shapes", "operators_by_stack", "kernels", "kernels_by_op")}
    keys = list(keys)
    for key in keys:
        events = read_events(store, key)
        found = {
            "operators": operator_table(events, "name"), "operators_by_shapes": operator_table(events, "shapes"),
            "operators_by_stack": operator_table(events, "stack"), "kernels": kernel_table(events, "name"), "kernels_by_op": kernel_table(events, "op"),
        }
        for name, frame in found.items():
            if len(keys) > 1:
                frame.insert(0, "trace", key.rsplit("/", 1)[-1])
            tables[name].append(frame.head(k) if k else frame)
    return {name: pd.concat(parts, ignore_index=True) if parts else pd.DataFrame() for name, parts in tables.items()}
