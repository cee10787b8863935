"""The system monitor's sampler process: `SystemMonitor(process=True)` samples here, so
that a training thread holding the GIL cannot delay a sample.

The parent starts `python -m stepscope.capture.sampler_main` with the job's store URL,
the interval, the node id and its own pid (whose CPU and memory are reported). The pipe
to the child's stdin is the control channel: a line "flush" publishes the open minute
(the child answers "flushed"), and end of input (the parent stopped the monitor, or died)
stops the child, which then prints its statistics as one JSON line. This module is the
parent's side only; the child's is `sampler_main` (so neither imports the other's module
at run time, and the monitor, which starts a sampler, is not imported back from here)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from typing import Any

from ..store import Store


class SamplerProcess:
    """The parent's handle on a running sampler process."""

    def __init__(self, popen: subprocess.Popen[str], stats: Any):
        self._popen = popen
        self._stats = stats
        self._lock = threading.Lock()

    @classmethod
    def start(cls, store: Store, config: Any, stats: Any) -> SamplerProcess:
        url = store.reopenable_url()
        if not url:
            raise RuntimeError(f"store {store!r} has no URL a sampler process could open")
        env = dict(os.environ)
        # The child imports stepscope from wherever this process did (sys.path included).
        env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
        command = [
            sys.executable, "-m", "stepscope.capture.sampler_main",
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
