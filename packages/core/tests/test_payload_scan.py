"""A large tensor's record CRC and its NaN/infinity check in one pass (`_encode.scan`,
`StepFramer._scanned`): the CRC the crc32c package gives, the verdict numpy gives, the same
records as the Python path, and the black box told the verdict instead of reading the
tensor again."""

import mmap

import crc32c
import ml_dtypes
import numpy as np
import pytest

from stepscope import create_trial, events
from stepscope import records as records_module
from stepscope.capture import step_framing
from stepscope.capture.blackbox import SavedValues
from stepscope.capture.step_framing import GIL_RELEASED_FROM, StepFramer
from stepscope.capture.writer import Writer
from stepscope.modes import ModeKeys

encode = step_framing._encode
scanning = encode is not None and encode.scan(b"", 0, 0) is not None
needs_scan = pytest.mark.skipif(not scanning, reason="no _encode.scan here (not built, STEPSCOPE_PURE_PYTHON, or a CPU without CRC-32C)")
# Sizes about the three-lane block (3 x 8 KiB) and the short one (3 x 256 bytes), and odd ones.
SIZES = [0, 1, 7, 8, 9, 767, 768, 769, 24575, 24576, 24577, 3 * 24576 + 771, 1 << 20, (1 << 20) + 3]


@needs_scan
@pytest.mark.parametrize("size", SIZES)
def test_the_crc_is_the_crc32c_package_s_from_any_start(size):
    data = np.random.default_rng(size).integers(0, 256, size, dtype=np.uint8).tobytes()
    for start in (0, 1, 0x12345678, 0xFFFFFFFF):
        assert encode.scan(data, start, 0) == (crc32c.crc32c(data, start), None)
    # Any alignment of the buffer's start (a view one byte in).
    assert encode.scan(memoryview(data)[1:], 0, 0)[0] == crc32c.crc32c(data[1:])


@needs_scan
@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
@pytest.mark.parametrize("count", [1, 3, 8, 9, 100, 6143, 6144, 6145, 40000, 300007])
def test_the_finiteness_verdict_is_numpy_s_wherever_the_bad_value_sits(dtype, count):
    rng = np.random.default_rng(count)
    array = (rng.standard_normal(count) * 100).astype(dtype)
    assert encode.scan(array, None, array.itemsize) == (None, True)
    assert encode.scan(array, 7, array.itemsize) == (crc32c.crc32c(array, 7), True)
    extremes = np.array([np.finfo(dtype).max, -np.finfo(dtype).max, np.finfo(dtype).tiny / 2, 0.0, -0.0], dtype)
    assert encode.scan(np.resize(extremes, count), 0, array.itemsize)[1] is True  # large, subnormal, signed zeros: finite
    for bad in (np.nan, np.inf, -np.inf):
        for at in sorted({0, min(1, count - 1), count // 3, count // 2, count - 1}):
            spoiled = array.copy()
            spoiled[at] = bad
            assert not np.isfinite(spoiled).all()
            assert encode.scan(spoiled, None, array.itemsize) == (None, False), (bad, at)
            assert encode.scan(spoiled, 0, array.itemsize) == (crc32c.crc32c(spoiled), False), (bad, at)


@needs_scan
def test_bad_arguments_are_refused_by_name():
    with pytest.raises(ValueError, match="itemsize must be 0, 2, 4 or 8"):
        encode.scan(b"12345678", 0, 3)
    with pytest.raises(ValueError, match="not a whole number of 4-byte floats"):
        encode.scan(b"123456", 0, 4)
    with pytest.raises(ValueError, match="32 bits"):
        encode.scan(b"1234", 1 << 32, 0)
    with pytest.raises(TypeError):
        encode.scan("text", 0, 0)


def _framed(monkeypatch, compiled, tensors, placeholder_crc=False):
    monkeypatch.setattr(step_framing, "_encode", encode if compiled else None)
    framer = StepFramer("worker_0", lambda step, name, exc: pytest.fail(f"{name} dropped: {exc!r}"), placeholder_crc=placeholder_crc)
    finite: dict[str, bool] = {}
    parts, index = framer.frame(3, ModeKeys.TRAIN, 3, tensors, {}, {}, finite=finite)
    return b"".join(bytes(p) for p in parts), index, finite


@needs_scan
@pytest.mark.parametrize("placeholder_crc", [False, True])
def test_a_step_s_records_are_the_python_path_s_byte_for_byte(monkeypatch, placeholder_crc):
    monkeypatch.setattr(step_framing.time, "time", lambda: 1_765_000_000.5)
    rng = np.random.default_rng(1)
    big = GIL_RELEASED_FROM // 4 + 5
    tensors = {
        "weights/w32": rng.standard_normal(big).astype(np.float32).reshape(-1, 1),
        "gradients/g64": rng.standard_normal(big).astype(np.float64),
        "gradients/g16": np.full(big * 2, np.inf, np.float16),
        "weights/ints": np.arange(big, dtype=np.int32),  # (CRC only: not a float)
        "weights/small": np.float32([1.0, np.nan]),  # (under GIL_RELEASED_FROM: the Python path's)
        "loss": np.float32(0.5),
    }
    tensors["weights/w32"][100] = np.nan
    scanned, index, finite = _framed(monkeypatch, True, tensors, placeholder_crc)
    plain, plain_index, plain_finite = _framed(monkeypatch, False, tensors, placeholder_crc)
    assert scanned == plain and index == plain_index
    assert plain_finite == {}
    assert finite == {"weights/w32": False, "gradients/g64": True, "gradients/g16": False}


def _job_with_a_nan(tmp_path, monkeypatch, compiled, **box):
    monkeypatch.setattr(step_framing, "_encode", encode if compiled else None)
    saved, heard, reads = SavedValues(**box), [], []
    gradient = np.random.default_rng(2).standard_normal(300_000).astype(np.float32)  # 1.2 MB
    bad = gradient.copy()
    bad[[5, 77_777]] = [np.nan, -np.inf]

    isfinite = np.isfinite

    def watched(value, *args, **kwargs):  # the black box's verdict on its own passes (max, min)
        reads.append(value)
        return isfinite(value, *args, **kwargs)

    monkeypatch.setattr(np, "isfinite", watched)
    with Writer(str(tmp_path / ("c" if compiled else "py"))) as writer:
        writer.step_listeners += [saved, lambda step, mode, mode_step, arrays: heard.append(step)]
        for step, values in enumerate((gradient, gradient * 2, bad, gradient)):
            assert writer.write_step(step, ModeKeys.TRAIN, step, {"gradients/w": values, "loss": np.float32(step)})
    monkeypatch.setattr(np, "isfinite", isfinite)
    return saved, heard, reads


@needs_scan
def test_the_black_box_takes_the_writer_s_verdict_and_reports_the_same_first_non_finite_step(tmp_path, monkeypatch):
    saved, heard, reads = _job_with_a_nan(tmp_path, monkeypatch, compiled=True)
    python_saved, python_heard, python_reads = _job_with_a_nan(tmp_path, monkeypatch, compiled=False)
    assert saved.non_finite == python_saved.non_finite == {
        "step": 2, "mode": "TRAIN", "mode_step": 2, "tensors": {"gradients/w": {"nan": 1, "inf": 1, "size": 300_000}},
    }  # fmt: skip
    assert heard == python_heard == [0, 1, 2, 3]  # a listener without checked_step hears every step as before
    assert reads == [] and len(python_reads) == 5  # (the Python path reads it until the first NaN: max, then min where max is finite)
    # What was written is the same either way.
    for folder in ("c", "py"):
        trial = create_trial(str(tmp_path / folder))
        assert np.isnan(trial.tensor("gradients/w").value(2)[5])
        assert trial.tensor("gradients/w").value(3).tobytes() == np.random.default_rng(2).standard_normal(300_000).astype(np.float32).tobytes()


@needs_scan
def test_a_tensor_over_the_checked_size_is_judged_where_the_writer_checked_it(tmp_path, monkeypatch):
    # max_checked (elements) leaves larger raw tensors to the losses they feed, unless the
    # writer's pass has answered already: then it costs nothing to report.
    saved, _, _ = _job_with_a_nan(tmp_path, monkeypatch, compiled=True, max_checked=1000)
    python_saved, _, _ = _job_with_a_nan(tmp_path, monkeypatch, compiled=False, max_checked=1000)
    assert saved.non_finite is not None and saved.non_finite["step"] == 2
    assert python_saved.non_finite is None


@needs_scan
def test_small_float_tensors_are_judged_by_the_writer_as_numpy_judges_them(tmp_path):
    """Biases and other small float tensors (more than 8 bytes) get their verdict from the
    writer's framing pass too: the black box reads none of them (its max and min were most
    of its time per save), reports what numpy's counts say, and still reads one-element
    values (a loss) itself."""
    rng = np.random.default_rng(5)
    values = {f"{kind}_{n}": rng.standard_normal(n).astype(kind) for kind in ("float16", "float32", "float64") for n in (2, 3, 5, 64, 1000)}
    values["loss"] = np.float32(0.5)
    bad = dict(values)
    for name in ("float16_5", "float32_3", "float64_2", "float32_1000"):
        kind, n = name.split("_")
        array = rng.standard_normal(int(n)).astype(kind)
        array[1] = np.nan if n != "3" else -np.inf
        bad[name] = array
    judged: list[set[str]] = []
    saved = SavedValues()
    real = saved.checked_step

    def checked_step(step, mode, mode_step, arrays, finite):
        judged.append(set(finite))
        return real(step, mode, mode_step, arrays, finite)

    saved.checked_step = checked_step
    with Writer(str(tmp_path)) as writer:
        writer.step_listeners.append(saved)
        assert writer.write_step(0, ModeKeys.TRAIN, 0, values)
        assert writer.write_step(1, ModeKeys.TRAIN, 1, bad)
    over_8_bytes = {name for name, value in values.items() if np.asarray(value).nbytes > 8}
    assert judged == [over_8_bytes, over_8_bytes]
    assert "float32_3" in over_8_bytes and "float32_2" not in over_8_bytes  # (the black box reads 8 bytes or less)
    expected = {name: {"nan": int(np.isnan(v).sum()), "inf": int(np.isinf(v).sum()), "size": v.size}
                for name, v in bad.items() if not np.isfinite(v).all()}  # fmt: skip
    assert len(expected) == 4
    assert saved.non_finite == {"step": 1, "mode": "TRAIN", "mode_step": 1, "tensors": expected}


# ---- a whole record in C (`_encode.frame_array`) ------------------------------------------

framing_arrays = scanning and hasattr(encode, "frame_array")
needs_frame_array = pytest.mark.skipif(not framing_arrays, reason="no _encode.frame_array here")


def _every_kind_of_value():
    rng = np.random.default_rng(4)
    values = {
        "weights/f32": rng.standard_normal((512, 256)).astype(np.float32),
        "weights/f64": rng.standard_normal((40, 30)),
        "weights/f16": rng.standard_normal((300, 300)).astype(np.float16),
        "bfloat16": rng.standard_normal(10).astype(ml_dtypes.bfloat16),  # (no buffer: the Python path's)
        "int64": np.arange(1000, dtype=np.int64), "longlong": np.arange(300, dtype=np.longlong),
        "uint64": np.arange(5, dtype=np.uint64), "ulonglong": np.arange(300, dtype=np.ulonglong), "int8": np.arange(100, dtype=np.int8),
        "bool": np.array([True, False] * 700), "complex64": (rng.standard_normal(2000) + 1j).astype(np.complex64),
        "complex128": np.ones((3, 3), complex), "0-d": np.array(1.5, np.float32), "empty": np.zeros((0, 5), np.float32),
        "a zero dimension": np.zeros((3, 0, 2)), "strings": np.array(["a", "bc"]),
        "strided": rng.standard_normal((100, 100)).astype(np.float32)[:, ::2],  # (not contiguous: the Python path's)
        "nan": np.array([1.0, np.nan] * 40_000, np.float32), "inf": np.full(9000, np.inf), "ünï/cödé": np.ones(2000, np.float32),
        "a float": 3.25, "a numpy scalar": np.float32(2.5),
    }  # fmt: skip
    return values


@needs_frame_array
@pytest.mark.parametrize("placeholder_crc", [False, True])
@pytest.mark.parametrize(("step", "mode", "mode_step"), [(0, ModeKeys.TRAIN, 0), (7, ModeKeys.EVAL, 3), (123_456_789_012, ModeKeys.GLOBAL, 99_999)])
def test_a_record_framed_in_one_call_is_the_python_path_s_for_every_dtype_and_shape(monkeypatch, placeholder_crc, step, mode, mode_step):
    monkeypatch.setattr(step_framing.time, "time", lambda: 1_765_000_000.25)
    values = _every_kind_of_value()
    shapes = {name: np.shape(value) for name, value in values.items()}
    made = {}
    for compiled in (True, False):
        framer = StepFramer("worker_0", lambda step, name, exc: pytest.fail(f"{name} dropped: {exc!r}"), placeholder_crc=placeholder_crc)
        if not compiled:
            framer.frame_array = None  # (the CRC pass stays in C: the path before frame_array)
        arrays: dict[str, np.ndarray] = {}
        finite: dict[str, bool] = {}
        parts, index = framer.frame(step, mode, mode_step, values, shapes, arrays, finite=finite)
        made[compiled] = (b"".join(bytes(p) for p in parts), index, sorted(arrays), finite)
    assert made[True][:3] == made[False][:3]
    # Every float array framed as three buffers is judged in the CRC's pass (the Python path
    # judges those from GIL_RELEASED_FROM bytes), as numpy judges it.
    judged, python_judged = made[True][3], made[False][3]
    assert python_judged.items() <= judged.items()
    assert judged == {name: bool(np.isfinite(value).all()) for name, value in values.items()
                      if isinstance(value, np.ndarray) and value.dtype.kind == "f" and value.dtype.itemsize in (2, 4, 8)
                      and value.flags.c_contiguous and value.nbytes > events.SMALL_TENSOR_BYTES}  # fmt: skip
    assert set(judged) == {"weights/f32", "weights/f64", "weights/f16", "nan", "inf", "ünï/cödé"}
    # Read back as a job's file would be: every value as it was saved.
    data = made[True][0]
    _version, offset = records_module.parse_record(data, 0, allow_placeholder_crc=placeholder_crc)
    decoded = {}
    while offset < len(data):
        payload, offset = records_module.parse_record(data, offset, allow_placeholder_crc=placeholder_crc)
        record = events.decode_tensor_event(bytes(payload))
        decoded[record.name] = record
    assert list(decoded) == list(values)
    for name, value in values.items():
        assert decoded[name].step == step and decoded[name].mode == mode and decoded[name].mode_step == mode_step
        expected = np.asarray(value)
        assert decoded[name].value.shape == expected.shape and decoded[name].value.tobytes() == np.ascontiguousarray(expected).tobytes(), name


@needs_frame_array
def test_frame_array_frames_plain_arrays_without_copying_them_and_leaves_the_rest_to_python():
    prefix, metadata = events.event_fields(5, ModeKeys.TRAIN, 5, 1.0)
    formats = step_framing._FORMATS
    big = np.arange(10_000, dtype=np.float32).reshape(100, 100)
    parts, length, finite = encode.frame_array("w", big, prefix, metadata, formats, False, 0)
    assert len(parts) == 3 and memoryview(parts[1]).obj is big  # the array's own memory, no copy
    assert length == sum(memoryview(p).nbytes for p in parts) and finite is True
    small_parts, _, small_finite = encode.frame_array("w", np.float32([1, np.nan]), prefix, metadata, formats, False, 1 << 20)
    assert len(small_parts) == 1 and type(small_parts[0]) is bytes and small_finite is None  # (under finite_from: not judged)
    for other in (big[:, ::2], np.arange(4, dtype=">f4"), np.array(["a"]), np.zeros(3, ml_dtypes.bfloat16)):
        assert encode.frame_array("w", other, prefix, metadata, formats, False, 0) is None
    with pytest.raises(UnicodeEncodeError):
        encode.frame_array("w\udc80", big, prefix, metadata, formats, False, 0)  # (as `name.encode()` refuses it)
    with pytest.raises(TypeError):
        encode.frame_array(b"w", big, prefix, metadata, formats, False, 0)


# ---- a snapshot's CRC taken in its copy (`_encode.copy_scan`, `HostArena.copy_of`) ----------

copying = framing_arrays and hasattr(encode, "copy_scan")
needs_copy_scan = pytest.mark.skipif(not copying, reason="no _encode.copy_scan here")


def _register_from_zero(data) -> int:
    # The crc32c package continues from a CRC value: its register is that value inverted, so
    # continuing from 0xFFFFFFFF runs the register from 0; its result is the register inverted.
    return ~crc32c.crc32c(data, 0xFFFFFFFF) & 0xFFFFFFFF


@needs_copy_scan
@pytest.mark.parametrize("size", SIZES)
def test_copy_scan_copies_every_byte_and_gives_the_register_the_crc32c_package_gives(size):
    source = np.random.default_rng(size).integers(0, 256, size, dtype=np.uint8)
    copy = np.full(size, 0xAB, np.uint8)
    assert encode.copy_scan(copy, source, 0) == (_register_from_zero(source), None)
    assert np.array_equal(copy, source)
    # Any alignment of either buffer (a view one byte in).
    odd = np.zeros(size + 1, np.uint8)
    assert encode.copy_scan(odd[1:], source, 0)[0] == _register_from_zero(source) and np.array_equal(odd[1:], source)


@needs_copy_scan
@pytest.mark.parametrize("source_offset", [0, 16, 48, 64, 240, 256, 4032, 4080])
def test_copy_scan_is_exact_where_the_view_sits_just_after_the_source_in_its_page(source_offset):
    """A page-aligned view (as the arena gives) over a source at each page offset around the
    one where streamed stores would alias the next loads (copy_scan takes plain stores
    there: bench/bench_copy_offsets.py measures the speed): every byte, the register and the
    verdict as elsewhere."""
    size = 3 * 8192 * 4 + 1000  # (three lanes and a rest)
    source_memory, target_memory = mmap.mmap(-1, size + 8192), mmap.mmap(-1, size + 8192)
    source = np.frombuffer(source_memory, dtype=np.float32, count=size // 4, offset=source_offset)
    source[:] = np.random.default_rng(source_offset).standard_normal(source.size, dtype=np.float32)
    source[-7] = np.inf
    target = np.frombuffer(target_memory, dtype=np.float32, count=size // 4)
    assert encode.copy_scan(target, source, 4) == (_register_from_zero(source), False)
    assert target.tobytes() == source.tobytes()


@needs_copy_scan
@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
@pytest.mark.parametrize("count", [1, 9, 6143, 6144, 6145, 40000, 300007])
def test_copy_scan_s_finiteness_verdict_is_numpy_s_wherever_the_bad_value_sits(dtype, count):
    array = (np.random.default_rng(count).standard_normal(count) * 100).astype(dtype)
    for bad in (None, np.nan, np.inf, -np.inf):
        for at in sorted({0, count // 3, count - 1}) if bad is not None else [0]:
            source = array.copy()
            if bad is not None:
                source[at] = bad
            copy = np.empty_like(source)
            register, finite = encode.copy_scan(copy, source, source.itemsize)
            assert finite is bool(np.isfinite(source).all()), (bad, at)
            assert register == _register_from_zero(source) and copy.tobytes() == source.tobytes()


@needs_copy_scan
def test_copy_scan_refuses_bad_arguments_by_name():
    with pytest.raises(ValueError, match="cannot be copied into"):
        encode.copy_scan(np.empty(3, np.uint8), np.zeros(4, np.uint8), 0)
    with pytest.raises(ValueError, match="itemsize must be 0, 2, 4 or 8"):
        encode.copy_scan(np.empty(8, np.uint8), np.zeros(8, np.uint8), 3)
    with pytest.raises(ValueError, match="not a whole number of 4-byte floats"):
        encode.copy_scan(np.empty(6, np.uint8), np.zeros(6, np.uint8), 4)
    with pytest.raises(TypeError):
        encode.copy_scan(b"12345678", np.zeros(8, np.uint8), 0)  # (read-only: nothing to copy into)
    prefix, metadata = events.event_fields(5, ModeKeys.TRAIN, 5, 1.0)
    with pytest.raises(TypeError, match="copy_scan's"):
        encode.frame_array("w", np.zeros(4, np.float32), prefix, metadata, step_framing._FORMATS, False, 0, [1, True])
    with pytest.raises(ValueError, match="32 bits"):
        encode.frame_array("w", np.zeros(4, np.float32), prefix, metadata, step_framing._FORMATS, False, 0, (1 << 32, True))


@needs_copy_scan
@pytest.mark.parametrize("placeholder_crc", [False, True])
def test_a_snapshot_scanned_in_its_copy_is_framed_unread_into_the_python_path_s_record(monkeypatch, placeholder_crc):
    from stepscope.capture.host_arena import HostArena, Scanned

    monkeypatch.setattr(step_framing.time, "time", lambda: 1_765_000_000.25)
    values = _every_kind_of_value()
    arena = HostArena(arena_from=1)
    snapshots = {name: arena.copy_of(value) if isinstance(value, np.ndarray) and value.size else value for name, value in values.items()}
    scanned = {name for name, value in snapshots.items() if type(value) is Scanned}
    # Every contiguous array with a buffer is scanned (a strided one is copied by numpy).
    assert "weights/f32" in scanned and "int64" in scanned and "strided" not in scanned
    assert all(np.array_equal(np.asarray(snapshots[name]), values[name], equal_nan=values[name].dtype.kind == "f") for name in scanned)
    shapes = {name: np.shape(value) for name, value in values.items()}
    made = {}
    for label, tensors, compiled in (("scanned", snapshots, True), ("read", values, True), ("python", values, False)):
        framer = StepFramer("worker_0", lambda step, name, exc: pytest.fail(f"{name} dropped: {exc!r}"), placeholder_crc=placeholder_crc)
        if not compiled:
            framer.frame_array = None
        arrays: dict[str, np.ndarray] = {}
        finite: dict[str, bool] = {}
        parts, index = framer.frame(9, ModeKeys.TRAIN, 9, tensors, shapes, arrays, finite=finite)
        made[label] = (b"".join(bytes(p) for p in parts), index, finite)
        assert all(type(array) is np.ndarray for array in arrays.values())  # (listeners see arrays)
    assert made["scanned"][:2] == made["read"][:2] == made["python"][:2]
    # (the strided array's copy is contiguous: framed in C, and judged, where the original is not)
    assert {k: v for k, v in made["scanned"][2].items() if k != "strided"} == made["read"][2]
    # The framer took the copy's register, not the bytes: a wrong register makes a record
    # whose CRC the reader refuses (where a real CRC is written).
    name = "weights/f32"
    wrong = Scanned(snapshots[name].array, (snapshots[name].scan[0] ^ 1, snapshots[name].scan[1]))
    framer = StepFramer("worker_0", lambda step, n, exc: pytest.fail(f"{n} dropped: {exc!r}"), placeholder_crc=placeholder_crc)
    parts, _ = framer.frame(9, ModeKeys.TRAIN, 9, {name: wrong}, {})
    data = b"".join(bytes(p) for p in parts)
    _version, offset = records_module.parse_record(data, 0, allow_placeholder_crc=placeholder_crc)
    if placeholder_crc:
        records_module.parse_record(data, offset, allow_placeholder_crc=True)
    else:
        with pytest.raises(records_module.CorruptRecord):
            records_module.parse_record(data, offset)


def test_copy_of_takes_numpy_s_copy_where_it_cannot_scan(monkeypatch):
    from stepscope.capture import host_arena

    arena = host_arena.HostArena(arena_from=1024)
    big = np.arange(100_000, dtype=np.float32)
    strided = big.reshape(1000, 100)[:, ::2]
    copy = arena.copy_of(strided)
    assert type(copy) is np.ndarray and np.array_equal(copy, strided)
    small = arena.copy_of(big[:10])
    assert type(small) is np.ndarray and np.array_equal(small, big[:10])
    monkeypatch.setattr(host_arena, "_copy_scan", None)  # (not built, or STEPSCOPE_PURE_PYTHON)
    plain = arena.copy_of(big)
    assert type(plain) is np.ndarray and np.array_equal(plain, big) and not plain.flags.owndata
    monkeypatch.undo()
    # A snapshot only reductions read is copied without a scan; numpy sees a Scanned's array.
    unscanned = arena.copy_of(big, scan=False)
    assert type(unscanned) is np.ndarray and np.array_equal(unscanned, big)
    scanned = arena.copy_of(big)
    if copying:
        assert np.asarray(scanned) is scanned.array and np.asarray(scanned, dtype=np.float64).dtype == np.float64
        assert np.array(scanned, copy=True) is not scanned.array and np.array_equal(np.array(scanned, copy=True), big)
