"""Reading a tensor record's Event straight from its protobuf wire bytes, on the read path:
name, dtype, shape and where the raw tensor content lies, then one numpy copy.

Opening a job and reading a tensor over 10,000 steps decodes 10,000 such records, and
protobuf's object model (an Event, a Summary, a Value, a TensorProto and a shape, each
field read through its wrapper) cost more than everything else on that path. Tensor
records have one small layout (`events.encode_tensor_event` writes it, smdebug wrote the
same), so `decode_tag_value` reads it in one straight pass, and `TensorDecoder` reads the
later records of a tensor by comparing the bytes they share with the first. Only that
layout is taken: the fields protobuf's serializers write (in field-number order, each at
most once, with their wire types), lengths inside their parent, strings valid UTF-8, one
Summary value, the content exactly `prod(shape) * itemsize` bytes. For such bytes protobuf
parses without error and means the same tensor (tests hold the two to that on real and
damaged records). Anything else (values kept as `float_val`, strings, a histogram, unknown
or repeated fields, a damaged record) gives None, and the caller decodes it with protobuf
(`events.decode_tensor_tag_value`), which says what is wrong."""

from __future__ import annotations

import re

import numpy as np

from .tf_dtypes import DT_TO_NUMPY

_DTYPES = {code: (dtype, dtype.itemsize) for code, dtype in DT_TO_NUMPY.items()}
_MAX_DIMS = 64  # more dimensions than any framework allows: not this layout


def _varint(buf: bytes, i: int, end: int) -> tuple[int, int]:
    """(value, next offset) of the varint at `i`; (-1, end + 1) when it runs past `end`
    or over 10 bytes, which every caller treats as "not this layout"."""
    value = shift = 0
    while i < end and shift < 70:
        byte = buf[i]
        i += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, i
        shift += 7
    return -1, end + 1


def _body(buf: bytes, i: int, end: int) -> tuple[int, int]:
    """(start, end) of the body of the length-delimited field whose length is at `i`;
    (-1, -1) when it does not fit inside `end`."""
    if i < end and buf[i] < 0x80:  # bodies under 128 bytes: all but large contents
        start = i + 1
        stop = start + buf[i]
    else:
        length, start = _varint(buf, i, end)
        stop = start + length
    return (start, stop) if start <= stop <= end else (-1, -1)


def _text(buf: bytes, start: int, stop: int) -> bool:
    try:
        buf[start:stop].decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def _skip_varint(buf: bytes, i: int, end: int) -> int:
    """The offset after the varint at `i` (end + 1: not one)."""
    if i < end and buf[i] < 0x80:
        return i + 1
    return _varint(buf, i, end)[1]


def _metadata_ok(buf: bytes, i: int, end: int) -> bool:
    """SummaryMetadata: plugin entries (mode and mode step: text name, bytes content), then
    the optional text display name and description."""
    while i < end and buf[i] == 0x0A:
        start, stop = _body(buf, i + 1, end)
        if stop < 0:
            return False
        j = start
        if j < stop and buf[j] == 0x0A:
            name_start, j = _body(buf, j + 1, stop)
            if j < 0 or not _text(buf, name_start, j):
                return False
        if j < stop and buf[j] == 0x12:
            j = _body(buf, j + 1, stop)[1]
        if j != stop:
            return False
        i = stop
    for key in (0x12, 0x1A):
        if i < end and buf[i] == key:
            start, i = _body(buf, i + 1, end)
            if i < 0 or not _text(buf, start, i):
                return False
    return i == end


def _shape(buf: bytes, i: int, end: int) -> tuple[int, ...] | None:
    """TensorShapeProto: dims of a known size, each maybe named (smdebug names them)."""
    dims: list[int] = []
    while i < end:
        if buf[i] != 0x12 or len(dims) == _MAX_DIMS:  # else unknown_rank, or not a shape
            return None
        start, stop = _body(buf, i + 1, end)
        if stop < 0:
            return None
        size = 0
        if start < stop and buf[start] == 0x08:
            size, start = _varint(buf, start + 1, stop)
            if size < 0 or size >= 1 << 62:  # an unknown size (-1) wraps to 2^64 - 1
                return None
        if start < stop and buf[start] == 0x12:
            name_start, start = _body(buf, start + 1, stop)
            if start < 0 or not _text(buf, name_start, start):
                return None
        if start != stop:
            return None
        dims.append(size)
        i = stop
    return tuple(dims)


def _after_step(buf: bytes, start: int, end: int) -> int:
    """Where the Event's summary field starts (after the wall time and the step), or -1."""
    i = start
    if i < end and buf[i] == 0x09:
        i += 9
    if i < end and buf[i] == 0x10:
        i = _skip_varint(buf, i + 1, end)
    return i if i < end else -1


def decode_tag_value(buf: bytes, start: int, end: int) -> tuple[str, np.ndarray] | None:
    """(tag, writable array) of the Event in `buf[start:end]`, or None when the record is
    not of the plain tensor layout (then decode it with protobuf; see the module's doc)."""
    found = _decode(buf, start, end)
    if found is None:
        return None
    tag, dtype, shape, content_start, _ = found
    return tag, np.frombuffer(buf, dtype, _count(shape), content_start).copy().reshape(shape)


def _count(shape: tuple[int, ...]) -> int:
    count = 1
    for size in shape:
        count *= size
    return count


def _decode(buf: bytes, start: int, end: int) -> tuple[str, np.dtype, tuple[int, ...], int, int] | None:
    """(tag, dtype, shape, content start, content end) for decode_tag_value."""
    # Event: wall_time (fixed64), step (varint), summary; nothing after.
    i = _after_step(buf, start, end)
    if i < 0 or buf[i] != 0x2A:
        return None
    i, summary_end = _body(buf, i + 1, end)
    # Summary: exactly one value. Value: tag, tensor, metadata.
    if summary_end != end or i >= end or buf[i] != 0x0A:
        return None
    i, value_end = _body(buf, i + 1, end)
    if value_end != summary_end:
        return None
    tag_start = tag_end = i
    if i < value_end and buf[i] == 0x0A:
        tag_start, tag_end = _body(buf, i + 1, value_end)
        i = tag_end
    if i < 0 or i >= value_end or buf[i] != 0x42:
        return None
    i, tensor_end = _body(buf, i + 1, value_end)
    if tensor_end < 0:
        return None
    if tensor_end < value_end:
        if buf[tensor_end] != 0x4A:
            return None
        metadata_start, metadata_end = _body(buf, tensor_end + 1, value_end)
        if metadata_end != value_end or not _metadata_ok(buf, metadata_start, metadata_end):
            return None
    # TensorProto: dtype, tensor_shape, version_number, tensor_content; nothing else.
    dtype_code = 0
    if i < tensor_end and buf[i] == 0x08:
        dtype_code, i = _varint(buf, i + 1, tensor_end)
    shape: tuple[int, ...] | None = ()
    if i < tensor_end and buf[i] == 0x12:
        shape_start, i = _body(buf, i + 1, tensor_end)
        if i < 0:
            return None
        shape = _shape(buf, shape_start, i)
    if i < tensor_end and buf[i] == 0x18:
        i = _skip_varint(buf, i + 1, tensor_end)
    if shape is None or i >= tensor_end or buf[i] != 0x22:
        return None
    content_start, content_end = _body(buf, i + 1, tensor_end)
    dtype = _DTYPES.get(dtype_code)
    if content_end != tensor_end or dtype is None:
        return None
    count = _count(shape)
    if count == 0 or content_end - content_start != count * dtype[1]:
        return None
    try:
        tag = buf[tag_start:tag_end].decode("utf-8")
    except UnicodeDecodeError:
        return None
    return tag, dtype[0], shape, content_start, content_end


# The metadata as smdebug and stepscope write it: the mode step's digits, then the mode's.
# Lengths are checked against the text matched (see _plain_metadata).
_PLAIN_METADATA = re.compile(rb"J(.)\n(.)\n\tmode_step\x12(.)([0-9]{1,20})\n\t\n\x04mode\x12\x01[0-9]", re.DOTALL)


def _plain_metadata(buf: bytes, start: int, end: int) -> bool:
    """Whether buf[start:end] is the Value's metadata field as writers write it: a subset
    of what _metadata_ok takes, checked by one match instead of a walk."""
    found = _PLAIN_METADATA.fullmatch(buf, start, end)
    if found is None:
        return False
    total, entry, digits_length = found.group(1, 2, 3)
    digits = found.end(4) - found.start(4)
    return digits_length[0] == digits and entry[0] == 13 + digits and total[0] == end - start - 2


class _Layout:
    """What records of one tensor share: the bytes from the summary field to the content,
    the content's place, dtype and shape, and how long the rest is (see TensorDecoder)."""

    __slots__ = ("head", "content_offset", "content_length", "dtype", "count", "shape", "tag")

    def __init__(self, head: bytes, dtype: np.dtype, shape: tuple[int, ...], tag: str):
        self.head, self.dtype, self.shape, self.tag = head, dtype, shape, tag
        self.count = _count(shape)
        self.content_offset = len(head)
        self.content_length = self.count * dtype.itemsize


class TensorDecoder:
    """decode_tag_value for a reader that reads the same tensors over many steps: the
    records of one tensor differ only in their wall time, step, content and metadata, so
    the bytes between (summary and value lengths, name, dtype, shape, content length) are
    decoded once and, for later records, compared as bytes. A record is read this way only
    when those bytes are equal to a record decode_tag_value took, its length from the
    summary on is the same (so every length inside points where it did), and its metadata
    is the plain one (mode step and mode); anything else goes through decode_tag_value."""

    MAX_LAYOUTS = 4096  # tensors x layouts kept; more and the oldest are forgotten at once

    def __init__(self) -> None:
        self._layouts: dict[tuple[str, int], _Layout] = {}

    def decode(self, buf: bytes, start: int, end: int, name: str) -> tuple[str, np.ndarray] | None:
        """(tag, array) as decode_tag_value, for a record expected to hold `name`."""
        i = _after_step(buf, start, end)
        if i < 0:
            return None
        layout = self._layouts.get((name, end - i))
        if layout is not None and buf.startswith(layout.head, i):
            content = i + layout.content_offset
            if _plain_metadata(buf, content + layout.content_length, end):
                return layout.tag, np.frombuffer(buf, layout.dtype, layout.count, content).copy().reshape(layout.shape)
        found = _decode(buf, start, end)
        if found is None:
            return None
        tag, dtype, shape, content_start, content_end = found
        array = np.frombuffer(buf, dtype, _count(shape), content_start).copy().reshape(shape)
        if _plain_metadata(buf, content_end, end):  # later records are checked as this one
            if len(self._layouts) >= self.MAX_LAYOUTS:
                self._layouts.clear()
            self._layouts[(name, end - i)] = _Layout(buf[i:content_start], dtype, shape, tag)
        return tag, array


__all__ = ["decode_tag_value", "TensorDecoder"]
