"""The allocator snapshot reader against generated snapshots in torch's `_snapshot()` format
with known truth: per-device summary and fragmentation, an OOM that fragmentation caused,
live bytes by user frame, the history's peak and what was live at it (also when the
history is a truncated ring buffer), the entries around the OOM, and hostile files."""

from __future__ import annotations

import gzip
import json
import os
import pickle

import pytest

from stepscope.exceptions import ConfigError, CorruptRecord
from stepscope.testing.snapshots import SnapshotSpec, make_snapshot, user_frame_text
from stepscope.traces.snapshot import BEFORE_TRACE, AllocatorSnapshot


@pytest.fixture(scope="module")
def generated():
    raw, truth = make_snapshot(SnapshotSpec(devices=2, steps=5, oom=True, seed=11))
    return raw, truth, AllocatorSnapshot.from_bytes(pickle.dumps(raw))


def test_summary_matches_truth(generated):
    _, truth, snap = generated
    summary = snap.summary().set_index("device")
    assert list(summary.index) == [0, 1]
    for device in (0, 1):
        row = summary.loc[device]
        assert row["reserved"] == truth.reserved[device]
        assert row["allocated"] == truth.allocated[device]
        assert row["cached_free"] == truth.cached_free[device]
        assert row["largest_free_block"] == truth.largest_free_block[device]
        assert row["segments"] == truth.segments[device]
        assert row["trace_entries"] == truth.trace_entries[device]
        assert row["fragmentation"] == pytest.approx(truth.cached_free[device] / truth.reserved[device])
        assert row["ooms"] == 1 and row["oom_request"] == truth.oom_request[device]
        assert row["oom_fragmented"]  # the request fits the free memory, not any one block


def test_live_bytes_by_user_frame(generated):
    _, truth, snap = generated
    for device in (0, 1):
        frames = snap.by_frame(device, k=None)
        assert dict(zip(frames["frame"], frames["bytes"])) == truth.live_by_frame[device]
        assert frames["bytes"].is_monotonic_decreasing
        # The innermost frame is the allocator's C++ frame, not the user's line.
        top = snap.by_frame(device, k=None, frame="top")
        assert list(top["frame"].str.startswith("c10::")) == [True] * len(top)


def test_peak_and_what_was_live_at_it(generated):
    _, truth, snap = generated
    for device in (0, 1):
        at, live = snap.peak(device, k=None)
        assert at["allocated"] == truth.peak[device]
        assert at["index"] == truth.peak_index[device]
        assert dict(zip(live["frame"], live["bytes"])) == truth.peak_by_frame[device]
        line = snap.timeline(device)
        assert line["allocated"].iloc[-1] == truth.allocated[device]
        assert line["allocated"].max() == truth.peak[device]


def test_a_truncated_history_counts_what_came_before_it(generated):
    raw, truth, _ = generated
    cut = dict(raw, device_traces=[entries[len(entries) // 2 :] for entries in raw["device_traces"]])
    snap = AllocatorSnapshot.from_dict(cut)
    line = snap.timeline(0)
    assert line["allocated"].iloc[-1] == truth.allocated[0]  # the curve still ends at the snapshot
    at, live = snap.peak(0, k=None)
    assert live["bytes"].sum() == at["allocated"]
    assert BEFORE_TRACE in set(live["frame"])


def test_entries_around_the_oom(generated):
    _, truth, snap = generated
    window = snap.around(0, count=4)
    assert len(window) == 5 and window["action"].iloc[-1] == "oom"
    assert window["size"].iloc[-1] == truth.oom_request[0]
    assert window["frame"].iloc[-1] == user_frame_text("model.py:57 attention")
    assert "CUDACachingAllocator" in window["stack"].iloc[-1]
    by_time = snap.around(0, time_us=int(window["time_us"].iloc[2]), count=1)
    assert list(by_time["index"]) == list(window["index"].iloc[1:4])


@pytest.mark.parametrize("form", ["pickle", "pickle.gz", "json", "json.gz"])
def test_file_forms_read_the_same(tmp_path, generated, form):
    raw, truth, _ = generated
    data = json.dumps(raw).encode() if form.startswith("json") else pickle.dumps(raw)
    if form.endswith(".gz"):
        data = gzip.compress(data)
    path = tmp_path / f"snapshot.{form}"
    path.write_bytes(data)
    snap = AllocatorSnapshot.load(path)
    assert snap.summary()["reserved"].tolist() == [truth.reserved[0], truth.reserved[1]]
    with pytest.raises(ConfigError, match="max_bytes"):
        AllocatorSnapshot.load(path, max_bytes=16)


class _Evil:
    def __reduce__(self):
        return (os.remove, ("/nonexistent/stepscope-test",))


def test_hostile_and_wrong_files_are_refused_by_name(tmp_path):
    evil = tmp_path / "evil.pickle"
    evil.write_bytes(pickle.dumps({"segments": [], "x": _Evil()}))
    with pytest.raises(CorruptRecord, match=r"evil\.pickle.*(posix|os)\.remove"):
        AllocatorSnapshot.load(evil)
    for name, content in (("notsnap.pickle", pickle.dumps({"traceEvents": []})), ("junk.pickle", b"\x80\x05garbage"), ("bad.json", b"{not json")):
        path = tmp_path / name
        path.write_bytes(content)
        with pytest.raises(CorruptRecord, match=name.replace(".", r"\.")):
            AllocatorSnapshot.load(path)
    wrong = {"segments": [{"device": 0, "address": "0x10", "total_size": 4}], "device_traces": []}
    with pytest.raises(CorruptRecord, match="segment 0 address"):
        AllocatorSnapshot.from_dict(wrong)


def test_minimal_snapshots_of_other_tools_read():
    # Entries with an action only, as some tools' tests write them; segments without blocks.
    snap = AllocatorSnapshot.from_dict({"segments": [{"device": 2, "address": 4096, "total_size": 4 << 20}], "device_traces": [[{"action": "alloc"}, {"action": "free_completed"}]]})
    summary = snap.summary().set_index("device")
    assert summary.loc[2, "reserved"] == 4 << 20 and summary.loc[2, "allocated"] == 0
    assert summary.loc[0, "trace_entries"] == 2
