"""The web app's data endpoints on big jobs, through the app itself (Flask's test client:
routing, authentication, JSON and gzip included, no network).

1. Timeline: a generated job with 1,000,000 intervals (steps and four phases each, written
   by the real TimelineWriter) and system metrics; requests at 5 zoom levels (the whole job,
   then 1/10, 1/100, 1/1000, 1/10000 of it), each at 3 positions (a pan). Prints time per
   request and bytes sent (gzip, as browsers ask) and raw. Goal: <= 100 ms and <= 200 KB each.
   Anchor: Perfetto stays interactive at this size; TensorBoard's trace viewer caps at 1 M events.
2. Dashboard first load on a 10,000-step job: a fresh app (files read and parsed on the
   first request), then the same request again (cached per job generation).

    python bench/bench_ui.py            # 1,000,000 intervals
    python bench/bench_ui.py --quick    # 100,000 intervals, 2,000-step dashboard job
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

from stepscope.modes import ModeKeys
from stepscope.profiler import TimelineWriter

GOAL_MS, GOAL_BYTES = 100.0, 200_000
T0_NS = 1_700_000_000 * 10**9
PHASES = (("data", 0.1), ("forward", 0.3), ("backward", 0.45), ("optimizer", 0.1))


def write_job(root: Path, steps: int, ranks: int = 1, samples: int = 2000) -> Path:
    """`steps` steps per rank of ~10 ms with four phases each (5 intervals per step)."""
    rng = np.random.default_rng(0)
    for rank in range(ranks):
        writer = TimelineWriter(root, node_id="algo-1", rank=rank, framework="pytorch", flush_interval_s=10**6)
        durations = (10_000_000 * (1 + 0.1 * rng.random(steps))).astype(np.int64)
        starts = T0_NS + np.concatenate([[0], np.cumsum(durations + 200_000)[:-1]])
        for step in range(steps):
            start, duration = int(starts[step]), int(durations[step])
            writer.add(f"Step {step}", start, start + duration, step=step, mode=ModeKeys.TRAIN)
            cursor = start
            for phase, share in PHASES:
                span = int(duration * share)
                writer.add(phase, cursor, cursor + span, step=step, mode=ModeKeys.TRAIN, phase=phase)
                cursor += span
            if step % 20000 == 19999:
                writer.flush()
        writer.close()
    span_s = steps * 0.0105
    lines = []
    for i in range(samples):
        ts = T0_NS / 1e9 + i * span_s / samples
        lines.append(f'{{"Type": "cpu", "Name": "total", "Dimension": "CPUUtilization", "Value": {50 + 20 * np.sin(i / 50):.2f}, "NodeId": "algo-1", "Timestamp": {ts:.6f}}}')
        lines.append(f'{{"Type": "gpu", "Name": "gpu0", "Dimension": "GPUUtilization", "Value": {70 + 20 * np.cos(i / 30):.2f}, "NodeId": "algo-1", "Timestamp": {ts:.6f}}}')
    folder = root / "profiler-output/system/incremental/2023111422"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "1700000000.algo-1.json").write_text("\n".join(lines) + "\n")
    (root / "training_job_end.ts").write_text("")
    return root


def make_client(store: Path, db_path: Path):
    from stepscope.ui.app import create_app
    from stepscope.ui.jobs import JobStore
    from stepscope.ui.users import UserDB

    db = UserDB(db_path, argon2_memory_kib=1024, argon2_time_cost=1)
    if not db.has_admin():
        db.add_user("bench", "bench-password", admin=True)
    token = db.new_token("bench")
    client = create_app(JobStore(str(store)), db).test_client()
    return client, {"Authorization": f"Bearer {token}", "Accept-Encoding": "gzip"}


def timed_get(client, url: str, headers: dict[str, str]) -> tuple[float, int, int]:
    import gzip

    start = time.perf_counter()
    resp = client.get(url, headers=headers)
    elapsed = (time.perf_counter() - start) * 1000
    assert resp.status_code == 200, (url, resp.status_code, resp.data[:200])
    sent = len(resp.data)
    raw = len(gzip.decompress(resp.data)) if resp.headers.get("Content-Encoding") == "gzip" else sent
    return elapsed, sent, raw


def bench_timeline(tmp: Path, events: int, width: int) -> bool:
    steps = events // 5
    t = time.perf_counter()
    write_job(tmp / "store" / "big", steps)
    print(f"wrote {steps * 5:,} intervals in {time.perf_counter() - t:.1f} s")
    client, headers = make_client(tmp / "store", tmp / "users.db")
    url = "/api/jobs/big/timeline"
    first = timed_get(client, f"{url}?width={width}", headers)
    answer = client.get(f"{url}?width={width}", headers={"Authorization": headers["Authorization"]}).get_json()
    t0, t1 = answer["job_start"], answer["job_end"]
    print(f"first request (reads and indexes the job): {first[0]:.0f} ms; the job holds {answer['events']:,} intervals")
    print(f"{'zoom':>8} {'position':>9} {'ms':>7} {'sent KB':>8} {'raw KB':>8} {'slices':>7} {'buckets':>8}")
    ok = True
    worst_ms = worst_bytes = 0.0
    for level in range(5):
        span = (t1 - t0) / 10**level
        for position in (0.1, 0.5, 0.9):
            start = int(t0 + (t1 - t0 - span) * position)
            end = int(start + span)
            query = f"{url}?width={width}&start={start}&end={end}"
            runs = [timed_get(client, query, headers) for _ in range(3)]
            ms = statistics.median(r[0] for r in runs)
            sent, raw = runs[0][1], runs[0][2]
            body = client.get(query, headers={"Authorization": headers["Authorization"]}).get_json()
            slices = sum(len(lane["slices"]["s"]) for lane in body["lanes"] if lane["kind"] == "slices")
            buckets = sum(len(lane["agg"]["c"]) for lane in body["lanes"] if lane["kind"] == "slices")
            print(f"{'1/' + str(10**level):>8} {position:>9.1f} {ms:>7.1f} {sent / 1000:>8.1f} {raw / 1000:>8.1f} {slices:>7} {buckets:>8}")
            worst_ms, worst_bytes = max(worst_ms, ms), max(worst_bytes, sent)
            ok &= ms <= GOAL_MS and sent <= GOAL_BYTES
    print(f"timeline worst: {worst_ms:.1f} ms (goal {GOAL_MS:.0f}), {worst_bytes / 1000:.1f} KB sent (goal {GOAL_BYTES / 1000:.0f}): "
          f"{'OK' if ok else 'MISSED'}")
    return ok


def bench_dashboard(tmp: Path, steps: int) -> None:
    write_job(tmp / "store2" / "ten-k", steps, samples=steps // 2)
    client, headers = make_client(tmp / "store2", tmp / "users2.db")
    cold = timed_get(client, "/api/jobs/ten-k/dashboard", headers)
    warm = timed_get(client, "/api/jobs/ten-k/dashboard", headers)
    rules = timed_get(client, "/api/jobs/ten-k/rules", headers)
    jobs = timed_get(client, "/api/jobs", headers)
    print(f"dashboard, {steps:,}-step job: first load {cold[0]:.0f} ms ({cold[1] / 1000:.1f} KB sent, {cold[2] / 1000:.1f} KB raw), "
          f"again {warm[0]:.1f} ms; rules panel {rules[0]:.0f} ms; jobs list {jobs[0]:.0f} ms")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="100,000 intervals and a 2,000-step dashboard job")
    parser.add_argument("--events", type=int, default=None, help="intervals in the timeline job (default 1,000,000)")
    parser.add_argument("--width", type=int, default=1600, help="timeline width in pixels asked for")
    args = parser.parse_args()
    events = args.events or (100_000 if args.quick else 1_000_000)
    tmp = Path(tempfile.mkdtemp(prefix="stepscope-bench-ui-"))
    try:
        bench_timeline(tmp, events, args.width)
        bench_dashboard(tmp, 2_000 if args.quick else 10_000)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
