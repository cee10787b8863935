"""Index files are parsed in C (msgspec's typed decoder) when they follow the plain schema
and by the field-by-field checks otherwise: the two must agree on every input, valid or not."""

from __future__ import annotations

import copy
import json

import pytest

from stepscope import job_files
from stepscope.exceptions import CorruptRecord
from stepscope.modes import ModeKeys

WHERE = "job/index/000000000/000000000007_worker_0.json"

VALID = {
    "meta": {"mode": "TRAIN", "mode_step": 7, "event_file_name": "events/000000000007/000000000007_worker_0.tfevents"},
    "tensor_payload": [
        {"tensorname": "fc1.weight", "start_idx": 0, "length": 532},
        {"tensorname": "gradient/fc1.weight", "start_idx": 532, "length": 540},
    ],
    "shape_payload": [{"tensorname": "relu_output_0", "originalname": "relu_output_0", "shape": [64, 512]}],
}

# Values a crafted or damaged file may hold where the schema wants something else.
ODD_VALUES = [None, True, False, 0, -1, -2, 1, 7.0, 1.5, 2**40, 2**40 + 1, 2**62 + 1, 2**70, "", "12", " 3", "-1", "x", "TRAIN", "train", "4", [], [1], {}, {"a": 1}, [[[[1]]]]]


def _outcome(parse, data: bytes):
    try:
        entry = parse(data, WHERE)
    except CorruptRecord as exc:
        return ("error", exc.reason)
    return ("entry", entry.mode, entry.mode_step, entry.event_key, tuple(entry.names), tuple(entry.starts), tuple(entry.lengths), dict(entry.shapes))


def _mutations():
    """(label, bytes): every field of VALID replaced by each odd value, removed, or joined
    by an unknown field, plus whole-file oddities."""
    fields = [("meta",), ("meta", "mode"), ("meta", "mode_step"), ("meta", "event_file_name"), ("tensor_payload",), ("shape_payload",)]
    fields += [("tensor_payload", 1, key) for key in ("tensorname", "start_idx", "length")]
    fields += [("shape_payload", 0, key) for key in ("tensorname", "originalname", "shape")]
    fields += [("shape_payload", 0, "shape", 1), ("tensor_payload", 0)]
    for path in fields:
        for value in ODD_VALUES:
            body = copy.deepcopy(VALID)
            parent = body
            for part in path[:-1]:
                parent = parent[part]
            parent[path[-1]] = value
            yield f"{path}={value!r}", json.dumps(body).encode()
        body = copy.deepcopy(VALID)
        parent = body
        for part in path[:-1]:
            parent = parent[part]
        if isinstance(parent, dict):
            del parent[path[-1]]
            yield f"{path} removed", json.dumps(body).encode()
    for where in (VALID, VALID["meta"], VALID["tensor_payload"][0], VALID["shape_payload"][0]):
        body = copy.deepcopy(VALID)
        target = body if where is VALID else body["meta"] if where is VALID["meta"] else body["tensor_payload"][0] if where is VALID["tensor_payload"][0] else body["shape_payload"][0]
        target["unknown"] = {"deep": [[[]]]}
        yield f"unknown field in {sorted(where)[:2]}", json.dumps(body).encode()
    plain = json.dumps(VALID).encode()
    yield "valid", plain
    yield "compact", json.dumps(VALID, separators=(",", ":")).encode()
    yield "duplicate start_idx (the last one counts)", plain.replace(b'"start_idx": 532', b'"start_idx": 9, "start_idx": 532')
    yield "duplicate start_idx, a bad one last", plain.replace(b'"start_idx": 532', b'"start_idx": 532, "start_idx": -5')
    yield "deep nesting in an unknown field", plain[:-1] + b', "x": ' + b"[" * 5000 + b"]" * 5000 + b"}"
    yield "truncated", plain[: len(plain) // 2]
    yield "trailing text", plain + b" x"
    yield "byte order mark", b"\xef\xbb\xbf" + plain
    yield "bad UTF-8 in a name", plain.replace(b"fc1.weight", b"fc1.\xffeight", 1)
    yield "lone surrogate in a name", plain.replace(b"fc1.weight", b"fc1.\\ud800", 1)
    yield "escaped name", plain.replace(b"fc1.weight", b"fc1.\\u00e9\\ud83d\\ude00", 1)
    yield "NaN", plain.replace(b"532,", b"NaN,", 1)
    yield "meta again after the payloads", plain[:-1] + b', "meta": {"mode": "EVAL"}}'
    yield "payloads twice", plain[:-1] + b', "tensor_payload": []}'
    yield "split inside the meta", json.dumps({**VALID, "meta": {**VALID["meta"], "tensor_payload": 1}}).encode()
    yield "the split's text inside a string", plain.replace(b'"mode": "TRAIN"', b'"mode": "TRAIN, \\"tensor_payload\\": []"', 1)
    yield "a list", b"[1, 2]"
    yield "empty", b""
    yield "null payloads", json.dumps({"meta": {}, "tensor_payload": None, "shape_payload": None}).encode()
    yield "mode as a number", json.dumps({**VALID, "meta": {"mode": 2, "mode_step": None}}).encode()
    yield "absolute event file name", json.dumps({**VALID, "meta": {"mode": "EVAL", "event_file_name": "/opt/ml/out/events/000000000007/x.tfevents"}}).encode()
    yield "event file outside the job", json.dumps({**VALID, "meta": {"mode": "EVAL", "event_file_name": "../../etc/passwd"}}).encode()


@pytest.mark.parametrize(("label", "data"), list(_mutations()), ids=lambda v: v if isinstance(v, str) else None)
def test_the_fast_parse_agrees_with_the_checked_parse(label, data):
    fast, checked = _outcome(job_files.parse_index, data), _outcome(job_files._parse_index_checked, data)
    assert fast == checked, label


@pytest.mark.parametrize(("label", "data"), list(_mutations()), ids=lambda v: v if isinstance(v, str) else None)
def test_the_parser_that_keeps_payloads_agrees_with_the_checked_parse(label, data):
    """IndexParser decodes a file's payloads once and shares them with later files that
    repeat those bytes: every mutation, read by a parser that has seen the valid file's
    payloads (and by a fresh one), gives what the checked parse gives."""
    checked = _outcome(job_files._parse_index_checked, data)
    warm = job_files.IndexParser()
    warm.parse(json.dumps(VALID).encode(), WHERE)
    assert _outcome(warm.parse, data) == checked, label
    assert _outcome(job_files.IndexParser().parse, data) == checked, label
    assert _outcome(warm.parse, data) == checked, label  # with this file's own payloads kept


def test_files_that_repeat_payloads_share_them_and_keep_their_own_meta():
    parser = job_files.IndexParser()
    entries = [parser.parse(json.dumps({**VALID, "meta": {**VALID["meta"], "mode_step": step}}).encode(), WHERE) for step in range(3)]
    assert [e.mode_step for e in entries] == [0, 1, 2]
    assert entries[0].names is entries[2].names and entries[0].starts is entries[1].starts
    changed = copy.deepcopy(VALID)
    changed["tensor_payload"][1]["length"] = 541
    assert tuple(parser.parse(json.dumps(changed).encode(), WHERE).lengths) == (532, 541)


def test_a_valid_index_reads_as_written():
    entry = job_files.parse_index(json.dumps(VALID).encode(), WHERE)
    assert (entry.mode, entry.mode_step) == (ModeKeys.TRAIN, 7)
    assert entry.event_key == VALID["meta"]["event_file_name"]
    assert entry.names == ("fc1.weight", "gradient/fc1.weight")
    assert tuple(entry.starts) == (0, 532) and tuple(entry.lengths) == (532, 540)
    assert entry.shapes == {"relu_output_0": (64, 512)}


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ({"start_idx": -1}, "tensor_payload[1].start_idx must be in [0, 1099511627776], got -1"),
        ({"length": 0}, "tensor_payload[1].length must be in [1, 1099511627776], got 0"),
        ({"tensorname": ""}, "tensor_payload[1].tensorname must be a non-empty string"),
        ({"start_idx": 1.5}, "tensor_payload[1].start_idx must be an integer, got 1.5"),
    ],
)
def test_a_bad_entry_is_named_with_its_file_and_field(change, reason):
    body = copy.deepcopy(VALID)
    body["tensor_payload"][1].update(change)
    with pytest.raises(CorruptRecord) as caught:
        job_files.parse_index(json.dumps(body).encode(), WHERE)
    assert WHERE in str(caught.value) and reason in str(caught.value)


def test_digit_strings_from_old_writers_still_read():
    body = copy.deepcopy(VALID)
    body["tensor_payload"][0]["start_idx"] = "0"
    body["meta"]["mode_step"] = "7"
    entry = job_files.parse_index(json.dumps(body).encode(), WHERE)
    assert tuple(entry.starts) == (0, 532) and entry.mode_step == 7


def test_files_as_smdebug_and_stepscope_write_them_take_the_c_path(monkeypatch):
    def refuse(data, where):
        raise AssertionError("fell back to the checked parse")

    monkeypatch.setattr(job_files, "_parse_index_checked", refuse)
    for body in (VALID, {**VALID, "shape_payload": []}, {"meta": {"mode": "EVAL", "mode_step": 0, "event_file_name": ""}, "tensor_payload": []}):
        assert job_files.parse_index(json.dumps(body).encode(), WHERE).mode in (ModeKeys.TRAIN, ModeKeys.EVAL)
