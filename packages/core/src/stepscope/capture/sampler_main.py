"""The sampler process's own side (`python -m stepscope.capture.sampler_main`, started by
`sampler_process.SamplerProcess`): a SystemMonitor sampling in this process, controlled
by lines on stdin ("flush"; end of input stops it), its statistics printed as one JSON
line at the end."""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from typing import IO, Any

from .deadline import close_timeout_from_env
from .monitor import SystemMonitor


def _serve(monitor: Any, commands: IO[str], replies: IO[str]) -> None:
    for line in commands:
        if line.strip() == "flush":
            monitor.flush()
            replies.write("flushed\n")
            replies.flush()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m stepscope.capture.sampler_main")
    parser.add_argument("--out", required=True)
    parser.add_argument("--interval-ms", type=int, required=True)
    parser.add_argument("--node-id", required=True)
    parser.add_argument("--pid", type=int, required=True)
    args = parser.parse_args(argv)
    # Ctrl-C in the training job's terminal reaches this process too: it stops when its
    # parent closes the pipe (or dies), so that the last samples are published.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    monitor = SystemMonitor(args.out, interval_ms=args.interval_ms, node_id=args.node_id, pid=args.pid)
    monitor.start()
    sys.stdout.write("started\n")
    sys.stdout.flush()
    started = time.monotonic()
    _serve(monitor, sys.stdin, sys.stdout)
    # Within the parent's close deadline (it may have exited at it, and this process then
    # holds nothing of it; it ends on its own soon after).
    monitor.stop(timeout_s=_stop_timeout_s())
    stats = monitor.stats()
    summary = {
        "samples": stats.samples, "missed_ticks": stats.missed_ticks, "files_published": stats.files_published,
        "publish_errors": stats.publish_errors, "sampling_cpu_s": stats.sampling_cpu_s,
        "publishing_cpu_s": stats.publishing_cpu_s, "jitter_s": list(stats.jitter_s)[-10_000:],
        "wall_s": time.monotonic() - started,
    }
    try:
        sys.stdout.write(json.dumps(summary) + "\n")
        sys.stdout.flush()
    except OSError:  # the parent is gone (it exited at its close deadline): no one to tell
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return 0


def _stop_timeout_s() -> float:
    try:
        return min(10.0, close_timeout_from_env())
    except Exception:  # noqa: BLE001 - the parent said what was wrong with it
        return 10.0


if __name__ == "__main__":
    sys.exit(main())
