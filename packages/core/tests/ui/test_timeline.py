"""Server-side level of detail: every interval of the range is either sent or counted in a
bucket, answers stay small however many intervals the range holds, details and the
Perfetto export come from the step timeline."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from stepscope.ui.timeline import BUCKET_PX, MIN_SLICE_PX, build_index, event_details, export_steps, query

T0 = 1_700_000_000 * 10**9


def _frame(n: int, dur_ns: int = 1000, gap_ns: int = 500, seed: int = 0) -> pd.DataFrame:
    """n steps, each with one nested phase, back to back."""
    rng = np.random.default_rng(seed)
    durations = (dur_ns * (1 + rng.random(n))).astype(np.int64)
    starts = T0 + np.concatenate([[0], np.cumsum(durations + gap_ns)[:-1]])
    rows = []
    for i in range(n):
        rows.append(("n1", 0, "pytorch", "TRAIN", i, "step", f"Step {i}", int(starts[i]), int(starts[i] + durations[i])))
        rows.append(("n1", 0, "pytorch", "TRAIN", i, "forward", "forward", int(starts[i]), int(starts[i] + durations[i] // 2)))
    frame = pd.DataFrame(rows, columns=["node_id", "rank", "framework", "mode", "step", "phase", "name", "start_ns", "end_ns"])
    frame["duration_ms"] = (frame["end_ns"] - frame["start_ns"]) / 1e6
    frame["args"] = None
    return frame


def _empty_metrics() -> pd.DataFrame:
    return pd.DataFrame(columns=["timestamp", "node_id", "type", "name", "dimension", "value"])


def test_every_interval_is_sent_or_counted_once():
    frame = _frame(20000)
    index = build_index(frame, _empty_metrics())
    answer = query(index, None, None, 900)
    (lane,) = answer["lanes"]
    sent, counted = len(lane["slices"]["s"]), sum(lane["agg"]["c"])
    assert sent + counted == len(frame)
    assert len(lane["agg"]["b"]) <= 2 * 900 / BUCKET_PX
    assert len(json.dumps(answer)) < 200_000


def test_busy_fraction_of_a_bucket_matches_numpy():
    frame = _frame(5000)
    index = build_index(frame, _empty_metrics())
    t0, t1 = int(frame["start_ns"].min()), int(frame["end_ns"].max())
    answer = query(index, t0, t1, 300)
    lane = answer["lanes"][0]
    bucket_ns = (t1 - t0) / 300 * BUCKET_PX
    steps = frame[frame["phase"] == "step"]
    b = np.clip(((steps["start_ns"] - t0) / bucket_ns).astype(int), 0, 99)
    busy = np.bincount(b, weights=(np.minimum(steps["end_ns"], t1) - steps["start_ns"]).astype(float), minlength=100)
    agg = lane["agg"]
    for bucket, depth, fraction, count in zip(agg["b"], agg["z"], agg["f"], agg["c"]):
        if depth == 0:
            assert fraction == min(100, round(100 * busy[bucket] / bucket_ns))
            assert count == int((b == bucket).sum())


def test_zoomed_in_everything_is_individual_with_exact_times():
    frame = _frame(2000)
    index = build_index(frame, _empty_metrics())
    steps = frame[frame["phase"] == "step"]
    t0, t1 = int(steps["start_ns"].iloc[100]), int(steps["end_ns"].iloc[104])
    answer = query(index, t0, t1, 1000)
    lane = answer["lanes"][0]
    assert lane["agg"]["c"] == []
    names = [answer["names"][n] for n in lane["slices"]["n"]]
    assert [n for n in names if n.startswith("Step")] == [f"Step {i}" for i in range(100, 105)]
    first = names.index("Step 100")
    assert lane["slices"]["s"][first] == 0.0
    assert lane["slices"]["d"][first] == pytest.approx((steps["end_ns"].iloc[100] - steps["start_ns"].iloc[100]) / 1e3, abs=0.05)


def test_an_interval_begun_before_the_range_is_kept():
    frame = _frame(10, dur_ns=10**9)
    index = build_index(frame, _empty_metrics())
    step3 = frame[(frame["phase"] == "step") & (frame["step"] == 3)].iloc[0]
    middle = int(step3["start_ns"] + 6 * 10**8)
    answer = query(index, middle, middle + 10**6, 500)
    names = [answer["names"][n] for n in answer["lanes"][0]["slices"]["n"]]
    assert names == ["Step 3"]


def test_narrow_slices_threshold():
    frame = _frame(100)
    index = build_index(frame, _empty_metrics())
    t0, t1 = index.start_ns, index.end_ns
    width = 500
    answer = query(index, t0, t1, width)
    lane = answer["lanes"][0]
    ns_per_px = (t1 - t0) / width
    assert all(d * 1e3 >= ns_per_px * MIN_SLICE_PX - 100 for d in lane["slices"]["d"])


def test_counters_are_averaged_per_bucket():
    n = 10000
    metrics = pd.DataFrame({"timestamp": T0 / 1e9 + np.arange(n) * 0.01, "node_id": "n1", "type": "cpu", "name": "total",
                            "dimension": "CPUUtilization", "value": np.arange(n) % 100.0})
    index = build_index(_frame(0), metrics)
    answer = query(index, None, None, 600)
    (lane,) = answer["lanes"]
    assert lane["kind"] == "counter" and len(lane["t"]) <= 600 / BUCKET_PX + 2
    assert np.mean(lane["v"]) == pytest.approx(np.mean(np.arange(n) % 100.0), rel=0.02)


def test_details_and_perfetto_export():
    frame = _frame(50)
    index = build_index(frame, _empty_metrics())
    lane = index.lanes[0]
    details = event_details(index, lane.id, 7)
    source = frame.iloc[int(lane.row[7])]
    assert details["name"] == source["name"] and int(details["start_ns"]) == source["start_ns"]
    with pytest.raises(KeyError):
        event_details(index, lane.id, 10**6)
    steps = frame[frame["phase"] == "step"]
    assert export_steps(index, int(steps["start_ns"].iloc[10]), int(steps["end_ns"].iloc[19])) == (10, 19)
    assert export_steps(index, int(steps["end_ns"].iloc[10]) + 1, int(steps["end_ns"].iloc[10]) + 2) == (10, 11)  # in a gap
    assert export_steps(index, None, None) == (0, 49)


def test_timeline_endpoint_and_event_details(app):
    from .conftest import login

    client = app.test_client()
    login(client, "alice")
    answer = client.get("/api/jobs/team-a/run-1/timeline?width=800").get_json()
    lanes = {lane["id"]: lane for lane in answer["lanes"]}
    assert set(lanes) == {"r0-TRAIN", "c-algo-1-total", "c-algo-1-gpu0"}
    train = lanes["r0-TRAIN"]
    assert len(train["slices"]["s"]) + sum(train["agg"]["c"]) == 200
    detail = client.get(f"/api/jobs/team-a/run-1/timeline/event?lane=r0-TRAIN&i={train['slices']['i'][0]}").get_json()
    assert detail["name"] == answer["names"][train["slices"]["n"][0]]
    resp = client.get("/api/jobs/team-a/run-1/perfetto")
    assert "attachment" in resp.headers["Content-Disposition"]
    assert sum(e["ph"] == "X" for e in json.loads(resp.data)["traceEvents"]) == 200
    # the first 250 ms: steps 0-2 (about 100 ms each), each with its four phases
    part = json.loads(client.get(f"/api/jobs/team-a/run-1/perfetto?start={answer['t0']}&end={answer['t0'] + 250_000_000}").data)
    assert sum(e["ph"] == "X" for e in part["traceEvents"]) == 3 * 5


def test_grid_path_for_huge_ranges_agrees_with_the_exact_one(monkeypatch):
    from stepscope.ui import timeline

    monkeypatch.setattr(timeline, "RAW_LIMIT", 1000)
    frame = _frame(30000)
    index = build_index(frame, _empty_metrics())
    lane = index.lanes[0]
    assert lane.grid is not None and [g.cells for g in lane.grids] == [65536, 4096, 256]
    assert all(int(g.count.sum()) == len(frame) for g in lane.grids)
    gridded = query(index, None, None, 600)["lanes"][0]
    lane.grid = None
    exact = query(index, None, None, 600)["lanes"][0]
    assert len(gridded["slices"]["s"]) + sum(gridded["agg"]["c"]) == len(frame)
    def counts(answer, depth):
        out = np.zeros(200)
        for b, z, c in zip(answer["agg"]["b"], answer["agg"]["z"], answer["agg"]["c"]):
            if z == depth:
                out[b] += c
        return out

    for depth in (0, 1):
        g, e = counts(gridded, depth), counts(exact, depth)
        assert g.sum() == e.sum()
        # an interval lands at most a quarter bucket (one cell) from its exact bucket
        assert np.abs(np.cumsum(g) - np.cumsum(e)).max() <= 0.3 * e.max()


def test_grid_path_sends_the_long_intervals(monkeypatch):
    from stepscope.ui import timeline

    monkeypatch.setattr(timeline, "RAW_LIMIT", 1000)
    frame = _frame(20000)
    long_start = int(frame["start_ns"].iloc[0])
    extra = pd.DataFrame([("n1", 0, "pytorch", "TRAIN", -1, "eval_step", "long", long_start, long_start + int(frame["end_ns"].max() - long_start) // 2, 0.0, None)],
                         columns=frame.columns)
    index = build_index(pd.concat([frame, extra], ignore_index=True), _empty_metrics())
    answer = query(index, None, None, 800)
    lane = answer["lanes"][0]
    names = [answer["names"][n] for n in lane["slices"]["n"]]
    assert names == ["long"]
    assert len(lane["slices"]["s"]) + sum(lane["agg"]["c"]) == len(frame) + 1


def test_export_of_a_huge_range_is_refused(monkeypatch):
    from stepscope.ui import timeline

    monkeypatch.setattr(timeline, "MAX_EXPORT_EVENTS", 100)
    index = build_index(_frame(200), _empty_metrics())
    with pytest.raises(timeline.TooManyEvents, match="zoom in"):
        export_steps(index, None, None)
    steps = index.lanes[0]
    assert export_steps(index, int(steps.start[0]), int(steps.start[10])) == (0, 5)
