"""The system monitor's sampler process: `SystemMonitor(process=True)` samples here, so
that a training thread holding the GIL cannot delay a sample.

The parent starts `python -m stepscope.profiler.sampler_process` with the job's store URL,
the interval, the node id and its own pid (whose CPU and memory are reported). The pipe
to the child's stdin is the control channel: a line "flush" publishes the open minute
(the child answers "flushed"), and end of input (the parent stopped the monitor, or died)
stops the child, which then prints its statistics as one JSON line."""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import threading
import time
from typing import IO, Any

from ..store import Store


class SamplerProcess:
    """The parent's handle on a running sampler process."""

    def __init__(self, popen: subprocess.Popen[str], stats: Any):
        self._popen = popen
        self._stats = stats
        self._lock = threading.Lock()

    @classmethod
    def start(cls, store: Store, config: Any, stats: Any) -> SamplerProcess:
        url = getattr(store, "url", None)
        if not isinstance(url, str) or not url:
            raise RuntimeError(f"store {store!r} has no URL a sampler process could open")
        env = dict(os.environ)
        # The child imports stepscope from wherever this process did (sys.path included).
        env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
        command = [
            sys.executable, "-m", "stepscope.profiler.sampler_process",
            "--out", url, "--interval-ms", str(config.interval_ms), "--node-id", config.node_id, "--pid", str(os.getpid()),
        ]
        popen = subprocess.Popen(
            command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=None, text=True, env=env, bufsize=1,
        )
        # Not waiting for its "started": the child's imports must not delay the training
        # process (it samples on its own schedule from its first tick anyway).
        return cls(popen, stats)

    @property
    def running(self) -> bool:
        return self._popen.poll() is None

    def flush(self, timeout_s: float) -> None:
        with self._lock:
            if not self._send("flush"):
                return
            self._read_until(lambda line: line == "flushed", timeout_s)

    def stop(self, timeout_s: float) -> None:
        with self._lock:
            try:
                if self._popen.stdin is not None:
                    self._popen.stdin.close()  # end of input: the child stops
            except OSError:
                pass
            line = self._read_until(lambda line: line.startswith("{"), timeout_s)
            try:
                self._popen.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self._kill()
        if line and line.startswith("{"):
            _copy_stats(json.loads(line), self._stats)

    def _send(self, line: str) -> bool:
        try:
            assert self._popen.stdin is not None
            self._popen.stdin.write(line + "\n")
            self._popen.stdin.flush()
            return True
        except (OSError, ValueError):
            return False

    def _read_until(self, wanted: Any, timeout_s: float) -> str | None:
        deadline = time.monotonic() + timeout_s
        while True:
            line = self._read_line(max(0.0, deadline - time.monotonic()))
            if line is None or wanted(line):
                return line

    def _read_line(self, timeout_s: float) -> str | None:
        """The child's next line, or None after `timeout_s` (read on a helper thread: a
        pipe has no read timeout)."""
        out: list[str] = []
        stdout = self._popen.stdout
        if stdout is None:
            return None
        reader = threading.Thread(target=lambda: out.append(stdout.readline()), daemon=True)
        reader.start()
        reader.join(timeout_s)
        if not out:
            return None
        if not out[0]:  # end of output: the child is gone
            return None
        return out[0].strip()

    def _kill(self) -> None:
        try:
            self._popen.kill()
            self._popen.wait(5)
        except Exception:  # noqa: BLE001 - best effort
            pass


def _copy_stats(data: dict[str, Any], stats: Any) -> None:
    for name in ("samples", "missed_ticks", "files_published", "publish_errors"):
        setattr(stats, name, int(data.get(name, 0)))
    for name in ("sampling_cpu_s", "publishing_cpu_s"):
        setattr(stats, name, float(data.get(name, 0.0)))
    stats.jitter_s.extend(float(v) for v in data.get("jitter_s", ()))


def _serve(monitor: Any, commands: IO[str], replies: IO[str]) -> None:
    for line in commands:
        if line.strip() == "flush":
            monitor.flush()
            replies.write("flushed\n")
            replies.flush()


def main(argv: list[str] | None = None) -> int:
    from .monitor import SystemMonitor

    parser = argparse.ArgumentParser(prog="python -m stepscope.profiler.sampler_process")
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
    from ..deadline import close_timeout_from_env

    try:
        return min(10.0, close_timeout_from_env())
    except Exception:  # noqa: BLE001 - the parent said what was wrong with it
        return 10.0


if __name__ == "__main__":
    sys.exit(main())
