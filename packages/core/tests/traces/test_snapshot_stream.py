"""The streamed snapshot reader (stepscope.traces.snapshot_stream) against the in-memory one
(AllocatorSnapshot) and the generator's ground truth, on small generated snapshots in every
pickle protocol torch may write, gzip or not; memory: the shared objects it keeps do not
grow with the history; hostile and broken pickles refused by name; the large-snapshot
writer of the bench gives what pickle itself reads."""

from __future__ import annotations

import gzip
import io
import os
import pickle

import pandas as pd
import pytest

from stepscope.exceptions import CorruptRecord
from stepscope.testing.snapshots import LargeSnapshotSpec, SnapshotSpec, make_snapshot, write_large_snapshot
from stepscope.traces.snapshot import BEFORE_TRACE, AllocatorSnapshot
from stepscope.traces.snapshot_stream import summarize


def _write(tmp_path, raw, protocol=4, compress=True, name="snap.pickle"):
    data = pickle.dumps(raw, protocol=protocol)
    path = tmp_path / (name + (".gz" if compress else ""))
    path.write_bytes(gzip.compress(data) if compress else data)
    return path


def _same(a: pd.DataFrame, b: pd.DataFrame) -> None:
    a, b = a.reset_index(drop=True).copy(), b.reset_index(drop=True).copy()
    if "action" in a:
        a["action"], b["action"] = a["action"].astype(str), b["action"].astype(str)
    pd.testing.assert_frame_equal(a, b, check_dtype=False)


@pytest.mark.parametrize("protocol", [2, 4, 5])
@pytest.mark.parametrize("spec", [
    SnapshotSpec(devices=2, steps=5, allocations_per_step=12, oom=True, seed=3),
    SnapshotSpec(devices=1, steps=40, allocations_per_step=9, keep_per_step=3, seed=7),
], ids=["two-devices-oom", "leak"])  # fmt: skip
def test_the_streamed_summary_equals_the_in_memory_one_and_the_truth(tmp_path, protocol, spec):
    raw, truth = make_snapshot(spec)
    path = _write(tmp_path, raw, protocol, compress=protocol != 2)
    whole, streamed = AllocatorSnapshot.load(path), summarize(path)
    _same(whole.summary(), streamed.summary)
    assert streamed.summary["reserved"].tolist() == [truth.reserved[d] for d in range(spec.devices)]
    assert streamed.summary["largest_free_block"].tolist() == [truth.largest_free_block[d] for d in range(spec.devices)]
    for device in range(spec.devices):
        _same(whole.by_frame(device), streamed.by_frame(device))
        assert dict(zip(streamed.by_frame(device, k=None)["frame"], streamed.by_frame(device, k=None)["bytes"])) == truth.live_by_frame[device]
        (at_whole, frames_whole), (at, frames) = whole.peak(device), streamed.peak(device)
        assert at == at_whole and at["allocated"] == truth.peak[device] and at["index"] == truth.peak_index[device]
        _same(frames_whole, frames)
        peak_frames = dict(zip(frames["frame"], frames["bytes"]))
        assert {k: v for k, v in peak_frames.items() if k != BEFORE_TRACE} == truth.peak_by_frame[device]
        _same(whole.around(device), streamed.around(device))
        line = streamed.timeline(device)
        assert line["allocated"].max() == truth.peak[device] and len(line) <= 4000
    _same(whole.by_frame(None, frame="top"), streamed.by_frame(None, frame="top"))


def test_the_bounded_timeline_keeps_the_peak(tmp_path):
    raw, truth = make_snapshot(SnapshotSpec(steps=60, allocations_per_step=20, keep_per_step=2, seed=2))
    streamed = summarize(_write(tmp_path, raw), max_points=16)
    line = streamed.timeline(0)
    assert 8 <= len(line) <= 16 and line["allocated"].max() == truth.peak[0]
    assert line["index"].is_monotonic_increasing


def test_what_it_keeps_does_not_grow_with_the_history(tmp_path):
    kept = []
    for steps in (10, 200):
        raw, _ = make_snapshot(SnapshotSpec(steps=steps, allocations_per_step=10, keep_per_step=0, seed=1))
        streamed = summarize(_write(tmp_path, raw, name=f"s{steps}.pickle"))
        assert streamed.summary["trace_entries"].iloc[0] > steps * 10
        kept.append(streamed.memo_kept)
    assert kept[0] == kept[1] and kept[0] < 50  # the shared strings and frames, not the entries


def test_the_large_snapshot_writer_gives_what_pickle_reads(tmp_path):
    spec = LargeSnapshotSpec(devices=2, steps=30, allocations_per_step=7)
    buffer = io.BytesIO()
    truth = write_large_snapshot(buffer, spec)
    raw = pickle.loads(buffer.getvalue())  # the format is pickle's own
    path = tmp_path / "large.pickle"
    path.write_bytes(buffer.getvalue())
    whole, streamed = AllocatorSnapshot.from_dict(raw), summarize(path)
    _same(whole.summary(), streamed.summary)
    for device in range(spec.devices):
        assert streamed.peak(device)[0] == whole.peak(device)[0]
        assert streamed.peak(device)[0]["allocated"] == truth["peak"]
        assert streamed.summary["trace_entries"].iloc[device] == truth["entries_per_device"]
        _same(whole.by_frame(device), streamed.by_frame(device))


class _Evil:
    def __reduce__(self):
        return (os.system, ("echo pwned",))


def test_hostile_and_broken_pickles_are_refused_by_name(tmp_path):
    evil = tmp_path / "evil.pickle"
    evil.write_bytes(pickle.dumps({"segments": [], "device_traces": [[{"action": "alloc", "x": _Evil()}]]}))
    with pytest.raises(CorruptRecord, match="plain data only"):
        summarize(evil)
    raw, _ = make_snapshot(SnapshotSpec(steps=3))
    whole = pickle.dumps(raw)
    cut = tmp_path / "cut.pickle"
    cut.write_bytes(whole[: len(whole) // 2])
    with pytest.raises(CorruptRecord, match="ends"):
        summarize(cut)
    (tmp_path / "list.pickle").write_bytes(pickle.dumps([1, 2, 3]))
    with pytest.raises(CorruptRecord, match="no 'segments' list"):
        summarize(tmp_path / "list.pickle")
    (tmp_path / "bad.gz").write_bytes(b"\x1f\x8b" + b"not gzip at all")
    with pytest.raises(CorruptRecord, match="gzip"):
        summarize(tmp_path / "bad.gz")
    with pytest.raises(CorruptRecord, match="max_bytes"):
        summarize(_write(tmp_path, raw, name="big.pickle"), max_bytes=100)


def test_the_memory_summary_command(tmp_path, capsys):
    from stepscope.cli import main
    from stepscope.cli_common import EXIT_ERROR

    raw, truth = make_snapshot(SnapshotSpec(devices=1, steps=6, oom=True, seed=5))
    assert main(["memory", "summary", str(_write(tmp_path, raw)), "--top", "3"]) == 0
    out = capsys.readouterr().out
    assert f"history peak {truth.peak[0]:,} bytes" in out and "distinct stacks" in out
    assert main(["memory", "summary", str(tmp_path / "missing.pickle")]) == EXIT_ERROR  # named, not a traceback
    err = capsys.readouterr().err
    assert "missing.pickle" in err and "Traceback" not in err
