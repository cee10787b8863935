"""The step timeline: file naming, the Chrome-trace schema, track nesting, the writer's
threads and failures, and reading ours and SageMaker's legacy files."""

from __future__ import annotations

import gc
import json
import logging
import re
import threading
import time
from collections import defaultdict

import pytest

from stepscope.exceptions import ConfigError
from stepscope.modes import ModeKeys
from stepscope.profiler import ProfilerTrial, TimelineWriter
from stepscope.profiler.timeline import STEP_TIMELINE_DIR, encode_timeline, timeline_key
from stepscope.store import LocalStore

MS = 1_000_000
T = 1_700_000_000 * 10**9


def _files(root):
    return LocalStore(root).list(f"{STEP_TIMELINE_DIR}/")


def _load(root, key):
    return json.loads((root / key).read_text())


def test_each_flush_is_a_new_file_named_by_time_node_and_rank(tmp_path):
    writer = TimelineWriter(tmp_path, node_id="algo-2", rank=3, framework="tensorflow", flush_interval_s=3600)
    writer.add("Step 0", T, T + 5 * MS, step=0, mode=ModeKeys.TRAIN)
    first = writer.flush()
    assert writer.flush() is None  # nothing buffered: no empty file
    writer.add("Step 1", T + 6 * MS, T + 9 * MS, step=1, mode=ModeKeys.TRAIN)
    writer.close()
    keys = _files(tmp_path)
    assert len(keys) == 2 and keys[0] == first
    pattern = re.compile(r"^profiler-output/framework/steps/\d{10}/(\d{16})_algo-2_rank3_pid\d+_(\d{6})\.steps\.json$")
    matches = [pattern.match(k) for k in keys]
    assert all(matches)
    assert [m.group(2) for m in matches] == ["000000", "000001"]
    assert int(matches[0].group(1)) <= int(matches[1].group(1))


def test_chrome_trace_schema(tmp_path):
    with TimelineWriter(tmp_path, node_id="algo-1", rank=1, framework="pytorch") as writer:
        writer.add("Step 7", T, T + 10 * MS, step=7, mode=ModeKeys.TRAIN, args={"batch_size": 32})
        writer.add("forward", T + 1 * MS, T + 4 * MS, step=7, mode=ModeKeys.TRAIN, phase="forward")
    (key,) = _files(tmp_path)
    trace = _load(tmp_path, key)
    assert trace["displayTimeUnit"] == "ms"
    assert trace["metadata"]["schema"] == "stepscope.step_timeline"
    assert trace["metadata"]["node_id"] == "algo-1" and trace["metadata"]["rank"] == 1
    assert trace["metadata"]["framework"] == "pytorch"
    names = {e["name"] for e in trace["traceEvents"] if e["ph"] == "M"}
    assert {"process_name", "thread_name"} <= names
    step, forward = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    assert step == {
        "name": "Step 7",
        "cat": "step",
        "ph": "X",
        "ts": T / 1000,
        "dur": 10_000.0,
        "pid": 1,
        "tid": int(ModeKeys.TRAIN),
        "args": {"batch_size": 32, "step": 7, "mode": "TRAIN", "phase": "step"},
    }
    assert forward["tid"] == step["tid"] and forward["cat"] == "forward" and forward["ts"] == (T + MS) / 1000
    assert f'"ts": {T // 1000}.000, "dur": 10000.000' in (tmp_path / key).read_text()  # exact µs text


def _properly_nested(events):
    by_track = defaultdict(list)
    for e in events:
        by_track[(e["pid"], e["tid"])].append((e["ts"], e["ts"] + e["dur"]))
    for spans in by_track.values():
        stack = []
        for start, end in sorted(spans, key=lambda s: (s[0], -s[1])):
            while stack and stack[-1] <= start:
                stack.pop()
            if stack and end > stack[-1]:
                return False
            stack.append(end)
    return True


def test_tracks_nest_and_overlaps_go_to_their_own_track():
    events = [
        ("Step 0", T, T + 10 * MS, 0, ModeKeys.TRAIN, "step", None),
        ("data", T, T + 2 * MS, 0, ModeKeys.TRAIN, "data", None),
        ("forward", T + 2 * MS, T + 5 * MS, 0, ModeKeys.TRAIN, "forward", None),
        ("backward", T + 5 * MS, T + 9 * MS, 0, ModeKeys.TRAIN, "backward", None),
        ("prefetch", T + 8 * MS, T + 12 * MS, 1, ModeKeys.TRAIN, "data", None),  # crosses the step end
        ("Step 1", T + 10 * MS, T + 20 * MS, 1, ModeKeys.TRAIN, "step", None),
        ("eval 0", T + 3 * MS, T + 4 * MS, 0, ModeKeys.EVAL, "eval_step", None),
    ]
    trace = json.loads(encode_timeline(events, node_id="n", rank=0, framework="pytorch", pid=1, writer_start_ns=T))
    slices = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    assert _properly_nested(slices)
    tid = {e["name"]: e["tid"] for e in slices}
    assert tid["Step 0"] == tid["forward"] == tid["Step 1"] == int(ModeKeys.TRAIN)
    assert tid["prefetch"] not in (tid["Step 0"], tid["eval 0"])
    assert tid["eval 0"] == int(ModeKeys.EVAL)
    lanes = {e["tid"]: e["args"]["name"] for e in trace["traceEvents"] if e["name"] == "thread_name"}
    assert lanes[tid["prefetch"]] == "TRAIN (overlapping 1)"


def test_add_is_thread_safe_and_the_timer_flushes(tmp_path):
    writer = TimelineWriter(tmp_path, node_id="n", rank=0, flush_interval_s=0.05)

    def work(thread: int) -> None:
        for i in range(500):
            writer.add("step", T + i, T + i + 1, step=thread * 1000 + i, mode=ModeKeys.TRAIN)

    threads = [threading.Thread(target=work, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    time.sleep(0.2)
    assert _files(tmp_path), "the background timer published before close"
    writer.close()
    writer.close()
    writer.add("late", T, T + 1, step=0, mode=ModeKeys.TRAIN)  # after close: dropped, no error
    timeline = ProfilerTrial(tmp_path).step_timeline()
    assert len(timeline) == 2000 and timeline["step"].nunique() == 2000


def test_a_failing_store_never_reaches_training(tmp_path, caplog):
    class Broken(LocalStore):
        def write(self, key, data):
            raise OSError("bucket gone")

    writer = TimelineWriter(Broken(tmp_path), node_id="n", flush_interval_s=3600)
    writer.add("step", T, T + MS, step=0, mode=ModeKeys.TRAIN)
    with caplog.at_level(logging.WARNING, logger="stepscope.profiler"):
        assert writer.flush() is None
        writer.add("step", T, T + MS, step=1, mode=ModeKeys.TRAIN)
        writer.close()
    assert sum("bucket gone" in r.getMessage() for r in caplog.records) == 1


@pytest.mark.parametrize(
    "kwargs, field",
    [({"rank": -1}, "rank"), ({"framework": "Py Torch"}, "framework"), ({"flush_interval_s": 0}, "flush_interval_s"), ({"node_id": "a b"}, "node_id")],
)
def test_bad_writer_config_names_the_field(tmp_path, kwargs, field):
    with pytest.raises(ConfigError, match=field):
        TimelineWriter(tmp_path, **{"node_id": "n", **kwargs})


def test_any_plugin_framework_is_accepted(tmp_path):
    with TimelineWriter(tmp_path, node_id="n", framework="jax", flush_interval_s=3600) as writer:
        writer.add("step", 1_000, 2_000, step=0, mode=ModeKeys.TRAIN)
    assert writer.config.framework == "jax"


def test_reader_round_trip(tmp_path):
    with TimelineWriter(tmp_path, node_id="algo-1", rank=0) as writer:
        writer.add("Step 0", T, T + 10 * MS, step=0, mode=ModeKeys.TRAIN)
        writer.add("forward", T + 2 * MS, T + 5 * MS, step=0, mode="train", phase="forward")
        writer.add("Eval 0", T + 20 * MS, T + 23 * MS, step=0, mode=ModeKeys.EVAL, phase="eval_step", args={"loader": "val"})
    df = ProfilerTrial(tmp_path).step_timeline()
    assert list(df["name"]) == ["Step 0", "forward", "Eval 0"]
    assert list(df["mode"]) == ["TRAIN", "TRAIN", "EVAL"]
    assert list(df["phase"]) == ["step", "forward", "eval_step"]
    assert df["start_ns"].tolist() == [T, T + 2 * MS, T + 20 * MS]
    assert df["duration_ms"].tolist() == pytest.approx([10.0, 3.0, 3.0])
    assert df["args"].iloc[2] == {"loader": "val"}
    assert set(df["node_id"]) == {"algo-1"} and set(df["rank"]) == {0} and set(df["framework"]) == {"pytorch"}


def test_nanoseconds_survive_the_round_trip(tmp_path):
    start = T + 123_456_789  # below a microsecond: a float of epoch µs would lose it
    with TimelineWriter(tmp_path, node_id="n") as writer:
        writer.add("Step 0", start, start + 1_001, step=0, mode=ModeKeys.TRAIN)
    df = ProfilerTrial(tmp_path).step_timeline()
    assert (df["start_ns"].iloc[0], df["end_ns"].iloc[0]) == (start, start + 1_001)


def test_the_training_side_imports_no_pandas():
    import subprocess
    import sys

    code = "import sys; from stepscope.profiler import SystemMonitor, TimelineWriter; print('pandas' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip() == "False"


def test_legacy_python_timeline_reads_the_same_way(tmp_path):
    folder = tmp_path / "profiler-output/framework/pevents/2023111422"
    folder.mkdir(parents=True)
    base_us = 1_700_000_000_000_000
    events = [
        {"name": "process_name", "ph": "M", "pid": 4242, "args": {"start_time_since_epoch_in_micros": base_us}},
        {"name": "Step:ModeKeys.TRAIN", "ph": "X", "ts": 1000, "dur": 500, "pid": 4242, "tid": 1, "args": {"step_num": "0"}},
        {"name": "Step:ModeKeys.EVAL", "ph": "X", "ts": base_us + 3000, "dur": 200, "pid": 4242, "tid": 1, "args": {"step_num": "1"}},
        {"name": "Forward-node", "ph": "X", "ts": 1100, "dur": 100, "pid": 4242, "tid": 1, "args": {}},
    ]
    # Unterminated, as a job killed mid-write left it.
    text = "[\n" + ",\n".join(json.dumps(e) for e in events) + ",\n"
    (folder / f"{base_us}_algo-1_pythontimeline.json").write_text(text)
    df = ProfilerTrial(tmp_path).step_timeline()
    assert list(df["mode"]) == ["TRAIN", "EVAL"]
    assert list(df["step"]) == [0, 1]
    assert df["start_ns"].tolist() == [(base_us + 1000) * 1000, (base_us + 3000) * 1000]
    assert set(df["node_id"]) == {"algo-1"} and set(df["rank"]) == {-1}


def test_a_bad_file_is_skipped_with_a_warning_naming_it(tmp_path, caplog):
    with TimelineWriter(tmp_path, node_id="n") as writer:
        writer.add("Step 0", T, T + MS, step=0, mode=ModeKeys.TRAIN)
    bad = tmp_path / timeline_key(T + 10**9, "n", 0, 1, 0)
    bad.parent.mkdir(parents=True, exist_ok=True)
    bad.write_bytes(b'{"traceEvents": [{"name": "Step 1", "ph": "X", "ts": 17')
    with caplog.at_level(logging.WARNING, logger="stepscope.profiler"):
        df = ProfilerTrial(tmp_path).step_timeline()
    assert list(df["name"]) == ["Step 0"]
    assert any(str(bad) in r.getMessage() for r in caplog.records)


def test_the_hook_s_own_spans_and_converted_values_encode_alike():
    # The hook's spans (ints, ModeKeys, strs) skip the conversion a user's values get:
    # both roads must give the same file, byte for byte, overlaps and ties included.
    typed = [
        ("Step 0", T, T + 10 * MS, 0, ModeKeys.TRAIN, "step", None),
        ("data", T, T, 0, ModeKeys.TRAIN, "data", None),
        ("forward", T, T + 5 * MS, 0, ModeKeys.TRAIN, "forward", None),
        ("prefetch", T + 8 * MS, T + 12 * MS, 1, ModeKeys.TRAIN, "data", None),
        ("backwards in time", T + 9 * MS, T + 1, 0, ModeKeys.EVAL, "eval_step", None),
        ("note", T + 2 * MS, T + 3 * MS, 0, ModeKeys.TRAIN, "annotation", {"why": "100%"}),
    ]
    loose = [(name, str(start), str(end), str(step), mode.name.lower(), phase, args) for name, start, end, step, mode, phase, args in typed]
    kwargs = dict(node_id="n", rank=0, framework="pytorch", pid=1, writer_start_ns=T)
    encoded = encode_timeline(typed, **kwargs)
    assert encoded == encode_timeline(loose, **kwargs) == encode_timeline(list(reversed(typed)), **kwargs)
    slices = [e for e in json.loads(encoded)["traceEvents"] if e["ph"] == "X"]
    assert [e["name"] for e in slices] == ["Step 0", "forward", "data", "note", "prefetch", "backwards in time"]
    assert _properly_nested(slices)


def test_the_hook_s_buffered_spans_are_left_out_of_the_garbage_collector_s_passes(tmp_path):
    # Five spans a step are held until the next flush (10 s): as tuples of strings and ints
    # they are untracked, and do not bring on the collector's full passes.
    writer = TimelineWriter(tmp_path, node_id="n", rank=0, flush_interval_s=3600)
    logged = [(s, ModeKeys.TRAIN, [("step", T + s, T + s + 5), ("forward", T + s, T + s + 2)]) for s in range(20)]
    writer.add_source(lambda: [logged.pop(0) for _ in range(len(logged))])  # drained as the hook's log is
    writer.add_spans([("step", T, T + 9)], step=99, mode=ModeKeys.EVAL)
    writer.pull()
    gc.collect()
    assert len(writer._events) == 41 and not any(gc.is_tracked(event) for event in writer._events)
    writer.close()
    timeline = ProfilerTrial(tmp_path).step_timeline()
    assert len(timeline) == 41 and set(timeline["mode"]) == {"TRAIN", "EVAL"}


def _random_events(rng, count):
    names = ["step", "forward", "backward", "data", 'quote "q"', "100% done", "ünï\tcode", "emoji 🙂", "back\\slash"]
    events = []
    for i in range(count):
        start = T + rng.randrange(0, 50 * MS) if rng.random() < 0.9 else T - rng.randrange(1, 5 * MS)
        end = start + rng.choice([0, 1, 999, 1000, 1001, rng.randrange(0, 20 * MS)])
        mode = rng.choice([ModeKeys.TRAIN, ModeKeys.EVAL, int(ModeKeys.PREDICT), 4])
        args = rng.choice([None, None, None, {}, {"why": "100%", "n": i}, {"obj": object.__name__}])
        events.append((rng.choice(names), start, end, rng.randrange(0, 10**7), mode, rng.choice(names), args))
    for start in (T, T + 5, T + 5):  # ties: equal starts, equal spans
        events.append(("tie", start, start + 10, 1, 1, "step", None))
    return events


@pytest.mark.parametrize("seed", range(6))
def test_the_compiled_encoder_writes_what_the_python_one_writes(monkeypatch, seed):
    # The events' lines come from _encode.c where it is built: the same bytes as Python's,
    # the hook's spans alone or mixed with a user's (args, ModeKeys, negative offsets).
    from stepscope.capture import step_timeline

    if step_timeline._encode is None:
        pytest.skip("stepscope.capture._encode is not built here (or STEPSCOPE_PURE_PYTHON)")
    import random

    rng = random.Random(seed)
    events = _random_events(rng, rng.choice([0, 1, 2, 50, 3000]))
    plain_only = [(n, s, e, st, int(m), p, None) for n, s, e, st, m, p, _ in events]
    kwargs = dict(node_id="n", rank=seed, framework="pytorch", pid=7, writer_start_ns=T, sequence=seed)
    for batch in (events, plain_only):
        compiled = encode_timeline(list(batch), **kwargs)
        monkeypatch.setattr(step_timeline, "_encode", None)
        python = encode_timeline(list(batch), **kwargs)
        monkeypatch.undo()
        assert compiled == python
        assert len(json.loads(compiled)["traceEvents"]) >= len(batch)
    # (and the hook's spans go to C without being made plain in Python first)
    calls = []
    timeline_events = step_timeline._encode.timeline_events
    monkeypatch.setattr(step_timeline, "_encode", type("Spy", (), {"timeline_events": staticmethod(lambda *a: calls.append(a[0]) or timeline_events(*a))}))
    encode_timeline(plain_only, **kwargs)
    assert len(calls) == 1 and calls[0] is plain_only


@pytest.mark.parametrize("compiled", [True, False])
def test_a_flush_leaves_nothing_for_the_collector_s_oldest_generation(tmp_path, monkeypatch, compiled):
    # A flush every 10 s of tens of thousands of spans: what it makes on the way must not
    # live through the young collections it sets off (a full collection of a training
    # process holds the GIL for 40-150 ms). The compiled encoder makes next to nothing.
    from stepscope.capture import step_timeline

    if compiled and step_timeline._encode is None:
        pytest.skip("stepscope.capture._encode is not built here (or STEPSCOPE_PURE_PYTHON)")
    if not compiled:
        monkeypatch.setattr(step_timeline, "_encode", None)
    writer = TimelineWriter(tmp_path, node_id="n", rank=0, flush_interval_s=3600)
    for s in range(4000):
        writer.add_spans([("step", T + s * MS, T + s * MS + 900), ("forward", T + s * MS, T + s * MS + 300)], step=s, mode=ModeKeys.TRAIN)
    promoted = []

    def watch(phase, info):
        if phase == "stop" and info["generation"] >= 1:
            promoted.append(len(gc.get_objects(generation=2)))

    gc.collect()
    before = len(gc.get_objects(generation=2))
    gc.callbacks.append(watch)
    try:
        threshold = gc.get_threshold()
        gc.set_threshold(100, 1, 1)  # (collections at every turn: whatever lives through one is seen)
        try:
            assert writer.flush() is not None
        finally:
            gc.set_threshold(*threshold)
    finally:
        gc.callbacks.remove(watch)
    writer.close()
    assert promoted or compiled, "no collection ran during the flush"
    assert max(promoted, default=before) - before < 1000  # (8,000 spans: one object each would be 8,000)


def test_a_failure_of_the_compiled_encoder_leaves_the_flush_to_python(tmp_path, monkeypatch):
    from stepscope.capture import step_timeline

    class Failing:
        @staticmethod
        def timeline_events(*args):
            raise MemoryError("no room")

    events = [("step", T + s * MS, T + s * MS + 900, s, 1, "step", None) for s in range(10)]
    kwargs = dict(node_id="n", rank=0, framework="pytorch", pid=1, writer_start_ns=T)
    monkeypatch.setattr(step_timeline, "_encode", None)
    python = encode_timeline(events, **kwargs)
    monkeypatch.setattr(step_timeline, "_encode", Failing)
    assert encode_timeline(events, **kwargs) == python
