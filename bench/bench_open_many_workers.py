"""Opening a 64-worker x 1,000-step job on the S3 protocol: the time `create_trial` takes
against the goal of < 2 s. The S3 test server (moto) runs in a process of its own, as S3
would be elsewhere, holding the job (worker 0 written by the real Writer, the other
workers copies of it; event files left out: opening never reads them). A process's first
S3 client (botocore loading its models, ~0.5 s) is made before timing. It prints the
median's ratio to the goal, the CPU time reader and server spend, and the S3 requests one
open and one refresh with nothing new make, by operation and folder (counted on the
client).
--quick: one open instead of the median of 3."""

from __future__ import annotations

import argparse
import logging
import multiprocessing
import os
import statistics
import time
from collections import Counter

import psutil

GOAL_S = 2.0


def _serve(ready, workers: int, steps: int) -> None:
    logging.getLogger("werkzeug").disabled = True
    os.environ.update({"AWS_ACCESS_KEY_ID": "bench", "AWS_SECRET_ACCESS_KEY": "bench", "AWS_DEFAULT_REGION": "us-east-1"})
    from moto.backends import get_backend
    from moto.core import DEFAULT_ACCOUNT_ID
    from moto.server import ThreadedMotoServer

    from stepscope.testing.large_jobs import load_into_moto, many_worker_job

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    get_backend("s3")[DEFAULT_ACCOUNT_ID]["global"].create_bucket("bench-bucket", "us-east-1")
    load_into_moto(many_worker_job(workers, steps), "s3://bench-bucket/job", skip=lambda key: key.startswith("events/"))
    ready.put(f"http://{host}:{port}")
    time.sleep(3600)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--workers", type=int, default=64)
    parser.add_argument("--steps", type=int, default=1000)
    args = parser.parse_args()

    ready: multiprocessing.Queue = multiprocessing.Queue()
    server = multiprocessing.Process(target=_serve, args=(ready, args.workers, args.steps), daemon=True)
    server.start()
    try:
        endpoint = ready.get(timeout=600)
        os.environ.update({"AWS_ENDPOINT_URL_S3": endpoint, "AWS_ACCESS_KEY_ID": "bench", "AWS_SECRET_ACCESS_KEY": "bench", "AWS_DEFAULT_REGION": "us-east-1"})
        from stepscope import create_trial
        from stepscope.store.s3 import S3Store

        S3Store("s3://warm-up")  # botocore's models, loaded once per process
        times, reader_cpu, server_cpu = [], [], []
        server_process = psutil.Process(server.pid)
        for _ in range(1 if args.quick else 3):
            store = S3Store("s3://bench-bucket/job")
            requests = _count_requests(store)
            cpu_started, server_started = time.process_time(), sum(server_process.cpu_times()[:2])
            started = time.perf_counter()
            trial = create_trial(store)
            times.append(time.perf_counter() - started)
            reader_cpu.append(time.process_time() - cpu_started)
            server_cpu.append(sum(server_process.cpu_times()[:2]) - server_started)
            assert len(trial.steps()) == args.steps and len(trial.workers()) == args.workers
        opening = Counter(requests)
        requests.clear()
        assert trial.refresh() == []
        refreshing = Counter(requests)
    finally:
        server.terminate()
    median = statistics.median(times)
    print(f"open a {args.workers}-worker x {args.steps}-step job on S3 (moto in its own process, loopback):")
    print(f"  create_trial: {median:.2f} s (runs: {', '.join(f'{t:.2f}' for t in times)}); goal < {GOAL_S:g} s: ratio {median / GOAL_S:.2f}, {'met' if median < GOAL_S else 'NOT met'}")
    # Wall time depends on what else runs (the reader and the server share the CPUs); the
    # CPU seconds each side spends do much less.
    print(f"  CPU per open (median): reader {statistics.median(reader_cpu):.2f} s, S3 server {statistics.median(server_cpu):.2f} s; load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
    for what, counts in (("open", opening), ("refresh with nothing new", refreshing)):
        print(f"  S3 requests per {what}: {sum(counts.values())} ({', '.join(f'{kind} {n}' for kind, n in sorted(counts.items()))})")


def _count_requests(store) -> Counter:
    """Requests `store`'s client makes from now on, as "<operation> <job folder>"."""
    counts: Counter = Counter()
    prefix = f"{store.prefix}/" if store.prefix else ""

    def count(params, model, **_):
        key = params.get("Key") or params.get("Prefix") or ""
        counts[f"{model.name} {key[len(prefix):].split('/')[0] or '/'}"] += 1

    store._client.meta.events.register("before-parameter-build.s3", count)
    return counts


if __name__ == "__main__":
    main()
