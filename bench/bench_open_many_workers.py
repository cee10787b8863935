"""Opening a 64-worker x 1,000-step job on the S3 protocol (moto's server on loopback,
in this process): the time `create_trial` takes, and the requests it makes, against the
goal of < 2 s. A process's first S3 client (botocore loading its models, ~0.5 s) is made
before timing. With --compare-index-files, also the per-step index files alone (no step
tables), side by side (slow: one GET per step and worker; use fewer --steps).
--quick: one open instead of the median of 3."""

from __future__ import annotations

import argparse
import logging
import os
import statistics
import time
import uuid

GOAL_S = 2.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--workers", type=int, default=64)
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--compare-index-files", action="store_true")
    args = parser.parse_args()
    logging.getLogger("werkzeug").disabled = True

    import boto3
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    os.environ.update({"AWS_ENDPOINT_URL_S3": f"http://{host}:{port}", "AWS_ACCESS_KEY_ID": "bench", "AWS_SECRET_ACCESS_KEY": "bench", "AWS_DEFAULT_REGION": "us-east-1"})

    from stepscope import create_trial
    from stepscope.store.s3 import S3Store
    from stepscope.testing.large_jobs import load_into_moto, many_worker_job

    job = many_worker_job(args.workers, args.steps)
    results = {}
    S3Store("s3://warm-up")  # botocore's models, loaded once per process
    configurations = [("with step tables", None)]
    if args.compare_index_files:
        configurations.append(("index files only", lambda key: key.startswith("stepscope-index/")))
    for label, skip in configurations:
        bucket = f"bench-{uuid.uuid4().hex[:10]}"
        boto3.client("s3").create_bucket(Bucket=bucket)
        load_into_moto(job, f"s3://{bucket}/job", skip=lambda key, skip=skip: key.startswith("events/") or (skip is not None and skip(key)))
        times = []
        for _ in range(1 if args.quick else 3):
            started = time.perf_counter()
            trial = create_trial(S3Store(f"s3://{bucket}/job"))
            times.append(time.perf_counter() - started)
            assert len(trial.steps()) == args.steps and len(trial.workers()) == args.workers
        results[label] = statistics.median(times)
    server.stop()
    print(f"open a {args.workers}-worker x {args.steps}-step job on S3 (moto, loopback):")
    for label, seconds in results.items():
        print(f"  {label:<18} {seconds:6.2f} s")
    if "index files only" in results:
        print(f"  step tables make opening {results['index files only'] / results['with step tables']:.1f}x faster")
    print(f"  goal < {GOAL_S:g} s: {'met' if results['with step tables'] < GOAL_S else 'NOT met'}")


if __name__ == "__main__":
    main()
