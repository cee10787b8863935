"""TensorFlow's XSpace (`*.xplane.pb`, what tf.profiler.experimental writes) into the same
event table as Kineto traces. The messages are decoded with the `protobuf` library from
descriptors built here (no TensorFlow import, no xprof), as events.py does for `Event`.

Mapping (see docs/traces.md): on `/host:CPU`, events of the thread that marks the steps
(the line with `ProfilerStep` events, else the `python` line) are annotations
(TraceMe: `tf.profiler.experimental.Trace`, `stepscope.annotate`; `ProfilerStep` with a
`step_num` stat becomes `ProfilerStep#<n>`), events of the other host lines are CPU ops,
events carrying a `correlation_id` stat on host lines are runtime calls (CUPTI API);
on `/device:GPU:<n>` planes, each line is a stream and its events are kernels, memcpy
(`Memcpy*`) or memset (`Memset*`) activities. XSpace holds one process: it is parsed whole,
one Python object per event, which suits the small traces profiling windows produce."""

from __future__ import annotations

import re
from typing import Any

import numpy as np

from ..exceptions import CorruptRecord
from ..proto_messages import message_classes
from .reader import RawTrace, _assign_steps, _to_table
from .schema import EVENT_SCHEMA, KIND_CODE, MISSING, SYNC_CALLS

_PACKAGE = "stepscope.xplane"
# The messages of xprof's xplane.proto that the trace engine reads, in its field syntax.
_MESSAGES = {
    "XStat": "int64 metadata_id = 1; double double_value = 2; uint64 uint64_value = 3; int64 int64_value = 4; string str_value = 5; bytes bytes_value = 6; uint64 ref_value = 7",
    "XEvent": "int64 metadata_id = 1; int64 offset_ps = 2; int64 duration_ps = 3; repeated XStat stats = 4; int64 num_occurrences = 5",
    "XLine": (
        "int64 id = 1; string name = 2; int64 timestamp_ns = 3; repeated XEvent events = 4; int64 duration_ps = 9; int64 display_id = 10; "
        "string display_name = 11"
    ),
    "XEventMetadata": "int64 id = 1; string name = 2; bytes metadata = 3; string display_name = 4; repeated XStat stats = 5; repeated int64 child_id = 6",
    "XStatMetadata": "int64 id = 1; string name = 2; string description = 3",
    # map<int64, ...> fields are, on the wire, repeated entries of (key = 1, value = 2).
    "EventMetadataEntry": "int64 key = 1; XEventMetadata value = 2",
    "StatMetadataEntry": "int64 key = 1; XStatMetadata value = 2",
    "XPlane": (
        "int64 id = 1; string name = 2; repeated XLine lines = 3; repeated EventMetadataEntry event_metadata = 4; "
        "repeated StatMetadataEntry stat_metadata = 5; repeated XStat stats = 6"
    ),
    "XSpace": "repeated XPlane planes = 1; repeated string errors = 2; repeated string warnings = 3; repeated string hostnames = 4",
}

_CLASSES = message_classes(_PACKAGE, _MESSAGES)
XSpace = _CLASSES["XSpace"]
_GPU_PLANE = re.compile(r"^/device:GPU:(\d+)")
_STREAM = re.compile(r"(\d+)")
_HOST_PLANE = "/host:CPU"


def _stat_value(stat: Any, names: dict[int, str]) -> Any:
    """The set value of an XStat (the descriptors here declare no oneof: the first non-zero
    field wins; a ref_value names another stat metadata entry)."""
    for candidate in ("int64_value", "uint64_value", "double_value", "str_value", "ref_value", "bytes_value"):
        value = getattr(stat, candidate)
        if value:
            return names.get(value, value) if candidate == "ref_value" else value
    return None


def _without_warmup(arrays: dict[str, np.ndarray], codes: np.ndarray, dictionary: np.ndarray) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """Drop what the warm-up steps recorded (stepscope_tf marks them `ProfilerWarmup`; TF's
    profiler has no warm-up of its own): host events that start before the last warm-up
    step ends, and GPU work launched by them (or, with no launch to go by, started then)."""
    warmup_codes = np.flatnonzero(dictionary == "ProfilerWarmup")
    if warmup_codes.size == 0 or codes.size == 0:
        return arrays, codes
    markers = np.isin(codes, warmup_codes)
    cut = int((arrays["ts_ns"][markers] + arrays["dur_ns"][markers]).max())
    gpu = np.isin(arrays["kind"], [KIND_CODE[k] for k in ("kernel", "memcpy", "memset")])
    early_host = ~gpu & (arrays["ts_ns"] < cut)
    dropped_calls = arrays["correlation"][early_host & (arrays["correlation"] != MISSING)]
    launched_early = np.isin(arrays["correlation"], dropped_calls) & (arrays["correlation"] != MISSING)
    known_launch = np.isin(arrays["correlation"], arrays["correlation"][~gpu & (arrays["correlation"] != MISSING)])
    keep = ~early_host & ~(gpu & (launched_early | (~known_launch & (arrays["ts_ns"] < cut))))
    return {name: values[keep] for name, values in arrays.items()}, codes[keep]


def read_xspace(data: bytes, where: str = "<xspace>") -> RawTrace:
    """The event table of one XSpace file."""
    space = XSpace()
    try:
        space.ParseFromString(data)
    except Exception as exc:
        raise CorruptRecord(where, None, f"not an XSpace protobuf ({exc})") from None
    if not space.planes:
        raise CorruptRecord(where, None, "an XSpace without planes")
    rows: dict[str, list[Any]] = {name: [] for name in EVENT_SCHEMA.names if name != "category"}
    base_ns = 0
    for plane in space.planes:
        stat_names = {entry.key: entry.value.name for entry in plane.stat_metadata}
        if plane.name == "Task Environment":
            for stat in plane.stats:
                if stat_names.get(stat.metadata_id) == "profile_start_time":
                    base_ns = int(_stat_value(stat, stat_names) or 0)
    for plane in space.planes:
        gpu = _GPU_PLANE.match(plane.name)
        if plane.name != _HOST_PLANE and not gpu:
            continue
        event_names = {entry.key: entry.value.name for entry in plane.event_metadata}
        stat_names = {entry.key: entry.value.name for entry in plane.stat_metadata}
        # The thread that marks steps carries the Python TraceMe annotations. Its line is named
        # after the thread, which is the process name ("python", but "pytest" or a console
        # script's name too), so it is found by its ProfilerStep markers, else by that name.
        step_ids = {key for key, name in event_names.items() if name in ("ProfilerStep", "ProfilerWarmup")}
        annotation_lines = {line.id for line in plane.lines if line.name == "python" or any(e.metadata_id in step_ids for e in line.events)}
        for line in plane.lines:
            stream_match = _STREAM.search(line.name) if gpu else None
            stream = int(stream_match.group(1)) if stream_match else (MISSING if not gpu else int(line.id))
            for event in line.events:
                if event.duration_ps <= 0 and not gpu:
                    continue  # instants (thread-pool bookkeeping)
                name = event_names.get(event.metadata_id, "")
                stats = {stat_names.get(s.metadata_id, ""): _stat_value(s, stat_names) for s in event.stats}
                correlation = int(stats.get("correlation_id", MISSING) or MISSING)
                if gpu:
                    kind = "memcpy" if name.startswith("Memcpy") or "memcpy" in name.lower()[:12] else "memset" if name.startswith("Memset") else "kernel"
                elif line.id in annotation_lines:
                    kind = "annotation"
                    if name == "ProfilerStep" and "step_num" in stats:
                        name = f"ProfilerStep#{int(stats['step_num'])}"
                elif correlation != MISSING:
                    kind = "sync" if name in SYNC_CALLS else "runtime"
                else:
                    kind = "cpu_op"
                start_ns = line.timestamp_ns + event.offset_ps // 1000
                rows["kind"].append(KIND_CODE[kind])
                rows["name"].append(name)
                rows["ts_ns"].append(start_ns)
                rows["dur_ns"].append(event.duration_ps // 1000)
                rows["pid"].append(int(gpu.group(1)) if gpu else 0)
                rows["tid"].append(stream if gpu else int(line.id))
                rows["correlation"].append(correlation)
                rows["external_id"].append(MISSING)
                rows["device"].append(int(gpu.group(1)) if gpu else MISSING)
                rows["stream"].append(stream if gpu else MISSING)
                size = stats.get("memcpy_details") or stats.get("bytes")
                rows["bytes"].append(_bytes_of(size))
                rows["total_allocated"].append(MISSING)
                rows["total_reserved"].append(MISSING)
                rows["addr"].append(MISSING)
                rows["device_type"].append(MISSING)
                rows["step"].append(MISSING)
    arrays = {name: np.asarray(values, dtype=EVENT_SCHEMA.field(name).type.to_pandas_dtype()) for name, values in rows.items() if name != "name"}
    # Line timestamps are relative to the profile's start in the TF releases that record it.
    if base_ns and arrays["ts_ns"].size and arrays["ts_ns"].max() < 10**17:
        arrays["ts_ns"] = arrays["ts_ns"] + base_ns
    dictionary, codes = np.unique(np.asarray(rows["name"], dtype=object), return_inverse=True) if rows["name"] else (np.array([], dtype=object), np.array([], dtype=np.int32))
    codes = codes.astype(np.int32)
    arrays, codes = _without_warmup(arrays, codes, dictionary)
    _assign_steps(arrays, dictionary, codes)
    metadata = {"hostnames": list(space.hostnames), "source_format": "xspace"}
    categories = np.array(["xspace_gpu", "xspace_host"], dtype=object)  # the plane kind each row came from
    category_codes = np.isin(arrays["kind"], [KIND_CODE[k] for k in ("kernel", "memcpy", "memset")]).astype(np.int32) ^ 1
    return RawTrace(_to_table(arrays, codes, dictionary, category_codes, categories), metadata, base_ns, where, 0)


def _bytes_of(value: Any) -> int:
    if isinstance(value, int):
        return value
    if isinstance(value, str):
        match = re.search(r"num_bytes:(\d+)", value) or re.search(r"(\d+)", value)
        return int(match.group(1)) if match else MISSING
    return MISSING
