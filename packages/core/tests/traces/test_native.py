"""The trace reader's two parsers give the same tables: the compiled one (native.py,
_kineto.c) and the pyarrow fallback (STEPSCOPE_PURE_PYTHON=1), on every trace fixture of
the tests (real public traces and generated ones), on hand-made hostile input and on
seeded random mutations of a trace. Where one path raises, the other raises the same
error (a CorruptRecord naming the file and the byte), never anything else."""

from __future__ import annotations

import gzip
import logging
import os
import random
from pathlib import Path
from typing import Any

import pytest

from stepscope.exceptions import CorruptRecord
from stepscope.traces import native
from stepscope.traces.reader import read_trace
from stepscope.traces.synth import SynthSpec, trace_bytes

TESTS = Path(__file__).resolve().parents[1]
FIXTURES = sorted([*(TESTS / "fixtures" / "traces").glob("*.json.gz"), *(TESTS / "traces" / "data").glob("*.pt.trace.json.gz")])

pytestmark = pytest.mark.skipif(native.compiled() is None and os.environ.get("STEPSCOPE_EXPECT_COMPILED") != "1", reason="the trace parser's extension is not built here")


def _outcome(source: Any, monkeypatch: pytest.MonkeyPatch, pure: bool, chunk_bytes: int = 1 << 20) -> tuple[Any, ...]:
    """("ok", table, metadata, base_ns, slow chunks, native chunks) or ("error", message)."""
    if pure:
        monkeypatch.setenv(native.PURE_PYTHON_ENV, "1")
    else:
        monkeypatch.delenv(native.PURE_PYTHON_ENV, raising=False)
    try:
        trace = read_trace(source, chunk_bytes=chunk_bytes)
    except CorruptRecord as exc:
        return ("error", str(exc))
    finally:
        monkeypatch.delenv(native.PURE_PYTHON_ENV, raising=False)
    return ("ok", trace.table, trace.metadata, trace.base_ns, trace.slow_chunks, trace.native_chunks)


def _same(source: Any, monkeypatch: pytest.MonkeyPatch, chunk_bytes: int = 1 << 20) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
    compiled = _outcome(source, monkeypatch, pure=False, chunk_bytes=chunk_bytes)
    fallback = _outcome(source, monkeypatch, pure=True, chunk_bytes=chunk_bytes)
    assert compiled[0] == fallback[0], (compiled[:2], fallback[:2])
    if compiled[0] == "error":
        assert compiled[1] == fallback[1]
    else:
        assert fallback[5] == 0  # the fallback really ran without the extension
        assert compiled[1].schema.equals(fallback[1].schema)
        assert compiled[1].equals(fallback[1]), _first_difference(compiled[1], fallback[1])
        assert compiled[2:5] == fallback[2:5]
    return compiled, fallback


def _first_difference(a: Any, b: Any) -> str:
    if a.num_rows != b.num_rows:
        return f"{a.num_rows} rows against {b.num_rows}"
    for name in a.column_names:
        left, right = a.column(name).to_pylist(), b.column(name).to_pylist()
        for row, (x, y) in enumerate(zip(left, right)):
            if x != y:
                return f"column {name}, row {row}: {x!r} against {y!r}"
    return "dictionaries differ"


def test_the_extension_is_built_where_ci_expects_it() -> None:
    module = native.compiled()
    assert module is not None, "stepscope.traces._kineto is not built (a C compiler is there in CI)"
    assert module.INT_COLUMNS == len(native.INT_COLUMNS)


@pytest.mark.parametrize("path", FIXTURES, ids=lambda p: p.name)
def test_fixture_traces_give_the_same_table(path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    compiled, _ = _same(path, monkeypatch)
    assert compiled[0] == "ok" and compiled[1].num_rows > 0
    assert compiled[5] > 0, "the compiled parser left every chunk of a real trace to pyarrow"


@pytest.mark.parametrize("path", FIXTURES[:4], ids=lambda p: p.name)
def test_small_chunks_give_the_same_table(path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Many regions per trace: the cuts and the per-region dictionaries agree too."""
    compiled, _ = _same(gzip.decompress(path.read_bytes()), monkeypatch, chunk_bytes=16 << 10)
    assert compiled[5] >= 2


def _trace(*events: str, head: str = '{"schemaVersion": 1, "traceEvents": [\n', tail: str = "\n]}") -> bytes:
    return (head + ",\n".join(events) + tail).encode()


GOOD = '{"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": 10.5, "dur": 2, "args": {"stream": 7, "correlation": 5, "device": 0}}'
RUNTIME = '{"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1, "ts": 9, "dur": 1, "args": {"correlation": 5, "External id": 3}}'
STEP = '{"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#4", "pid": 1, "tid": 1, "ts": 1, "dur": 100}'

# Each: events that reader.py must read the same way on both paths (the compiled parser
# reads some itself and leaves the others to pyarrow; the result must not show which).
HOSTILE = {
    "plain": [STEP, RUNTIME, GOOD],
    "escapes in names": [STEP, RUNTIME, GOOD.replace('"k"', '"a\\"b\\\\c\\/d\\n\\u00e9\\ud83d\\ude00\\u0000"')],
    "raw utf-8 in a name": [GOOD.replace('"k"', '"noyau é 😀"')],
    "a lone surrogate": [GOOD.replace('"k"', '"\\ud800"')],
    "a low surrogate alone": [GOOD.replace('"k"', '"\\udc00x"')],
    "invalid utf-8 in a name": [STEP, GOOD.replace('"k"', '"\xff\xfe"')],
    "a control character in a name": [GOOD.replace('"k"', '"a\tb"')],
    "a bad escape": [GOOD.replace('"k"', '"a\\qb"')],
    "an escaped phase and category": [GOOD.replace('"X"', '"\\u0058"').replace('"kernel"', '"ker\\u006eel"')],
    "string pids, Kineto's spacing": [STEP, '{"ph": "i", "s": "g", "name": "Iteration Start", "pid": "Traces", "tid": "Trace PyTorch Profiler", "ts": 1000.000}', GOOD.replace('"pid": 0', '"pid": "Spans"')],
    "string pids, compact": [GOOD.replace('"pid": 0', '"pid":"12"')],
    "string pids, odd spacing": [GOOD.replace('"pid": 0', '"pid" :  "12"')],
    "a float pid": [GOOD.replace('"pid": 0', '"pid": 1.5')],
    "a bool tid": [GOOD.replace('"tid": 7', '"tid": true')],
    "a null everything": ['{"ph": null, "cat": "kernel", "name": null, "pid": null, "tid": null, "ts": null, "dur": null, "args": null}', GOOD],
    "a complete event without a category": ['{"ph": "X", "name": "k", "ts": 1, "dur": 1}', GOOD],
    "unknown category": [GOOD.replace('"kernel"', '"mtia_op"')],
    "instants, known and unknown": ['{"ph": "i", "cat": "cpu_instant_event", "name": "[memory]", "pid": 1, "tid": 1, "ts": 3, "args": {"Bytes": 512, "Total Allocated": 1024, "Total Reserved": 2048, "Addr": 99, "Device Type": 1, "Device Id": 0}}', '{"ph": "i", "cat": "cpu_instant_event", "name": "other", "ts": 4}', '{"ph": "I", "cat": "weird", "name": "x", "ts": 5}'],
    "four decimals": [GOOD.replace("10.5", "10.1234")],
    "trailing zero decimals": [GOOD.replace("10.5", "10.123000")],
    "an exponent time": [GOOD.replace("10.5", "1.05e1")],
    "a string time": [GOOD.replace("10.5", '"10.5"')],
    "a negative duration": [GOOD.replace('"dur": 2', '"dur": -3.5')],
    "a time beyond int64 ns": [GOOD.replace("10.5", "99999999999999999")],
    "an int beyond int64": [GOOD.replace('"stream": 7', '"stream": 99999999999999999999')],
    "a float args field": [GOOD.replace('"stream": 7', '"stream": 7.0')],
    "a string args field": [GOOD.replace('"stream": 7', '"stream": "7"')],
    "args as a list": [GOOD.replace('{"stream": 7, "correlation": 5, "device": 0}', "[1, 2]")],
    "device ids past int32": [GOOD.replace('"device": 0', '"device": 4294967297, "Device Type": 300')],
    "both byte spellings": [GOOD.replace('"device": 0', '"bytes": 5, "Bytes": 6')],
    "an array of objects in args": [GOOD.replace('"device": 0', '"device": 0, "x": [{"a": 1}, {"b": 2}]')],
    "a separator inside a name": [GOOD.replace('"k"', '"lambda}, {"')],
    "nested deeply": [GOOD.replace('"device": 0', '"deep": ' + "[" * 5000 + "]" * 5000)],
    "NaN and Infinity": [GOOD.replace('"device": 0', '"device": 0, "x": NaN, "y": -Infinity')],
    "a duplicate key": [GOOD.replace('"ph": "X"', '"ph": "X", "ph": "i"')],
    "a duplicate args key": [GOOD.replace('"device": 0', '"device": 0, "device": 1')],
    "a duplicate unknown key": [GOOD.replace('"device": 0', '"device": 0, "q": 1, "q": 2')],
    "a huge name": [STEP, RUNTIME, GOOD.replace('"k"', '"' + "K" * (3 << 20) + '"')],
    "not an object": [GOOD, "5", GOOD],
    "an empty object": [GOOD, "{}", GOOD],
    "many spaces between events": [GOOD + " " * 40, GOOD],
    "a missing comma": [GOOD + " " + GOOD],
    "leading zeros": [GOOD.replace("10.5", "010.5")],
    "leading zeros in an int": [GOOD.replace('"stream": 7', '"stream": 007')],
    "a dot without decimals": [GOOD.replace("10.5", "10.")],
    "a minus alone": [GOOD.replace('"stream": 7', '"stream": -')],
    "negative zeros": [GOOD.replace("10.5", "-0.0").replace('"stream": 7', '"stream": -0')],
    "long numbers": [GOOD.replace("10.5", "123456789012345.678").replace('"stream": 7', '"stream": 12345678901234567, "Addr": 9223372036854775807, "Total Allocated": -9223372036854775808')],
    "longer numbers": [GOOD.replace("10.5", "1234567890123456.5").replace('"stream": 7', '"stream": 123456789012345678')],
    "a broken literal": [GOOD.replace('"device": 0', '"device": 0, "x": tru')],
}


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_hostile_events_give_the_same_outcome(case: str, monkeypatch: pytest.MonkeyPatch) -> None:
    data = _trace(*HOSTILE[case])
    if case == "invalid utf-8 in a name":
        data = data.replace("\xff\xfe".encode(), b"\xff\xfe")
    _same(data, monkeypatch)


def test_plain_events_are_read_by_the_compiled_parser(monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """What Kineto writes (names with escapes and UTF-8, string pids) stays on the fast path."""
    caplog.set_level(logging.DEBUG, logger="stepscope.traces")
    for case in ("plain", "escapes in names", "raw utf-8 in a name", "string pids, Kineto's spacing", "instants, known and unknown", "a null everything", "device ids past int32", "long numbers", "negative zeros"):
        caplog.clear()
        compiled, _ = _same(_trace(*HOSTILE[case]), monkeypatch)
        assert compiled[5] >= 1, case
        assert not [r for r in caplog.records if "compiled parser left" in r.getMessage()], case
    caplog.clear()
    _same(_trace(*HOSTILE["a float pid"]), monkeypatch)
    assert [r for r in caplog.records if "compiled parser left" in r.getMessage()]  # (the check above can fail)
    compiled, _ = _same(_trace(*HOSTILE["escapes in names"]), monkeypatch)
    assert "a\"b\\c/d\né😀\x00" in compiled[1].column("name").to_pylist()


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        (_trace(GOOD, GOOD)[:-30], "ends inside an event"),
        (_trace(GOOD, tail="\n}"), "expected ']'"),
        (_trace(GOOD.replace("10.5", "99999999999999999")), "beyond int64 nanoseconds"),
        (b'{"schemaVersion": 1, "other": []}', "no traceEvents array"),
    ],
)
def test_bad_traces_fail_alike_naming_the_file_and_byte(text: bytes, reason: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    path = tmp_path / "bad.pt.trace.json"
    path.write_bytes(text)
    compiled, _ = _same(path, monkeypatch)
    assert compiled[0] == "error" and reason in compiled[1] and str(path) in compiled[1]


_TOKENS = [b'"', b"\\", b"}", b"{", b",", b"[", b"]", b":", b"1.2345", b'"x"', b"null", b"true", b"-", b"\\u00e9", b"\xff", b"\t", b"}, {\"", b"e5", b" " * 40]


def test_random_mutations_give_the_same_outcome(monkeypatch: pytest.MonkeyPatch) -> None:
    """Seeded fuzzing: bytes flipped, deleted, inserted, the file cut short; read in small
    chunks so that the mutations land in every part of a region."""
    base, _ = trace_bytes(SynthSpec(steps=3, ops_per_step=12, memory=True, seed=3))
    rng = random.Random(25)
    errors = 0
    for _ in range(120):
        data = bytearray(base)
        for _ in range(rng.randint(1, 4)):
            at = rng.randrange(len(data))
            action = rng.random()
            if action < 0.35:
                data[at] = rng.randrange(256)
            elif action < 0.6:
                del data[at : at + rng.randint(1, 8)]
            elif action < 0.95:
                data[at:at] = rng.choice(_TOKENS)
            else:
                del data[at:]
        compiled, _ = _same(bytes(data), monkeypatch, chunk_bytes=rng.choice([2048, 8192, 1 << 20]))
        errors += compiled[0] == "error"
    assert errors < 120  # most mutations leave a readable trace
