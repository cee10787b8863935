"""The record payload: TensorFlow's `Event` protobuf with one `Summary.Value` per tensor.

Messages are decoded with the `protobuf` library, from descriptors built here at import
(no generated code, no dependency on TensorFlow). Tensor events on the write path are
encoded by `encode_tensor_event`, which produces the same bytes as protobuf's serializer
(tests check this) but hands the tensor's buffer through without copying it: for large
tensors that copy is most of the cost (see bench/bench_writer.py)."""

from __future__ import annotations

import functools
import math
import struct
import time
from dataclasses import dataclass
from typing import Any

import numpy as np
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

from .modes import ModeKeys
from .tf_dtypes import DT_STRING, dtype_code
from .tf_dtypes import DT_TO_NUMPY as _DT_TO_NUMPY

_F = descriptor_pb2.FieldDescriptorProto
_PACKAGE = "stepscope.tf"

# (message, [(field name, number, type, label, type_name)])
_MESSAGES: list[tuple[str, list[tuple[str, int, int, int, str]]]] = [
    ("TensorShapeProto.Dim", [("size", 1, _F.TYPE_INT64, _F.LABEL_OPTIONAL, ""), ("name", 2, _F.TYPE_STRING, _F.LABEL_OPTIONAL, "")]),
    ("TensorShapeProto", [("dim", 2, _F.TYPE_MESSAGE, _F.LABEL_REPEATED, "TensorShapeProto.Dim"), ("unknown_rank", 3, _F.TYPE_BOOL, _F.LABEL_OPTIONAL, "")]),
    (
        "TensorProto",
        [
            ("dtype", 1, _F.TYPE_INT32, _F.LABEL_OPTIONAL, ""),
            ("tensor_shape", 2, _F.TYPE_MESSAGE, _F.LABEL_OPTIONAL, "TensorShapeProto"),
            ("version_number", 3, _F.TYPE_INT32, _F.LABEL_OPTIONAL, ""),
            ("tensor_content", 4, _F.TYPE_BYTES, _F.LABEL_OPTIONAL, ""),
            ("float_val", 5, _F.TYPE_FLOAT, _F.LABEL_REPEATED, ""),
            ("double_val", 6, _F.TYPE_DOUBLE, _F.LABEL_REPEATED, ""),
            ("int_val", 7, _F.TYPE_INT32, _F.LABEL_REPEATED, ""),
            ("string_val", 8, _F.TYPE_BYTES, _F.LABEL_REPEATED, ""),
            ("int64_val", 10, _F.TYPE_INT64, _F.LABEL_REPEATED, ""),
            ("bool_val", 11, _F.TYPE_BOOL, _F.LABEL_REPEATED, ""),
            ("half_val", 13, _F.TYPE_INT32, _F.LABEL_REPEATED, ""),
        ],
    ),
    (
        "HistogramProto",
        [
            ("min", 1, _F.TYPE_DOUBLE, _F.LABEL_OPTIONAL, ""),
            ("max", 2, _F.TYPE_DOUBLE, _F.LABEL_OPTIONAL, ""),
            ("num", 3, _F.TYPE_DOUBLE, _F.LABEL_OPTIONAL, ""),
            ("sum", 4, _F.TYPE_DOUBLE, _F.LABEL_OPTIONAL, ""),
            ("sum_squares", 5, _F.TYPE_DOUBLE, _F.LABEL_OPTIONAL, ""),
            ("bucket_limit", 6, _F.TYPE_DOUBLE, _F.LABEL_REPEATED, ""),
            ("bucket", 7, _F.TYPE_DOUBLE, _F.LABEL_REPEATED, ""),
        ],
    ),
    ("SummaryMetadata.PluginData", [("plugin_name", 1, _F.TYPE_STRING, _F.LABEL_OPTIONAL, ""), ("content", 2, _F.TYPE_BYTES, _F.LABEL_OPTIONAL, "")]),
    # smdebug declared plugin_data repeated (mode and mode step); TensorBoard's is singular,
    # which merges the entries on parsing, so both read what we write.
    ("SummaryMetadata", [("plugin_data", 1, _F.TYPE_MESSAGE, _F.LABEL_REPEATED, "SummaryMetadata.PluginData"), ("display_name", 2, _F.TYPE_STRING, _F.LABEL_OPTIONAL, ""), ("summary_description", 3, _F.TYPE_STRING, _F.LABEL_OPTIONAL, "")]),
    (
        "Summary.Value",
        [
            ("tag", 1, _F.TYPE_STRING, _F.LABEL_OPTIONAL, ""),
            ("simple_value", 2, _F.TYPE_FLOAT, _F.LABEL_OPTIONAL, ""),
            ("histo", 5, _F.TYPE_MESSAGE, _F.LABEL_OPTIONAL, "HistogramProto"),
            ("node_name", 7, _F.TYPE_STRING, _F.LABEL_OPTIONAL, ""),
            ("tensor", 8, _F.TYPE_MESSAGE, _F.LABEL_OPTIONAL, "TensorProto"),
            ("metadata", 9, _F.TYPE_MESSAGE, _F.LABEL_OPTIONAL, "SummaryMetadata"),
        ],
    ),
    ("Summary", [("value", 1, _F.TYPE_MESSAGE, _F.LABEL_REPEATED, "Summary.Value")]),
    (
        "Event",
        [
            ("wall_time", 1, _F.TYPE_DOUBLE, _F.LABEL_OPTIONAL, ""),
            ("step", 2, _F.TYPE_INT64, _F.LABEL_OPTIONAL, ""),
            ("file_version", 3, _F.TYPE_STRING, _F.LABEL_OPTIONAL, ""),
            ("summary", 5, _F.TYPE_MESSAGE, _F.LABEL_OPTIONAL, "Summary"),
        ],
    ),
]


_VALUE_ONEOF = ("simple_value", "histo", "tensor")


def _build_classes() -> dict[str, Any]:
    file_proto = descriptor_pb2.FileDescriptorProto(name="stepscope/tf_event.proto", package=_PACKAGE, syntax="proto3")
    by_name: dict[str, descriptor_pb2.DescriptorProto] = {}
    for full_name, fields in _MESSAGES:
        outer, _, inner = full_name.partition(".")
        if inner:
            message = by_name[outer].nested_type.add(name=inner) if outer in by_name else None
            if message is None:
                raise AssertionError(f"declare {outer} before {full_name}")
        else:
            message = by_name.get(outer) or file_proto.message_type.add(name=outer)
        by_name[full_name] = message
        for name, number, type_, label, type_name in fields:
            spec = message.field.add(name=name, number=number, type=type_, label=label)
            if type_name:
                spec.type_name = f".{_PACKAGE}.{type_name}"
            if full_name == "Summary.Value" and name in _VALUE_ONEOF:
                if not message.oneof_decl:
                    message.oneof_decl.add(name="value")
                spec.oneof_index = 0
    pool = descriptor_pool.DescriptorPool()
    pool.Add(file_proto)
    return {name: message_factory.GetMessageClass(pool.FindMessageTypeByName(f"{_PACKAGE}.{name}")) for name, _ in _MESSAGES}


# Nested types must be declared after their outer message's first mention; reorder once.
_MESSAGES.sort(key=lambda item: item[0].count("."))
_CLASSES = _build_classes()
Event = _CLASSES["Event"]
Summary = _CLASSES["Summary"]
TensorProto = _CLASSES["TensorProto"]
HistogramProto = _CLASSES["HistogramProto"]

MODE_PLUGIN = "mode"
MODE_STEP_PLUGIN = "mode_step"
FILE_VERSION = "brain.Event:2"


# --- hand encoding (wire format) ------------------------------------------------------

_SMALL_VARINTS = [bytes((i,)) for i in range(128)]


def _varint(value: int) -> bytes:
    if 0 <= value < 128:
        return _SMALL_VARINTS[value]
    value &= (1 << 64) - 1
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


@functools.lru_cache(maxsize=64)
def _key(number: int, wire_type: int) -> bytes:
    return _varint((number << 3) | wire_type)


def _len_field(number: int, body_len: int) -> bytes:
    return _key(number, 2) + _varint(body_len)


def _bytes_field(number: int, body: bytes) -> bytes:
    return _len_field(number, len(body)) + body


# The pieces below repeat across the tensors of a step and across steps: cache them, since
# for small tensors building them is most of the cost of a record.
@functools.lru_cache(maxsize=8)
def _metadata_field(mode: int, mode_step: int) -> bytes:
    def plugin(name: str, content: str) -> bytes:
        return _bytes_field(1, _bytes_field(1, name.encode()) + _bytes_field(2, content.encode()))

    return _bytes_field(9, plugin(MODE_STEP_PLUGIN, str(mode_step)) + plugin(MODE_PLUGIN, str(mode)))


@functools.lru_cache(maxsize=4096)
def _tag_field(name: str) -> bytes:
    return _bytes_field(1, name.encode())


@functools.lru_cache(maxsize=4096)
def _tensor_head(dtype: int, shape: tuple[int, ...]) -> bytes:
    """dtype and tensor_shape fields of a TensorProto (no shape field for scalars)."""
    dims = b"".join(_bytes_field(2, _key(1, 0) + _varint(d) if d else b"") for d in shape)
    return _key(1, 0) + _varint(dtype) + (_bytes_field(2, dims) if shape else b"")


def _strings_to_bytes(values: np.ndarray) -> list[bytes]:
    return [v if isinstance(v, bytes) else str(v).encode("utf-8") for v in values.reshape(-1).tolist()]


def encode_tensor_event(name: str, value: np.ndarray, step: int, mode: ModeKeys, mode_step: int, wall_time: float | None = None) -> list[bytes | memoryview]:
    """Serialize an Event holding one tensor, as a list of buffers whose concatenation is the
    protobuf encoding. The tensor's own memory is the middle buffer (no copy)."""
    value = np.asarray(value)
    dtype = dtype_code(value.dtype)
    tensor_head = _tensor_head(dtype, value.shape)
    content: memoryview | bytes = b""
    content_field = tensor_tail = b""
    if dtype == DT_STRING:
        tensor_tail = b"".join(_bytes_field(8, s) for s in _strings_to_bytes(value))
    elif value.size:
        content = memoryview(np.ascontiguousarray(value).reshape(-1).view(np.uint8).data)
        content_field = _len_field(4, content.nbytes)
    tensor_len = len(tensor_head) + len(content_field) + len(content) + len(tensor_tail)
    value_head = _tag_field(name) + _len_field(8, tensor_len) + tensor_head + content_field
    value_tail = tensor_tail + _metadata_field(int(mode), mode_step)
    value_len = len(value_head) + len(content) + len(value_tail)
    summary_len = len(_len_field(1, value_len)) + value_len
    event_head = b"".join(
        (
            _key(1, 1),
            struct.pack("<d", time.time() if wall_time is None else wall_time),
            _key(2, 0) + _varint(step) if step else b"",
            _len_field(5, summary_len),
            _len_field(1, value_len),
            value_head,
        )
    )
    return [event_head, content, value_tail] if len(content) else [event_head + value_tail]


def file_version_event(wall_time: float | None = None) -> bytes:
    return Event(wall_time=time.time() if wall_time is None else wall_time, file_version=FILE_VERSION).SerializeToString()


# --- decoding --------------------------------------------------------------------------

@dataclass
class DecodedTensor:
    name: str
    step: int
    mode: ModeKeys
    mode_step: int
    wall_time: float
    value: np.ndarray


def tensor_from_proto(tensor: Any) -> np.ndarray:
    shape = tuple([d.size for d in tensor.tensor_shape.dim])
    if tensor.dtype == DT_STRING or (tensor.dtype == 0 and tensor.string_val):
        strings = [s.decode("utf-8", errors="replace") for s in tensor.string_val]
        return np.array(strings, dtype=str).reshape(shape if shape else (len(strings),) if len(strings) != 1 else ())
    try:
        dtype = _DT_TO_NUMPY[tensor.dtype]
    except KeyError:
        raise ValueError(f"unsupported TensorProto dtype {tensor.dtype}") from None
    count = math.prod(shape)
    if tensor.tensor_content:
        content = tensor.tensor_content
        if dtype == np.int32 and len(content) == 2 * count:
            # smdebug 1.0.x labelled float16 tensors DT_INT32 (a typo in its dtype table).
            dtype = np.dtype(np.float16)
        return np.frombuffer(content, dtype=dtype).reshape(shape).copy()
    for field_name in ("float_val", "double_val", "int_val", "int64_val", "bool_val", "half_val"):
        values = getattr(tensor, field_name)
        if len(values):
            if field_name == "half_val":
                array = np.array(values, dtype=np.uint16).view(dtype)
            else:
                array = np.array(values).astype(dtype)
            if array.size == 1 and count > 1:
                array = np.full(count, array[0], dtype=dtype)
            return array.reshape(shape)
    return np.zeros(shape, dtype=dtype)


def _summary_value(event: Any) -> Any:
    if not event.HasField("summary") or not event.summary.value:
        raise ValueError("record holds no summary value")
    return event.summary.value[0]


def _value_array(value: Any) -> np.ndarray:
    if value.HasField("tensor"):
        return tensor_from_proto(value.tensor)
    if value.HasField("simple_value") or value.WhichOneof("value") is None:
        return np.array(value.simple_value, dtype=np.float32)
    raise ValueError(f"record value {value.tag!r} holds a {value.WhichOneof('value')}, not a tensor")


def decode_tensor_tag_value(payload: bytes | memoryview) -> tuple[str, np.ndarray]:
    """The name (tag) and tensor of a record: a reader checks the name against its index."""
    value = _summary_value(Event.FromString(bytes(payload)))
    return value.tag, _value_array(value)


def decode_tensor_event(payload: bytes | memoryview) -> DecodedTensor:
    event = Event.FromString(bytes(payload))
    value = _summary_value(event)
    mode, mode_step = ModeKeys.GLOBAL, event.step
    for plugin in value.metadata.plugin_data:
        if plugin.plugin_name == MODE_STEP_PLUGIN:
            mode_step = int(plugin.content)
        elif plugin.plugin_name == MODE_PLUGIN:
            mode = ModeKeys(int(plugin.content))
    return DecodedTensor(value.tag, event.step, mode, mode_step, event.wall_time, _value_array(value))
