import struct

import crc32c
import ml_dtypes
import numpy as np
import pytest

from stepscope import events, records
from stepscope.exceptions import CorruptRecord
from stepscope.modes import ModeKeys

DTYPES = [np.float16, np.float32, np.float64, ml_dtypes.bfloat16, np.int8, np.int16, np.int32, np.int64, np.uint8, np.bool_]
SHAPES = [(), (0,), (1,), (7,), (3, 4), (2, 0, 3), (2, 3, 4, 5)]


def reference_masked_crc(data: bytes) -> int:
    crc = crc32c.crc32c(data)
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def test_framing_layout_and_real_crcs():
    payload = b"hello stepscope"
    framed = records.frame_bytes(payload)
    (length,) = struct.unpack("<Q", framed[:8])
    assert length == len(payload)
    assert struct.unpack("<I", framed[8:12])[0] == reference_masked_crc(framed[:8])
    assert framed[12:-4] == payload
    assert struct.unpack("<I", framed[-4:])[0] == reference_masked_crc(payload)
    # smdebug's placeholder is the masked CRC of the ASCII text "0x12345678"
    assert reference_masked_crc(b"0x12345678") == records.SMDEBUG_PLACEHOLDER_CRC


def test_frame_of_several_buffers_equals_frame_of_joined():
    parts = [b"ab", memoryview(np.arange(10, dtype=np.int32)).cast("B"), b"z"]
    assert b"".join(bytes(p) for p in records.frame(parts)) == records.frame_bytes(b"".join(bytes(p) for p in parts))


def test_corruption_is_detected_with_offset():
    data = records.frame_bytes(b"first") + records.frame_bytes(b"second record")
    assert [bytes(p) for _, p in records.iter_records(data)] == [b"first", b"second record"]
    flipped = bytearray(data)
    flipped[len(records.frame_bytes(b"first")) + 14] ^= 0x01  # inside the second payload
    with pytest.raises(CorruptRecord, match=r"f.tfevents at byte 21: payload CRC mismatch"):
        list(records.iter_records(bytes(flipped), path="f.tfevents"))
    with pytest.raises(CorruptRecord, match="truncated record"):
        list(records.iter_records(data[:-3], path="f.tfevents"))
    header = bytearray(data)
    header[2] ^= 0xFF
    with pytest.raises(CorruptRecord, match="byte 0: length CRC mismatch"):
        records.parse_record(bytes(header), path="f.tfevents")


def test_placeholder_crc_only_where_allowed():
    payload = b"legacy payload"
    framed = bytearray(records.frame_bytes(payload))
    framed[-4:] = struct.pack("<I", records.SMDEBUG_PLACEHOLDER_CRC)
    with pytest.raises(CorruptRecord):
        records.parse_record(bytes(framed))
    assert bytes(records.parse_record(bytes(framed), allow_placeholder_crc=True)[0]) == payload


def _sample(dtype, shape, rng):
    if np.dtype(dtype) == np.bool_:
        return rng.random(shape) > 0.5
    if np.dtype(dtype).kind in "iu":
        info = np.iinfo(dtype)
        return rng.integers(info.min, info.max, size=shape, dtype=dtype, endpoint=True)
    return (rng.standard_normal(shape) * 100).astype(dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_tensor_event_round_trip(dtype, shape):
    value = _sample(dtype, shape, np.random.default_rng(1))
    payload = b"".join(bytes(p) for p in events.encode_tensor_event("layer/w:0", value, 12, ModeKeys.EVAL, 4, wall_time=1.25))
    decoded = events.decode_tensor_event(payload)
    assert (decoded.name, decoded.step, decoded.mode, decoded.mode_step, decoded.wall_time) == ("layer/w:0", 12, ModeKeys.EVAL, 4, 1.25)
    assert decoded.value.dtype == np.dtype(dtype) and decoded.value.shape == shape
    assert decoded.value.tobytes() == np.asarray(value).tobytes()


@pytest.mark.parametrize("value", [np.array(["a", "bé", ""]), np.array("single"), np.array([["x", "y"], ["z", "w"]])], ids=["1d", "scalar", "2d"])
def test_string_round_trip(value):
    payload = b"".join(bytes(p) for p in events.encode_tensor_event("s", value, 0, ModeKeys.TRAIN, 0))
    decoded = events.decode_tensor_event(payload)
    assert decoded.value.shape == value.shape and decoded.value.tolist() == value.tolist()


def _protobuf_reference(name, value, step, mode, mode_step, wall_time):
    event = events.Event(wall_time=wall_time, step=step)
    summary_value = event.summary.value.add(tag=name)
    tensor = summary_value.tensor
    tensor.dtype = events.dtype_code(value.dtype)
    for size in value.shape:
        tensor.tensor_shape.dim.add(size=size)
    if tensor.dtype == events.DT_STRING:
        tensor.string_val.extend(s.encode() for s in value.reshape(-1).tolist())
    else:
        tensor.tensor_content = np.ascontiguousarray(value).tobytes()
    summary_value.metadata.plugin_data.add(plugin_name="mode_step", content=str(mode_step).encode())
    summary_value.metadata.plugin_data.add(plugin_name="mode", content=str(int(mode)).encode())
    return event.SerializeToString()


@pytest.mark.parametrize("value", [np.arange(12, dtype=np.float32).reshape(3, 4), np.float64(2.5), np.zeros((0, 2), np.int8), np.array(["p", "q"])], ids=["2d", "scalar", "empty", "str"])
def test_hand_encoding_is_byte_identical_to_protobuf(value):
    value = np.asarray(value)
    ours = b"".join(bytes(p) for p in events.encode_tensor_event("t", value, 300, ModeKeys.TRAIN, 299, wall_time=1700000000.5))
    assert ours == _protobuf_reference("t", value, 300, ModeKeys.TRAIN, 299, 1700000000.5)


@pytest.mark.parametrize("mode", list(ModeKeys))
def test_every_mode_step_s_metadata_is_what_protobuf_writes(mode):
    """The metadata field is made of a head and a tail per mode and digit count around the
    mode step's digits: the same bytes as protobuf's, across digit counts, in every mode,
    whichever order the steps come in."""
    value = np.float32(0.5)
    for mode_step in (7, 0, 9, 10, 99, 100, 999_999, 1_000_000, 10**15, 42):
        ours = b"".join(bytes(p) for p in events.encode_tensor_event("loss", value, mode_step + 1, mode, mode_step, wall_time=1.25))
        assert ours == _protobuf_reference("loss", np.asarray(value), mode_step + 1, mode, mode_step, 1.25), mode_step


def test_large_tensor_is_not_copied():
    value = np.ones(1 << 20, dtype=np.float32)
    parts = events.encode_tensor_event("big", value, 1, ModeKeys.TRAIN, 1)
    assert any(isinstance(p, memoryview) and p.obj is not None and np.shares_memory(np.frombuffer(p, np.uint8), value) for p in parts)


def test_unsupported_dtype_is_named():
    with pytest.raises(TypeError, match="datetime64"):
        events.encode_tensor_event("t", np.array(["2020-01-01"], dtype="datetime64[D]"), 0, ModeKeys.TRAIN, 0)


def test_frame_sized_gives_the_length_of_the_whole_record():
    payload = [b"head", memoryview(np.arange(100, dtype=np.float32)).cast("B"), b"tail"]
    framed, length = records.frame_sized(payload)
    assert length == sum(memoryview(p).nbytes for p in framed) == 12 + 4 + 400 + 4 + 4
    joined = b"".join(bytes(p) for p in framed)
    body, end = records.parse_record(joined)
    assert end == length and bytes(body) == b"head" + np.arange(100, dtype=np.float32).tobytes() + b"tail"


def _general(monkeypatch, *args):
    """The general encoder's bytes (the small-tensor road turned off)."""
    with monkeypatch.context() as patch:
        patch.setattr(events, "SMALL_TENSOR_BYTES", 0)
        return b"".join(bytes(p) for p in events.encode_tensor_event(*args))


def test_small_tensors_road_writes_the_general_encoders_bytes(monkeypatch):
    """Small numeric tensors (losses, metrics) take a road of their own (one joined buffer,
    cached heads): byte for byte what the general encoder and protobuf write, for names,
    dtypes, shapes, steps and mode steps that change each varint's length."""
    rng = np.random.default_rng(7)
    names = ["loss", "CrossEntropyLoss_output_0", "é/ü \"quoted\" 100%", "n" * 130, "x" * 200 + "/grad"]
    shapes = [(), (1,), (7,), (3, 4), (0,), (31,), (128,), (129,)]
    steps = [(0, 0, ModeKeys.TRAIN), (1, 1, ModeKeys.EVAL), (127, 126, ModeKeys.PREDICT), (128, 128, ModeKeys.GLOBAL), (300_000, 12, ModeKeys.TRAIN), (2**40, 2**40 - 1, ModeKeys.TRAIN)]
    small = 0
    for name in names:
        for dtype in DTYPES:
            for shape in shapes:
                value = np.asarray(_sample(dtype, shape, rng))
                for step, mode_step, mode in steps:
                    args = (name, value, step, mode, mode_step, 1700000000.123456)
                    parts = events.encode_tensor_event(*args)
                    ours = b"".join(bytes(p) for p in parts)
                    assert ours == _general(monkeypatch, *args), (name, value.dtype, shape, step, mode_step)
                    if 0 < value.nbytes <= events.SMALL_TENSOR_BYTES:
                        small += 1
                        assert len(parts) == 1 and type(parts[0]) is bytes  # the small road was taken
                        assert ours == _protobuf_reference(name, value, step, mode, mode_step, 1700000000.123456)
                        decoded = events.decode_tensor_event(ours)
                        assert (decoded.name, decoded.step, decoded.mode, decoded.mode_step) == (name, step, mode, mode_step)
                        assert decoded.value.dtype == value.dtype and decoded.value.tobytes() == value.tobytes()
    assert small > 1000
    # A non-contiguous view is written in C order, as the general road writes it.
    view = np.arange(24, dtype=np.float32).reshape(4, 6)[:, ::2].T
    args = ("v", view, 5, ModeKeys.TRAIN, 5, 2.0)
    assert b"".join(events.encode_tensor_event(*args)) == _general(monkeypatch, *args)
    with pytest.raises(TypeError, match="datetime64"):
        events.encode_tensor_event("t", np.array(["2020-01-01"], dtype="datetime64[D]")[0:1].astype("datetime64[s]"), 0, ModeKeys.TRAIN, 0)


@pytest.mark.parametrize("placeholder", [False, True])
def test_a_small_payload_is_framed_in_one_buffer_as_several_would_be(placeholder):
    for payload in (b"", b"x", b"loss record" * 20, bytes(range(256)) * 255):
        framed = records.frame([payload], placeholder_crc=placeholder)
        general = records.frame([memoryview(payload), b""], placeholder_crc=placeholder)  # the general road
        assert b"".join(bytes(p) for p in framed) == b"".join(bytes(p) for p in general)
        assert len(framed) == 1 or len(payload) >= 64 * 1024
        body, end = records.parse_record(b"".join(bytes(p) for p in framed), path="f.tfevents", allow_placeholder_crc=placeholder)
        assert bytes(body) == payload and end == len(payload) + records.OVERHEAD


@pytest.mark.parametrize("step", [0, 7, 300_000])
def test_a_padding_record_has_exactly_the_size_asked_and_is_an_event_without_summary(step):
    """events.padding_record: every size from the smallest a record can have up to two
    blocks gives a record of that size (or None for the few sizes no varint length allows,
    never a wrong size); it is valid (CRCs), an Event with the step and wall time asked and
    no summary, its filler an unknown field (field 1999) that protobuf skips and keeps."""
    prefix = events.event_fields(step, ModeKeys.TRAIN, 3, 1.5)[0]
    missing = []
    for size in range(16, 8300):
        record = events.padding_record(size, prefix)
        if record is None:
            missing.append(size)
            continue
        assert len(record) == size
        payload, end = records.parse_record(record)
        assert end == size
        if size in (40, 160 + 1, 4096, 8299):
            event = events.Event()
            event.ParseFromString(bytes(payload))
            assert (event.step, event.wall_time, event.HasField("summary"), event.file_version) == (step, 1.5, False, "")
            assert event.SerializeToString() == bytes(payload)  # (the filler kept as an unknown field)
    smallest = records.OVERHEAD + len(prefix) + 3  # (the filler's key, its length, no byte)
    assert missing[: smallest - 16] == list(range(16, smallest))
    assert len(missing) - (smallest - 16) <= 2  # a size where the length's varint grows a byte
