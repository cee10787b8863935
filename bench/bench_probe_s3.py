"""S3 fault probe: a real training hook (writer, step timeline, system monitor, cost file)
saving every step to a real S3-protocol server (moto, 127.0.0.1) through the fault-injecting
proxy (stepscope.testing.s3_proxy), with an outage of each kind (503s, connection resets,
silence, a slow trickle) at each moment (from the start, in the middle, at close) and of
several lengths. Prints one line per case and the totals

    cases N; saved S; lost L (all reported by step: unaccounted U); hangs H (close over its deadline)

Goal: 0 lost for outages the queue's bound holds (all but "forever": an outage that outlasts
the close deadline loses what was not yet saved, and every such step must be reported), 0
unaccounted, 0 hangs.

    python bench/bench_probe_s3.py            # every case, stepscope's default S3 timeouts
    python bench/bench_probe_s3.py --quick    # short outages, fast timeouts (a few minutes)
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
import uuid
from dataclasses import dataclass

import numpy as np


@dataclass
class Case:
    kind: str  # the proxy's fault during the outage
    when: str  # start | middle | close
    seconds: float  # how long the outage lasts (inf: past the close deadline)

    @property
    def name(self) -> str:
        length = "forever" if self.seconds == float("inf") else f"{self.seconds:g}s"
        return f"{self.kind}@{self.when}/{length}"


def _cases(quick: bool) -> list[Case]:
    kinds = ("503", "reset", "stall", "trickle")
    if quick:
        plan = [("start", 3.0), ("middle", 3.0), ("middle", float("inf")), ("close", 2.0), ("close", float("inf"))]
    else:
        plan = [("start", 12.0), ("middle", 8.0), ("middle", 30.0), ("middle", float("inf")), ("close", 5.0), ("close", float("inf"))]
    return [Case(kind, when, seconds) for kind in kinds for when, seconds in plan]


def _value(step: int, size: int) -> np.ndarray:
    return np.full(size, step, dtype=np.float32)


def run_case(case: Case, endpoint: str, proxy, *, steps: int, rate: float, size: int, deadline_s: float, catch_up_s: float) -> dict:
    import boto3

    from stepscope import create_trial
    from stepscope.capture.hook import HookBase
    from stepscope.config import ProfilerConfig, SaveConfig
    from stepscope.store.s3 import S3Store

    class Hook(HookBase):
        framework = "probe"

    bucket = f"probe-{uuid.uuid4().hex[:10]}"
    boto3.client("s3", endpoint_url=endpoint).create_bucket(Bucket=bucket)
    url = f"s3://{bucket}/job"
    proxy.outage = None
    down_at = {"start": 0.0, "middle": min(10.0, steps / rate / 3), "close": float("inf")}[case.when]
    if case.when != "close" and case.seconds != float("inf"):
        # The run goes on after the outage (long enough to catch up): "mid-run".
        steps = max(steps, int(rate * (down_at + case.seconds + catch_up_s)))
    began = time.monotonic()
    up_at = down_at + case.seconds

    def switch(now: float) -> None:
        proxy.outage = case.kind if down_at <= now - began < up_at else None

    if case.when == "start":
        switch(time.monotonic())
    hook = Hook(url, save_config=SaveConfig(save_interval=1), profiler_config=ProfilerConfig(monitor_interval_ms=500))
    blocked = 0.0
    for step in range(steps):
        switch(time.monotonic())
        started = time.monotonic()
        hook.begin_step()
        hook.save_tensor("w", _value(step, size))
        hook.end_step()
        blocked = max(blocked, time.monotonic() - started)
        time.sleep(max(0.0, began + (step + 1) / rate - time.monotonic()))
    # An outage under way goes on as planned; one at close starts now.
    if case.when == "close":
        down_at, up_at = time.monotonic() - began, time.monotonic() - began + case.seconds
    stop_switching = False

    def keep_switching() -> None:
        while not stop_switching:
            switch(time.monotonic())
            time.sleep(0.05)

    import threading

    switcher = threading.Thread(target=keep_switching, daemon=True)
    switcher.start()
    started = time.monotonic()
    hook.close()
    close_s = time.monotonic() - started
    writer = hook.writer
    assert writer is not None
    reported = set(writer.unpublished_steps) | set(writer.lost_steps)
    stop_switching = True
    switcher.join()
    proxy.outage = None
    # Read back straight from the server (not through the proxy), checking every value.
    store = S3Store(url, client=boto3.client("s3", endpoint_url=endpoint))
    trial = create_trial(store)
    saved = trial.steps(show_incomplete=True)
    for step in saved:
        np.testing.assert_array_equal(trial.tensor("w").value(step), _value(step, size))
    status = {}
    if store.exists("stepscope-status/worker_0.json"):
        status = json.loads(store.read("stepscope-status/worker_0.json"))
    lost = set(range(steps)) - set(saved)
    return {
        "case": case.name,
        "steps": steps,
        "saved": len(saved),
        "lost": len(lost),
        "unaccounted": len(lost - reported),
        "in_status": len(set(status.get("lost_steps", ())) & lost),
        "close_s": close_s,
        "hang": close_s > deadline_s + 1.0,
        "max_step_s": blocked,
        "outages": writer.outages,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="short outages and fast S3 timeouts")
    parser.add_argument("--only", default="", help="comma-separated case names (e.g. 503@middle/8s)")
    parser.add_argument("--steps", type=int, default=None, help="steps per case, at least (default 400; 60 with --quick; more where an outage needs a longer run)")
    parser.add_argument("--rate", type=float, default=4.0, help="saved steps per second (each one PUT of the event file, one of the index)")
    parser.add_argument("--kib", type=int, default=64, help="KiB saved per step")
    parser.add_argument("--deadline", type=float, default=10.0, help="STEPSCOPE_CLOSE_TIMEOUT_S for the cases")
    args = parser.parse_args(argv)
    os.environ["STEPSCOPE_CLOSE_TIMEOUT_S"] = str(args.deadline)
    if args.quick:
        os.environ.update(STEPSCOPE_S3_CONNECT_TIMEOUT_S="1", STEPSCOPE_S3_READ_TIMEOUT_S="2", STEPSCOPE_S3_MAX_ATTEMPTS="2")
    os.environ.update(AWS_ACCESS_KEY_ID="probe", AWS_SECRET_ACCESS_KEY="probe", AWS_DEFAULT_REGION="us-east-1")
    logging.basicConfig(level=getattr(logging, os.environ.get("PROBE_LOG", "CRITICAL")), format="%(relativeCreated)d %(threadName)s %(message)s")  # the cases' warnings are expected; the table says what happened
    logging.getLogger("werkzeug").setLevel(logging.CRITICAL)

    from stepscope.testing.s3_proxy import FaultProxy, start_s3_server

    endpoint, stop = start_s3_server()
    proxy = FaultProxy(endpoint)
    proxy.trickle_bytes_per_s = 64 * 1024
    os.environ["AWS_ENDPOINT_URL_S3"] = proxy.url
    steps = args.steps or (60 if args.quick else 400)
    cases = _cases(args.quick)
    if args.only:
        cases = [c for c in cases if c.name in args.only.split(",")]
    print(f"{steps}+ steps at {args.rate:g}/s, {args.kib} KiB each; close deadline {args.deadline:g} s", flush=True)
    print(f"{'CASE':<24} {'STEPS':>5} {'SAVED':>5} {'LOST':>5} {'UNACC':>5} {'IN-STATUS':>9} {'CLOSE S':>8} {'MAX STEP S':>10} {'OUTAGES':>7}  HANG", flush=True)
    rows = []
    try:
        for case in cases:
            row = run_case(case, endpoint, proxy, steps=steps, rate=args.rate, size=args.kib * 256, deadline_s=args.deadline, catch_up_s=5.0 if args.quick else 20.0)
            rows.append(row)
            print(
                f"{row['case']:<24} {row['steps']:>5} {row['saved']:>5} {row['lost']:>5} {row['unaccounted']:>5} {row['in_status']:>9} "
                f"{row['close_s']:>8.2f} {row['max_step_s']:>10.3f} {row['outages']:>7}  {'HANG' if row['hang'] else '-'}",
                flush=True,
            )
    finally:
        proxy.close()
        stop()
    bounded = [r for r in rows if not r["case"].endswith("forever")]
    lost_in_bound = sum(r["lost"] for r in bounded)
    unaccounted = sum(r["unaccounted"] for r in rows)
    hangs = sum(r["hang"] for r in rows)
    print(
        f"\ncases {len(rows)}; saved {sum(r['saved'] for r in rows)}; lost {sum(r['lost'] for r in rows)} "
        f"(within the bound: {lost_in_bound}; unaccounted: {unaccounted}); hangs {hangs} (close over its deadline)"
    )
    return 0 if lost_in_bound == 0 and unaccounted == 0 and hangs == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
