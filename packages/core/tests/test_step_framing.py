"""The writer's framing stage apart from its threads (capture/step_framing.py)."""

import gc
import json

import numpy as np

from stepscope.capture.step_framing import StepFramer, StepTables, index_json
from stepscope.modes import ModeKeys


def test_index_json_writes_what_json_dumps_writes():
    # Every index file is made by index_json: byte for byte json.dumps's text, whatever
    # the names (escapes, non-ASCII, a '%'), modes, steps and offsets, with shapes or without.
    framer = StepFramer("worker_0", lambda *a: None)
    names = ["loss", "CrossEntropyLoss_output_0", 'a "quoted" \\ name', "100% done %d %s", "é/ü/名前", "tab\there\nnewline", "x" * 300]
    seen = 0
    for step, (mode, mode_step) in enumerate([(ModeKeys.TRAIN, 0), (ModeKeys.EVAL, 7), (ModeKeys.PREDICT, 10**12), (ModeKeys.GLOBAL, 3)]):
        for count in range(len(names) + 1):
            tensors = {name: np.float32(i) for i, name in enumerate(names[:count])}
            for shapes in ({}, {name: (2, 3) for name in names[:count]}):
                offset = 17 * step * count
                parts, index = framer.frame(step * 1000 + count, mode, mode_step, tensors, shapes, parts=[b"x" * offset] if offset else None,
                                            event_key="events/000000000005/000000000005_worker_0.tfevents" if offset else None, offset=offset)
                assert index_json(index) == json.dumps(index).encode()
                assert json.loads(index_json(index)) == index
                seen += 1
    assert seen == 4 * (len(names) + 1) * 2
    # The event file's name is filled into a template made once per mode and names: any
    # name, one template, every step's own.
    for key in ("events/000000000009/000000000009_worker_0.tfevents", 'events/x/100% "w" %s\\é.tfevents'):
        parts, index = framer.frame(9, ModeKeys.TRAIN, 9, {"loss": np.float32(1)}, {}, parts=[b"x"], event_key=key, offset=1)
        assert index_json(index) == json.dumps(index).encode() and json.loads(index_json(index))["meta"]["event_file_name"] == key


def test_what_a_block_of_steps_holds_is_left_out_of_the_garbage_collector_s_passes():
    # A step table holds up to 1,000 steps' entries: as dicts and lists they would age into
    # the collector's oldest generation and bring on its full passes over the training
    # process (with the GIL held); tuples of strings and ints are untracked.
    framer, tables = StepFramer("worker_0", lambda *a: None), StepTables("worker_0")
    for step in range(50):
        _, index = framer.frame(step, ModeKeys.TRAIN, step, {"loss": np.float32(step), "w": np.ones(3)}, {"w": (3,)} if step % 2 else {})
        tables.add(step, index)
    for _ in range(3):  # a pass untracks a tuple whose items are untracked: one level each
        gc.collect()
    assert len(tables._entries) == 50 and not any(gc.is_tracked(entry) for entry in tables._entries)
    key, body = tables.take()
    table = json.loads(body)
    assert key.endswith("000000000000_000000000049.json") and table["layouts"] == [["loss", "w"]]
    assert table["steps"][1] == {"step": 1, "mode": "TRAIN", "mode_step": 1, "starts": table["steps"][1]["starts"], "lengths": table["steps"][1]["lengths"],
                                 "shapes": {"w": [3]}, "layout": 0}
    assert [row["step"] for row in table["steps"]] == list(range(50)) and "shapes" not in table["steps"][0]


def _step_values(rng: np.random.Generator, arena) -> dict:
    """A step's values of every kind frame() meets: snapshots whose copy took their CRC
    (aligned, some large enough to be placed), plain arrays of many dtypes and shapes, and
    what the C loop leaves to Python (bfloat16, strings, a strided view, a numpy scalar, a
    0-d array, an empty array, an object array that cannot be saved)."""
    import ml_dtypes

    values = {}
    for i in range(int(rng.integers(3, 7))):
        shape = tuple(int(d) for d in rng.integers(1, 400, size=int(rng.integers(1, 3))))
        source = rng.standard_normal(shape).astype(rng.choice([np.float32, np.float64, np.float16]))
        if rng.random() < 0.3:
            source.reshape(-1)[0] = np.nan
        values[f"snap/{i}"] = arena.copy_of(source)
    big = rng.standard_normal((300, 300)).astype(np.float32)  # 360 KB: placed behind a padding record
    values["snap/big"] = arena.copy_of(big)
    unaligned = np.frombuffer(bytearray(big.nbytes + 8), np.uint8)[8:].view(np.float32).reshape(big.shape)
    unaligned[...] = big
    values["plain/unaligned_big"] = unaligned
    for dtype in (np.int8, np.uint16, np.int32, np.int64, np.uint64, np.bool_, np.complex64, np.float64):
        values[f"plain/{np.dtype(dtype).name}"] = rng.integers(0, 5, size=(int(rng.integers(1, 2000)),)).astype(dtype)
    values["python/bfloat16"] = np.ones((3, 4), ml_dtypes.bfloat16)
    values["python/strings"] = np.array(["a", "bc"])
    values["python/strided"] = np.arange(40, dtype=np.float32)[::2]
    values["python/scalar"] = np.float32(1.5)
    values["zero_d"] = np.array(2.5)
    values["empty"] = np.zeros((0, 3), np.float32)
    values["python/objects"] = np.array([object()], dtype=object)  # (dropped, saying why)
    values["unicode/ünï"] = np.arange(5, dtype=np.int16)
    order = list(values)
    rng.shuffle(order)
    return {name: values[name] for name in order}


def test_a_step_framed_by_the_c_loop_is_byte_for_byte_the_python_loop_s(monkeypatch):
    # frame_values frames the values frame_array frames, and hands every other back to the
    # Python loop: the event file's bytes, its parts (the snapshots' own memory where the
    # Python loop gives it, for the direct write), the index, the padding records, the
    # listeners' tables and the dropped values are the same either way.
    from stepscope.capture import step_framing
    from stepscope.capture.host_arena import HostArena

    if step_framing._encode is None or getattr(step_framing._encode, "frame_values", None) is None:
        import pytest

        pytest.skip("the _encode extension is not built here")
    monkeypatch.setattr(step_framing.time, "time", lambda: 1_700_000_000.25)  # (each record holds the time it was framed)
    rng = np.random.default_rng(7)
    arena = HostArena()
    padded = []  # per aligned case: the bytes of padding records in the second step's file
    for case in range(12):
        values = _step_values(rng, arena)
        shapes = {name: (2, 3) for name in list(values)[:2]}
        align = 4096 if case % 3 else 0
        placeholder = case % 4 == 3
        listeners = case % 2 == 0
        budget = 0.0 if case % 5 == 4 else float("inf")  # (a pause owed after every value, or never: time-based otherwise)
        made = {}
        for loop in ("c", "python"):
            drops: list = []
            framer = StepFramer("worker_0", lambda step, name, exc, _drops=drops: _drops.append((step, name, type(exc).__name__)), placeholder_crc=placeholder,
                                yield_every_s=budget)  # fmt: skip
            if loop == "python":
                framer.frame_values = None
            calls = []
            if loop == "c":
                real = framer.frame_values
                framer.frame_values = lambda *a, _real=real, _calls=calls: _calls.append(a[1]) or _real(*a)
            results = []
            for step in (10 * case, 10 * case + 1):  # (the second step: every name known to the index)
                calls.clear()
                before = records_head = None
                if case % 4 == 1:  # appended to a batch's event file, as write_steps does
                    records_head = [b"x" * 100]
                    before = 100
                arrays, finite = ({}, {}) if listeners else (None, None)
                parts, index = framer.frame(step, ModeKeys.TRAIN, step, values, shapes, arrays, parts=records_head, event_key="e" if records_head else None,
                                            offset=before or 0, finite=finite, align=align)  # fmt: skip
                layout_of = [(type(p).__name__, len(memoryview(p).cast("B")) if isinstance(p, memoryview) else len(p)) for p in parts]
                addresses = [np.frombuffer(p, np.uint8).ctypes.data for p in parts if isinstance(p, memoryview)]
                # (each listener's array: the step's own where it was an array, its bytes otherwise)
                told = arrays and {k: (v is getattr(values[k], "array", values[k]), v.dtype.str, v.shape, v.tobytes()) for k, v in arrays.items()}
                results.append((b"".join(bytes(p) for p in parts), layout_of, addresses, index, told, finite))
            made[loop] = (results, drops, calls)
        c_results, c_drops, c_calls = made["c"]
        py_results, py_drops, _ = made["python"]
        assert c_drops == py_drops and {name for _, name, _ in c_drops} == {"python/objects"}
        for c, py in zip(c_results, py_results):
            assert c[0] == py[0]  # the file's bytes
            assert c[1] == py[1] and c[2] == py[2]  # its parts: the same buffers, the snapshots' own memory
            assert c[3] == py[3] and c[4] == py[4] and c[5] == py[5]
        if align:
            # The placed snapshot's bytes are a part of their own, on an aligned file offset,
            # behind a padding record (bytes no index entry covers).
            data, layout_of, _, index, _, _ = c_results[1]
            entry = next(e for e in index["tensor_payload"] if e["tensorname"] == "snap/big")
            head = next(size for size in _part_sizes_before(layout_of, entry["start_idx"], len(data)))
            assert (entry["start_idx"] + head) % align == 0
            covered = sum(e["length"] for e in index["tensor_payload"])
            padded.append(len(data) - covered - (0 if case % 4 == 1 else layout_of[0][1]) - (100 if case % 4 == 1 else 0))
        # The second step went through the C loop, which handed back only what it leaves to
        # Python (called again after each of those), or stopped after each value for a pause.
        assert c_calls == _c_loop_calls(list(values), values, pause_each=budget == 0.0)
    assert padded and all(p > 0 for p in padded)


def _part_sizes_before(layout_of: list, start: int, total: int):
    """The size of the record's head part that starts at file offset `start` (the part
    before the tensor's bytes)."""
    at = 0
    for _kind, size in layout_of:
        if at == start:
            yield size
            return
        at += size
    raise AssertionError(f"no part starts at {start} (file of {total} bytes)")


def _c_loop_calls(names: list, values: dict, pause_each: bool) -> list:
    """Where frame() calls the C loop for a step whose names it knows: from the start, after
    each value it hands back (those named python/...), and, with a pause owed after every
    value, after each value whose framing held the GIL (an array's CRC of 64 KiB or more
    releases it)."""
    from stepscope.capture.step_framing import GIL_RELEASED_FROM

    calls, i = [], 0
    while i < len(names):
        calls.append(i)
        while i < len(names):
            name = names[i]
            i += 1
            if name.startswith("python/"):
                break
            if pause_each and np.asarray(getattr(values[name], "array", values[name])).nbytes < GIL_RELEASED_FROM:
                break
    return calls
