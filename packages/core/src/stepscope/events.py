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

from . import records
from .modes import ModeKeys
from .proto_messages import message_classes
from .tf_dtypes import DT_STRING, dtype_code
from .tf_dtypes import DT_TO_NUMPY as _DT_TO_NUMPY

_PACKAGE = "stepscope.tf"

# The messages of TensorFlow's event.proto, summary.proto, tensor.proto and
# tensor_shape.proto that stepscope writes and reads, in their .proto field syntax.
_MESSAGES = {
    "TensorShapeProto": "repeated TensorShapeProto.Dim dim = 2; bool unknown_rank = 3",
    "TensorShapeProto.Dim": "int64 size = 1; string name = 2",
    "TensorProto": (
        "int32 dtype = 1; TensorShapeProto tensor_shape = 2; int32 version_number = 3; bytes tensor_content = 4; "
        "repeated float float_val = 5; repeated double double_val = 6; repeated int32 int_val = 7; repeated bytes string_val = 8; "
        "repeated int64 int64_val = 10; repeated bool bool_val = 11; repeated int32 half_val = 13"
    ),
    "HistogramProto": (
        "double min = 1; double max = 2; double num = 3; double sum = 4; double sum_squares = 5; "
        "repeated double bucket_limit = 6; repeated double bucket = 7"
    ),
    # smdebug declared plugin_data repeated (mode and mode step); TensorBoard's is singular,
    # which merges the entries on parsing, so both read what we write.
    "SummaryMetadata": "repeated SummaryMetadata.PluginData plugin_data = 1; string display_name = 2; string summary_description = 3",
    "SummaryMetadata.PluginData": "string plugin_name = 1; bytes content = 2",
    "Summary": "repeated Summary.Value value = 1",
    "Summary.Value": (
        "string tag = 1; float simple_value = 2; HistogramProto histo = 5; string node_name = 7; TensorProto tensor = 8; "
        "SummaryMetadata metadata = 9"
    ),
    "Event": "double wall_time = 1; int64 step = 2; string file_version = 3; Summary summary = 5",
}

_CLASSES = message_classes(_PACKAGE, _MESSAGES, oneofs={"Summary.Value": ("value", ("simple_value", "histo", "tensor"))})
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
def _plugin_data(name: str, content: str) -> bytes:
    return _bytes_field(1, _bytes_field(1, name.encode()) + _bytes_field(2, content.encode()))


@functools.lru_cache(maxsize=8)
def _mode_plugin_data(mode: int) -> bytes:
    return _plugin_data(MODE_PLUGIN, str(mode))


def _metadata_field(mode: int, mode_step: int) -> bytes:
    """The Value's metadata field: the mode step's plugin data, then the mode's. A new
    mode_step comes at every step, so the field is its digits between a head and a tail
    made once per mode and digit count (every length in it is then known)."""
    digits = b"%d" % mode_step
    try:
        head, tail = _metadata_parts[(mode, len(digits))]
    except KeyError:
        head, tail = _metadata_parts.setdefault((mode, len(digits)), _metadata_template(mode, len(digits)))
    return head + digits + tail


_metadata_parts: dict[tuple[int, int], tuple[bytes, bytes]] = {}


def _metadata_template(mode: int, digits: int) -> tuple[bytes, bytes]:
    """(head, tail) of the metadata field of `mode` around a mode step of `digits` digits."""
    marker = b"\x00" * digits  # (a placeholder of the digits' length: no digit is a NUL)
    field = _bytes_field(9, _bytes_field(1, _bytes_field(1, MODE_STEP_PLUGIN.encode()) + _bytes_field(2, marker)) + _mode_plugin_data(mode))
    at = field.index(marker)
    return field[:at], field[at + digits:]


@functools.lru_cache(maxsize=4096)
def _tag_field(name: str) -> bytes:
    return _bytes_field(1, name.encode())


@functools.lru_cache(maxsize=4096)
def _tensor_head(dtype: int, shape: tuple[int, ...]) -> bytes:
    """dtype and tensor_shape fields of a TensorProto (no shape field for scalars)."""
    dims = b"".join(_bytes_field(2, _key(1, 0) + _varint(d) if d else b"") for d in shape)
    return _key(1, 0) + _varint(dtype) + (_bytes_field(2, dims) if shape else b"")


# Numeric tensors up to this size (losses, metrics, reductions: a few bytes each) are
# encoded as one joined buffer: a copy of their bytes costs less than the views, and
# the record is then framed with one CRC call (records.frame).
SMALL_TENSOR_BYTES = 1024
_F64 = struct.Struct("<d")
_WALL_TIME_KEY = _key(1, 1)


@functools.lru_cache(maxsize=4096)
def small_value_head(name: str, dtype: np.dtype, shape: tuple[int, ...], nbytes: int) -> bytes:
    """A Summary.Value's bytes up to a small numeric tensor's content: tag, the TensorProto's
    length, its dtype and shape, the content's field key and length. The same for every
    step that saves this name with this dtype and shape."""
    tensor_head = _tensor_head(dtype_code(dtype), shape)
    content_field = _len_field(4, nbytes)
    return _tag_field(name) + _len_field(8, len(tensor_head) + len(content_field) + nbytes) + tensor_head + content_field


def _encode_small_tensor_event(name: str, value: np.ndarray, step: int, mode: int, mode_step: int, wall_time: float) -> bytes:
    """What `encode_tensor_event` writes for a small numeric tensor (0 < nbytes <=
    SMALL_TENSOR_BYTES), joined: the same fields in the same order."""
    nbytes = value.nbytes
    value_head = small_value_head(name, value.dtype, value.shape, nbytes)
    metadata = _metadata_field(mode, mode_step)
    value_len = len(value_head) + nbytes + len(metadata)
    value_field = _len_field(1, value_len)
    return b"".join((
        _WALL_TIME_KEY, _F64.pack(wall_time), _key(2, 0) + _varint(step) if step else b"",
        _len_field(5, len(value_field) + value_len), value_field, value_head, value.tobytes(), metadata,
    ))


def event_fields(step: int, mode: ModeKeys, mode_step: int, wall_time: float) -> tuple[bytes, bytes]:
    """(the Event's fields before its summary: wall time and step; the Value's metadata
    field) of a tensor record at `step`: the parts of `encode_tensor_event`'s bytes that
    every tensor of a step shares (`_encode.frame_array` puts each tensor's between them)."""
    return _WALL_TIME_KEY + _F64.pack(wall_time) + (_key(2, 0) + _varint(step) if step else b""), _metadata_field(int(mode), mode_step)


# The Event field number of a padding record's filler. No Event declares it: every protobuf
# reader (TensorBoard's, smdebug's, ours) skips it as an unknown field.
PADDING_FIELD = 1999
_PADDING_KEY = _key(PADDING_FIELD, 2)


def padding_record(size: int, prefix: bytes, *, placeholder_crc: bool = False) -> bytes | None:
    """A whole record of exactly `size` bytes, or None where no record has that size (fewer
    than about 30 bytes). It holds an Event with `prefix` (`event_fields`'s wall time and step)
    and a filler of zeros in field `PADDING_FIELD`: summary-less, so that readers going through
    the file find nothing in it. The writer puts one before a large tensor's record so that
    the tensor's bytes start at an aligned file offset and reach the file straight from the
    snapshot's memory (store/direct_io.py); readers going by the index never see it.
    `placeholder_crc`: smdebug's constant for its CRC, as the file's other records have it."""
    room = size - records.OVERHEAD - len(prefix) - len(_PADDING_KEY)
    for width in (1, 2, 3):  # (the filler's length, as a varint of `width` bytes)
        filler = room - width
        if filler >= 0 and len(_varint(filler)) == width:
            (record,) = records.frame([prefix + _PADDING_KEY + _varint(filler) + bytes(filler)], placeholder_crc=placeholder_crc)
            return record  # type: ignore[return-value]
    return None


def _strings_to_bytes(values: np.ndarray) -> list[bytes]:
    return [v if isinstance(v, bytes) else str(v).encode("utf-8") for v in values.reshape(-1).tolist()]


def encode_tensor_event(name: str, value: np.ndarray, step: int, mode: ModeKeys, mode_step: int, wall_time: float | None = None) -> list[bytes | memoryview]:
    """Serialize an Event holding one tensor, as a list of buffers whose concatenation is the
    protobuf encoding. The tensor's own memory is the middle buffer (no copy); a small
    numeric tensor's record is one joined buffer."""
    value = np.asarray(value)
    if 0 < value.nbytes <= SMALL_TENSOR_BYTES and value.dtype.kind not in "USO":
        return [_encode_small_tensor_event(name, value, step, int(mode), mode_step, time.time() if wall_time is None else wall_time)]
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
