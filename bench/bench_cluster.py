"""Cluster scale: a job of many simulated ranks (generated Kineto traces of 1-2 MB each,
distinct seeds and distributedInfo, one planted straggler whose kernels run slower),
analysed by `stepscope profile JOB --job-view --json` in a process of its own: the
per-rank summaries are built (one parse task per trace on local worker processes), then
DuckDB answers the cross-rank questions. Run twice: the second analysis reads only the
summaries.

    python bench/bench_cluster.py                       # 32 and 1,024 ranks
    python bench/bench_cluster.py --ranks 8,64 --keep DIR
    python bench/bench_cluster.py --s3                  # the same job on a local S3 server (moto), smaller by default

Goals (issue 25): the straggler named; peak memory <= 1 GB (the process and its workers
together) and growing no more than 1.5x from 32 to 1,024 ranks; the second analysis <= 10 %
of the first's time. Printed per size: wall seconds, peak RSS of the driving process, peak
summed RSS of it and its workers (sampled every 50 ms), the ranks named as stragglers, and
the load average at the start (the development machine is shared)."""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

from stepscope.traces.synth import SynthSpec, write_trace

DETAILED = "profiler-output/framework/pytorch/detailed"
GOAL_MB, GOAL_GROWTH, GOAL_AGAIN = 1024.0, 1.5, 0.10
STEPS, OPS_PER_STEP = 6, 250  # about 1.5 MB of JSON per trace
SLOW_FACTOR = 1.5


def _one(args: tuple[str, int, int, int]) -> None:
    root, rank, ranks, straggler = args
    spec = SynthSpec(steps=STEPS, ops_per_step=OPS_PER_STEP, seed=1000 + rank, rank=rank, world_size=ranks, slow_factor=SLOW_FACTOR if rank == straggler else 1.0)
    write_trace(spec, f"{root}/{DETAILED}/rank{rank}/window_000000.pt.trace.json")


def generate(root: Path, ranks: int, straggler: int) -> float:
    """Write the job's traces (in parallel); returns the MB written."""
    marker = root / f".generated-{ranks}-{straggler}"
    if not marker.exists():
        shutil.rmtree(root, ignore_errors=True)
        root.mkdir(parents=True)
        with multiprocessing.get_context("spawn").Pool(os.cpu_count() or 1) as pool:
            pool.map(_one, [(str(root), rank, ranks, straggler) for rank in range(ranks)], chunksize=8)
        marker.touch()
    return sum(p.stat().st_size for p in (root / DETAILED).rglob("*.json")) / 1e6


def run_profile(target: str, env: dict[str, str]) -> dict[str, object]:
    """`stepscope profile --job-view --json` in its own process; wall time and memory."""
    start = time.perf_counter()
    # Output to files, not pipes: a pipe left unread while the child writes more than its
    # buffer would block the child.
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        process = subprocess.Popen([sys.executable, "-m", "stepscope.cli", "profile", target, "--job-view", "--json"], stdout=out, stderr=err, env=env)
        watched = psutil.Process(process.pid)
        peak_total = peak_driver = 0
        while process.poll() is None:
            try:
                driver = watched.memory_info().rss
                total = driver + sum(child.memory_info().rss for child in watched.children(recursive=True))
            except psutil.Error:
                continue
            peak_total, peak_driver = max(peak_total, total), max(peak_driver, driver)
            time.sleep(0.05)
        seconds = time.perf_counter() - start
        out.seek(0)
        err.seek(0)
        text, errors = out.read(), err.read()
    if process.returncode != 0:
        raise SystemExit(f"stepscope profile failed ({process.returncode}): {errors.decode()[-2000:]}")
    tables = json.loads(text)
    return {
        "seconds": seconds,
        "driver_mb": peak_driver / 2**20,
        "total_mb": peak_total / 2**20,
        "stragglers": [(row["rank"], row["slow_steps"]) for row in tables["stragglers"]],
        "ranks": len(tables["ranks"]),
    }


def s3_job(root: Path, env: dict[str, str]) -> tuple[str, object]:
    """Copy the job's traces to a fresh bucket on a loopback moto server."""
    import logging

    import boto3
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # not a line per request

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    env.update({"AWS_ENDPOINT_URL_S3": f"http://{host}:{port}", "AWS_ACCESS_KEY_ID": "bench", "AWS_SECRET_ACCESS_KEY": "bench", "AWS_DEFAULT_REGION": "us-east-1"})
    os.environ.update(env)
    client = boto3.client("s3")
    client.create_bucket(Bucket="bench")
    for path in sorted((root / DETAILED).rglob("*.json")):
        client.upload_file(str(path), "bench", f"job/{path.relative_to(root)}")
    return "s3://bench/job", server


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranks", default="32,1024", help="comma-separated job sizes (default 32,1024)")
    parser.add_argument("--keep", type=Path, default=None, metavar="DIR", help="generate the jobs in DIR and keep them (reused when there)")
    parser.add_argument("--s3", action="store_true", help="also run each job from a local S3 server")
    args = parser.parse_args()
    sizes = [int(s) for s in args.ranks.split(",")]
    base = args.keep or Path(tempfile.mkdtemp(prefix="bench_cluster_"))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    results = {}
    try:
        for ranks in sizes:
            straggler = ranks * 2 // 3
            root = base / f"job{ranks}"
            generated = time.perf_counter()
            megabytes = generate(root, ranks, straggler)
            generated = time.perf_counter() - generated
            for folder in ("stepscope-traces", "stepscope-summaries"):
                shutil.rmtree(root / folder, ignore_errors=True)
            load = os.getloadavg()[0]
            first = run_profile(str(root), env)
            second = run_profile(str(root), env)
            results[ranks] = (first, second)
            print(f"{ranks} ranks, {megabytes:,.0f} MB of traces ({megabytes / ranks:.2f} MB each; generated in {generated:.0f} s), straggler rank {straggler}, load {load:.1f}")
            for label, run in (("first (parse + summarise + query)", first), ("second (from the summaries)", second)):
                found = run["stragglers"]
                named = "named first" if found and found[0] == (straggler, STEPS) else "NOT named first"
                others = found[1:]
                print(f"  {label:36s} {run['seconds']:7.2f} s  driver {run['driver_mb']:6.0f} MB  with workers {run['total_mb']:6.0f} MB  "
                      f"(goal {GOAL_MB:.0f} MB: {run['total_mb'] / GOAL_MB:.2f}x)  straggler {found[:1]} (rank, slow steps) {named}; "
                      f"{len(others)} other ranks with a slow step (at most {max((n for _, n in others), default=0)} of {STEPS})")
            print(f"  second / first: {second['seconds'] / first['seconds']:.3f} (goal <= {GOAL_AGAIN})")
            if args.s3:
                target, server = s3_job(root, env)
                try:
                    remote = run_profile(target, env)
                    again = run_profile(target, env)
                finally:
                    server.stop()
                print(f"  S3 first {remote['seconds']:7.2f} s, {remote['total_mb']:6.0f} MB, straggler {remote['stragglers'][:1]}; second {again['seconds']:.2f} s")
        if len(sizes) > 1:
            small, large = results[min(sizes)][0], results[max(sizes)][0]
            print(f"memory growth {min(sizes)} -> {max(sizes)} ranks: driver {large['driver_mb'] / small['driver_mb']:.2f}x, "
                  f"with workers {large['total_mb'] / small['total_mb']:.2f}x (goal <= {GOAL_GROWTH})")
    finally:
        if args.keep is None:
            shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
