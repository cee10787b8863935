"""tensor_wire reads a tensor record's Event without protobuf: for every record it takes, it
must mean what protobuf's parse means (checked against protobuf on real records, records
built by protobuf itself, smdebug's own files and thousands of damaged copies), and every
record outside its layout must be left to protobuf (None)."""

from __future__ import annotations

from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

from stepscope import events, records, tensor_wire
from stepscope.modes import ModeKeys

FIXTURE = Path(__file__).parent / "fixtures" / "smdebug_1_0_34" / "trial"
DTYPES = [np.float16, np.float32, np.float64, ml_dtypes.bfloat16, np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32, np.uint64, np.bool_, np.complex64]
SHAPES = [(), (1,), (7,), (3, 4), (2, 3, 4, 5), (200,)]


def _protobuf(payload: bytes):
    """What the protobuf path makes of `payload`: (tag, array), or the exception."""
    try:
        return events.decode_tensor_tag_value(payload)
    except Exception as exc:  # the reader turns any of these into CorruptRecord
        return exc


def _same(payload: bytes, decoder: tensor_wire.TensorDecoder | None = None, name: str = "") -> bool:
    """True when tensor_wire took `payload` (decode_tag_value, or `decoder` expecting
    `name`); fails when what it took disagrees with protobuf."""
    fast = tensor_wire.decode_tag_value(payload, 0, len(payload)) if decoder is None else decoder.decode(payload, 0, len(payload), name)
    if fast is None:
        return False
    reference = _protobuf(payload)
    assert not isinstance(reference, Exception), f"protobuf refuses what tensor_wire took: {reference}"
    assert fast[0] == reference[0]
    assert fast[1].dtype == reference[1].dtype and fast[1].shape == reference[1].shape
    assert fast[1].tobytes() == reference[1].tobytes()
    assert fast[1].flags.writeable  # as protobuf's path returns it: a copy the caller may change
    return True


def _encoded(value, name="layer/w:0", step=12, mode=ModeKeys.EVAL, mode_step=4) -> bytes:
    return b"".join(bytes(p) for p in events.encode_tensor_event(name, np.asarray(value), step, mode, mode_step, wall_time=1.25))


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_what_our_writer_writes_is_read_as_protobuf_reads_it(dtype, shape):
    rng = np.random.default_rng(3)
    value = (rng.standard_normal(shape) * 50).astype(dtype)
    assert _same(_encoded(value))
    assert _same(_encoded(value, name="é/ü", step=0, mode=ModeKeys.GLOBAL, mode_step=300_000))


def test_records_serialized_by_protobuf_itself():
    event = events.Event(wall_time=3.5, step=7)
    value = event.summary.value.add(tag="t")
    value.tensor.dtype = events.dtype_code(np.dtype(np.float32))
    value.tensor.version_number = 1
    for size in (2, 3):
        value.tensor.tensor_shape.dim.add(size=size)
    value.tensor.tensor_content = np.arange(6, dtype=np.float32).tobytes()
    value.metadata.display_name = "shown"
    value.metadata.plugin_data.add(plugin_name="mode", content=b"1")
    assert _same(event.SerializeToString())


def test_layouts_it_leaves_to_protobuf():
    float_val = events.Event(step=1)
    item = float_val.summary.value.add(tag="scalar")
    item.tensor.dtype = 1
    item.tensor.float_val.append(2.5)
    simple = events.Event(step=1)
    simple.summary.value.add(tag="s", simple_value=1.0)
    two_values = events.Event.FromString(_encoded(np.ones(2, np.float32)))
    two_values.summary.value.add(tag="second", simple_value=1.0)
    unknown_dim = events.Event.FromString(_encoded(np.ones(2, np.float32)))
    unknown_dim.summary.value[0].tensor.tensor_shape.dim[0].size = -1
    for event in (float_val, simple, two_values, unknown_dim, events.Event.FromString(events.file_version_event(1.0))):
        payload = event.SerializeToString()
        assert tensor_wire.decode_tag_value(payload, 0, len(payload)) is None
    for value in (np.array(["a", "b"]), np.zeros((0, 3), np.float32)):  # strings; no content
        payload = _encoded(value)
        assert tensor_wire.decode_tag_value(payload, 0, len(payload)) is None
    # smdebug 1.0.x labelled float16 DT_INT32: the content is then half the size int32 needs.
    mislabelled = events.Event.FromString(_encoded(np.ones(4, np.float16)))
    mislabelled.summary.value[0].tensor.dtype = events.dtype_code(np.dtype(np.int32))
    payload = mislabelled.SerializeToString()
    assert tensor_wire.decode_tag_value(payload, 0, len(payload)) is None
    assert events.decode_tensor_tag_value(payload)[1].dtype == np.float16


def _smdebug_payloads() -> list[bytes]:
    found = []
    for path in sorted(FIXTURE.glob("events/*/*.tfevents")):
        data = path.read_bytes()
        for _, payload in records.iter_records(data, allow_placeholder_crc=True):
            found.append(bytes(payload))
    return found


def test_smdebug_written_records():
    """Every tensor smdebug 1.0.34 wrote with its bytes in tensor_content (all but values
    kept as float_val, e.g. a string) is taken, named dimensions included."""
    with_content = taken = 0
    for payload in _smdebug_payloads():
        taken += _same(payload)
        value = events.Event.FromString(payload).summary.value[0]
        with_content += value.HasField("tensor") and bool(value.tensor.tensor_content)
    assert with_content > 100 and taken == with_content


def test_an_offset_inside_a_larger_buffer():
    payload = _encoded(np.arange(5, dtype=np.int64))
    framed = b"junk" + payload + b"more"
    tag, array = tensor_wire.decode_tag_value(framed, 4, 4 + len(payload))
    assert tag == "layer/w:0" and array.tolist() == [0, 1, 2, 3, 4]
    assert tensor_wire.decode_tag_value(framed, 4, 4 + len(payload) - 1) is None  # cut short


def test_damaged_records_are_read_as_protobuf_reads_them_or_left_to_it():
    """Every single-byte change, cut and insertion of real records: whatever tensor_wire
    takes, protobuf must take and read the same (else the reader would return a value
    where it used to name a corrupt record)."""
    rng = np.random.default_rng(0)
    bases = [_encoded(np.arange(6, dtype=np.float32).reshape(2, 3)), _encoded(np.float64(2.0), name="x", step=300, mode_step=299)] + _smdebug_payloads()[:3]
    tried = 0
    for base in bases:
        decoder = tensor_wire.TensorDecoder()  # knows the intact record's layout
        name = events.Event.FromString(base).summary.value[0].tag
        assert _same(base, decoder, name) and _same(base, decoder, name)
        for i in range(len(base)):
            for byte in {0x00, 0x7F, 0x80, 0xFF, base[i] ^ 0x01, base[i] ^ 0x40, int(rng.integers(256))}:
                damaged = bytearray(base)
                damaged[i] = byte
                _same(bytes(damaged))
                _same(bytes(damaged), decoder, name)
                tried += 1
            for cut in (base[:i], base[:i] + bytes([int(rng.integers(256))]) + base[i:]):
                _same(cut)
                _same(cut, decoder, name)
    assert tried > 2000


def test_the_decoder_reads_later_records_of_a_tensor_from_its_layout():
    """The steps of one tensor: wall time, step, mode step (its digits changing the
    lengths) and content differ; every record reads as protobuf reads it, and records of
    the layout it learnt skip the walk."""
    decoder = tensor_wire.TensorDecoder()
    rng = np.random.default_rng(5)
    walks = 0
    original = tensor_wire._decode

    def counting(*args):
        nonlocal walks
        walks += 1
        return original(*args)

    tensor_wire._decode = counting
    try:
        for step in [0, 1, 5, 9, 10, 99, 100, 127, 128, 300, 16_384, 2**40] * 2:
            for name, shape in (("a", (4,)), ("b/c", (2, 3))):
                value = rng.standard_normal(shape).astype(np.float32)
                payload = _encoded(value, name=name, step=step, mode=ModeKeys.TRAIN, mode_step=step)
                assert _same(payload, decoder, name)
                assert decoder.decode(payload, 0, len(payload), name)[1].tobytes() == value.tobytes()
    finally:
        tensor_wire._decode = original
    assert walks <= 2 * 8  # one per tensor and length of mode step and step, not per record
