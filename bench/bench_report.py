"""`stepscope report` on a job of 10,000 saved steps with profiler data (system metrics every
500 ms, the step timeline with its phases, the hooks' cost file): the time to build and write
the HTML, against the target of 10 s, section by section; and the exports of the same job.

    python bench/bench_report.py            # 10,000 steps
    python bench/bench_report.py --quick    # 1,000 steps
    python bench/bench_report.py --keep /tmp/job   # keep the generated job

The rules run first (`stepscope check`, not timed here: bench_rules.py times them), so the
report shows their saved results as it does after a job. The job is a 16-32-32-1 MLP's
weights, biases, gradients and loss every step, an EVAL loss every 100 steps."""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np
from _mlp_job import write_mlp_job

from stepscope.capture.cost import CostMeter, cost_key
from stepscope.capture.monitor import system_metrics_key
from stepscope.cli import main as stepscope_cli
from stepscope.modes import ModeKeys
from stepscope.profiler import TimelineWriter
from stepscope.store import open_store

STEP_MS = 100.0
TARGET_S = 10.0


def generate(out_dir: Path, steps: int) -> float:
    """The MLP job with profiler data: each TRAIN step a timeline of about STEP_MS (a slow
    step every 997), its cost in the hooks' cost file, then system metrics over the span."""
    rng = np.random.default_rng(0)
    started = time.perf_counter()
    t0_ns = 1_700_000_000 * 10**9
    store = open_store(str(out_dir))
    timeline = TimelineWriter(store, node_id="algo-1", flush_interval_s=3600)
    meter = CostMeter("worker_0", {"torch": "synthetic"})
    clock = {"now": t0_ns}

    def profile(global_step: int, step: int) -> None:
        now = clock["now"]
        duration = int(STEP_MS * 1e6 * (3.0 if step % 997 == 500 else rng.uniform(0.9, 1.1)))
        cut = [now + int(duration * f) for f in (0.0, 0.2, 0.5, 0.85, 1.0)]
        timeline.add_spans([("step", cut[0], cut[4]), ("data", cut[0], cut[1]), ("forward", cut[1], cut[2]), ("backward", cut[2], cut[3]), ("optimizer", cut[3], cut[4])], step=global_step, mode=ModeKeys.TRAIN)
        meter.step_done(global_step, duration / 1e9)
        clock["now"] = now + duration
        if step % 5000 == 4999:
            timeline.flush()

    write_mlp_job(out_dir, steps, rng, after_train_step=profile)
    store.write(cost_key("worker_0"), meter.to_bytes(writer_s=1.0, bytes_written=0))
    timeline.close()
    _system_metrics(store, t0_ns / 1e9, clock["now"] / 1e9, rng)
    return time.perf_counter() - started


def _system_metrics(store, start: float, end: float, rng) -> None:
    """Samples every 500 ms of 4 CPU cores, one GPU and its memory, in minute files."""
    minute = int(start // 60 * 60)
    while minute < end:
        lines = []
        for t in np.arange(max(start, minute), min(end, minute + 60), 0.5):
            for core in range(4):
                lines.append({"Type": "cpu", "Name": f"cpu{core}", "Dimension": "CPUUtilization", "Value": float(rng.uniform(20, 90)), "NodeId": "algo-1", "Timestamp": float(t)})
            lines.append({"Type": "gpu", "Name": "gpu0", "Dimension": "GPUUtilization", "Value": float(rng.uniform(30, 100)), "NodeId": "algo-1", "Timestamp": float(t)})
            lines.append({"Type": "gpu", "Name": "gpu0", "Dimension": "GPUMemoryUtilization", "Value": float(rng.uniform(40, 60)), "NodeId": "algo-1", "Timestamp": float(t)})
        store.write(system_metrics_key(minute, "algo-1"), "\n".join(json.dumps(line) for line in lines).encode())
        minute += 60


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=10_000)
    parser.add_argument("--quick", action="store_true", help="1,000 steps")
    parser.add_argument("--keep", help="write the job here and keep it")
    args = parser.parse_args()
    steps = 1_000 if args.quick else args.steps
    root = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="stepscope-bench-report-"))
    try:
        if not (root / "training_job_end.ts").exists():
            print(f"generated {steps} steps with profiler data in {generate(root, steps):.1f} s")
        started = time.perf_counter()
        with contextlib.redirect_stdout(io.StringIO()):
            stepscope_cli(["check", str(root), "--quiet"])
        print(f"stepscope check (default rules + profiler rules, not part of the report): {time.perf_counter() - started:.1f} s")

        from stepscope.report import build, write_report

        timings: dict[str, float] = {}
        original = build._guarded

        def timed(builder, ctx):
            section_started = time.perf_counter()
            try:
                return original(builder, ctx)
            finally:
                timings[builder.__module__.rsplit(".", 1)[-1]] = time.perf_counter() - section_started

        build._guarded = timed
        out = root.parent / f"{root.name}-report.html"
        started = time.perf_counter()
        written = write_report(str(root), str(out), rules="saved")
        seconds = time.perf_counter() - started
        build._guarded = original
        print(f"report: {seconds:.2f} s for {steps} steps (target <= {TARGET_S:.0f} s: {'met' if seconds <= TARGET_S else 'MISSED'}); "
              f"{os.path.getsize(written.html) / 1e6:.2f} MB of HTML")
        for name, section_s in timings.items():
            print(f"    {name:<8s} {section_s:6.2f} s")
        os.remove(out)

        from stepscope.export import export_hdf5, export_tensorboard

        with tempfile.TemporaryDirectory() as tmp:
            started = time.perf_counter()
            tb = export_tensorboard(str(root), os.path.join(tmp, "tb"))
            tb_s = time.perf_counter() - started
            started = time.perf_counter()
            h5 = export_hdf5(str(root), os.path.join(tmp, "job.h5"))
            h5_s = time.perf_counter() - started
            size = os.path.getsize(os.path.join(tmp, "job.h5"))
        print(f"export --tensorboard: {tb_s:.2f} s ({tb.scalars} scalars, {tb.histograms} histograms, {1e6 * tb_s / steps:.0f} us/step)")
        print(f"export --hdf5:        {h5_s:.2f} s ({h5.rows} rows, {size / 1e6:.1f} MB, {1e6 * h5_s / steps:.0f} us/step)")
    finally:
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
