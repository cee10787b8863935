"""SystemMonitor: configuration, real sampling on this host, rotation, publishing, failure."""

from __future__ import annotations

import contextlib
import logging
import threading
import time
import types

import numpy as np
import psutil
import pytest

from stepscope.capture.monitor import (
    _HostSampler,
    _LineFormatter,
    _MinuteBuffer,
    default_node_id,
    parse_system_metrics_key,
    system_metrics_key,
)
from stepscope.exceptions import ConfigError
from stepscope.profiler import ProfilerTrial, SystemMonitor
from stepscope.store import LocalStore


@pytest.mark.parametrize("interval", [100, 200, 500, 1000, 5000, 60000, "500"])
def test_accepts_the_sagemaker_intervals(tmp_path, interval):
    assert SystemMonitor(tmp_path, interval_ms=interval).interval_ms == int(interval)


@pytest.mark.parametrize("interval", [0, 250, 499, -500, 1.5, True, "fast"])
def test_other_intervals_are_config_errors_naming_the_value(tmp_path, interval):
    with pytest.raises(ConfigError, match="interval_ms") as info:
        SystemMonitor(tmp_path, interval_ms=interval)
    assert repr(interval) in str(info.value)


def test_node_id_must_be_safe_for_a_file_name(tmp_path):
    with pytest.raises(ConfigError, match="node_id"):
        SystemMonitor(tmp_path, node_id="a/b")


def test_default_node_id(monkeypatch):
    monkeypatch.setenv("SM_CURRENT_HOST", "algo-3")
    assert default_node_id() == "algo-3"
    assert default_node_id(rank=5) == "algo-3-rank5"
    monkeypatch.delenv("SM_CURRENT_HOST")
    assert default_node_id()


def test_one_monitor_per_node():
    assert SystemMonitor.should_run(rank=0, local_rank=0)
    assert SystemMonitor.should_run(rank=8, local_rank=0)
    assert not SystemMonitor.should_run(rank=3, local_rank=3)
    assert SystemMonitor.should_run(rank=3, local_rank=3, every_rank=True)
    assert SystemMonitor.should_run(rank=None, local_rank=None)


def test_keys_follow_the_sagemaker_layout():
    key = system_metrics_key(1591748100, "algo-1")
    assert key == "profiler-output/system/incremental/2020061000/1591748100.algo-1.json"
    assert parse_system_metrics_key(key) == (1591748100, "algo-1")
    assert parse_system_metrics_key("profiler-output/system/incremental/1591748100.ip-10-0-0-1.ec2.json") == (1591748100, "ip-10-0-0-1.ec2")
    assert parse_system_metrics_key("profiler-output/system/incremental/2020060100/notes.txt") is None


def _burn_cpu(seconds: float) -> float:
    """Spin for `seconds` of wall time; returns the CPU time it got."""
    cpu = time.thread_time()
    end = time.perf_counter() + seconds
    x = 0
    while time.perf_counter() < end:
        x += 1
    return time.thread_time() - cpu


@pytest.mark.serial  # counts the sampler's missed ticks: another test busy on the other core would cause them
def test_real_sampling_on_this_host(tmp_path):
    interval_s = 0.1
    monitor = SystemMonitor(tmp_path, interval_ms=100, node_id="algo-1")
    monitor.start()
    began = time.time()
    assert monitor.running
    time.sleep(1.0)
    burned = _burn_cpu(0.6)  # the process must show up as busy
    time.sleep(0.4)
    ended = time.time()
    monitor.stop()
    assert not monitor.running

    df = ProfilerTrial(tmp_path).system_metrics()
    timestamps = np.sort(df["timestamp"].unique())
    expected = (ended - began) / interval_s
    # One slot may be lost at each end: the first sample waits for the next grid slot after
    # start-up, and stop() may land just before the last one. A stall longer than a slot (a
    # loaded CI machine) skips ticks, and the monitor counts them: every slot is accounted for.
    missed = monitor.stats().missed_ticks
    assert abs(len(timestamps) + missed - expected) <= 2, (len(timestamps), missed, expected)
    assert missed <= expected / 4, (missed, expected)
    assert monitor.stats().samples == len(timestamps)
    assert (np.diff(timestamps) > 0).all()
    # Deadline-based: each sample sits in its own slot of the wall-clock grid of multiples of
    # the interval, just after the slot's start, with no drift accumulating. (A loaded
    # machine can wake one sample late; the median stays small.)
    slots = np.floor(timestamps / interval_s)
    lateness = timestamps - slots * interval_s
    assert (np.diff(slots) >= 1).all(), lateness
    assert np.median(lateness) < 0.04, lateness  # a loaded 2-core machine wakes late at times
    assert np.median(lateness[len(lateness) // 2 :]) < 0.04, lateness

    def values(dimension, name=None):
        rows = df[df["dimension"] == dimension]
        if name is not None:
            rows = rows[rows["name"] == name]
        return rows["value"].to_numpy()

    assert set(df["node_id"]) == {"algo-1"}
    cores = {n for n in df[df["dimension"] == "CPUUtilization"]["name"] if n != "total"}
    assert cores == {f"cpu{i}" for i in range(psutil.cpu_count())}
    for percent in ("CPUUtilization", "I/OWaitPercentage", "MemoryUsedPercent"):
        assert ((values(percent) >= 0) & (values(percent) <= 100)).all(), percent
    assert values("CPUUtilization", "total").max() > 0
    # Integrated over the samples, the process's CPU % accounts for the burn (to within
    # the kernel's 10 ms accounting tick). Each sample's % is over the time since the one
    # before it, which is longer than the interval after skipped ticks.
    process = df[df["dimension"] == "ProcessCPUUtilization"].sort_values("timestamp")
    since_previous = np.diff(process["timestamp"].to_numpy(), prepend=process["timestamp"].iloc[0] - interval_s)
    process_cpu_s = float((process["value"].to_numpy() / 100 * since_previous).sum())
    assert process_cpu_s >= 0.8 * burned - 0.02, (process_cpu_s, burned)
    assert (values("ProcessCPUUtilization") <= 100 * psutil.cpu_count() + 1).all()
    assert (values("MemoryUsedBytes") <= values("MemoryTotalBytes")).all()
    assert (values("ProcessMemoryRSSBytes") > 0).all()
    for rate in ("DiskReadBytesPerSecond", "DiskWriteBytesPerSecond", "NetworkReceiveBytesPerSecond", "NetworkTransmitBytesPerSecond"):
        if len(values(rate)):  # a container may expose no disk counters
            assert (values(rate) >= 0).all() and np.isfinite(values(rate)).all(), rate
    assert len(values("NetworkReceiveBytesPerSecond")) == len(timestamps)
    assert len(values("ChildProcessCount")) >= 1


def test_stop_publishes_the_open_minute_and_is_idempotent(tmp_path):
    monitor = SystemMonitor(tmp_path, interval_ms=100, node_id="algo-1")
    monitor.start()
    time.sleep(0.35)
    monitor.stop()
    monitor.stop()
    monitor.start()  # after stop: nothing happens
    assert not monitor.running
    keys = LocalStore(tmp_path).list("profiler-output/system/incremental/")
    assert keys and all(parse_system_metrics_key(k)[1] == "algo-1" for k in keys)
    assert all(k.split("/")[3].isdigit() and len(k.split("/")[3]) == 10 for k in keys)  # hour folder
    assert monitor.stats().files_published == len(keys)


def test_a_monitor_stopped_before_its_first_tick_has_one_sample(tmp_path):
    # A job shorter than the start-up and the first interval still gets its reading.
    monitor = SystemMonitor(tmp_path, interval_ms=60000, node_id="algo-1")
    monitor.start()
    monitor.stop()
    assert monitor.stats().samples == 1
    df = ProfilerTrial(tmp_path).system_metrics()
    assert df["timestamp"].nunique() == 1 and set(df["dimension"]) >= {"CPUUtilization", "MemoryUsedPercent"}


def test_a_first_tick_just_after_start_up_waits_for_the_cpu_counters(tmp_path):
    # Started 2 ms before a slot of the grid: a reading then would divide a 10 ms counter tick
    # by 2 ms (CI saw ProcessCPUUtilization 1184 % on 2 cores). It waits 25 ms after priming.
    while time.time() % 0.1 < 0.098:
        time.sleep(0.0005)
    started = time.time()
    monitor = SystemMonitor(tmp_path, interval_ms=100, node_id="algo-1")
    monitor.start()
    time.sleep(0.3)  # (a busy loop here would hold the GIL and delay the thread's start-up)
    monitor.stop()
    df = ProfilerTrial(tmp_path).system_metrics()
    first = df["timestamp"].min()
    assert first - started >= 0.025, first - started
    shares = df[df["dimension"] == "ProcessCPUUtilization"]["value"].to_numpy()
    assert len(shares) >= 1 and (shares <= 100 * psutil.cpu_count()).all(), shares


def test_a_process_share_over_a_short_interval_is_bounded_by_the_cores():
    class Process:  # psutil.Process at its boundary: one 10 ms counter tick between readings
        cpu = 0.0

        def oneshot(self):
            return contextlib.nullcontext()

        def cpu_times(self):
            Process.cpu += 0.01
            return types.SimpleNamespace(user=Process.cpu, system=0.0)

        def memory_info(self):
            return types.SimpleNamespace(rss=1)

        def children(self, recursive):
            return []

    sampler = _HostSampler(0.1, lambda key, message: None)
    sampler._process = Process()
    sampler._process_metrics(0.0, prime=True)
    share = dict((m[2], m[3]) for m in sampler._process_metrics(0.001))["ProcessCPUUtilization"]
    assert share == 100 * psutil.cpu_count()  # not 1000 %
    share = dict((m[2], m[3]) for m in sampler._process_metrics(0.1))["ProcessCPUUtilization"]
    assert share == pytest.approx(10.0)


def test_sampling_thread_is_a_daemon(tmp_path):
    with SystemMonitor(tmp_path, interval_ms=100) as monitor:
        threads = [t for t in threading.enumerate() if t.name == "stepscope-system-monitor"]
        assert threads and all(t.daemon for t in threads)
    assert not monitor.running


def test_restart_within_a_minute_keeps_both_parts(tmp_path):
    first = SystemMonitor(tmp_path, interval_ms=100, node_id="n1")
    with first:
        time.sleep(0.3)
    second = SystemMonitor(tmp_path, interval_ms=100, node_id="n1")
    with second:
        time.sleep(0.3)
    df = ProfilerTrial(tmp_path).system_metrics()
    assert df["timestamp"].nunique() == first.stats().samples + second.stats().samples


def test_minute_rotation():
    buffer = _MinuteBuffer()
    formatter = _LineFormatter("algo-1")
    published = []
    for ts in np.arange(1_700_000_030.0, 1_700_000_170.0, 10.0):
        done = buffer.add(ts, formatter.format(ts, [("cpu", "total", "CPUUtilization", 12.5)]))
        if done:
            published.append(done)
    published.append(buffer.drain())
    assert [minute for minute, _ in published] == [1_699_999_980, 1_700_000_040, 1_700_000_100, 1_700_000_160]
    assert [data.count(b"\n") for _, data in published] == [1, 6, 6, 1]
    assert buffer.drain() is None


def test_lines_are_sagemaker_json():
    import json

    line = _LineFormatter("algo-1").format(1.5, [("gpu", "gpu0", "GPUUtilization", 87.0), ("memory", "system", "MemoryUsedBytes", 123456789012.0), ("cpu", "cpu0", "CPUUtilization", float("nan"))])
    records = [json.loads(x) for x in line.splitlines()]
    assert records == [
        {"Type": "gpu", "Name": "gpu0", "Dimension": "GPUUtilization", "Value": 87, "NodeId": "algo-1", "Timestamp": 1.5},
        {"Type": "memory", "Name": "system", "Dimension": "MemoryUsedBytes", "Value": 123456789012, "NodeId": "algo-1", "Timestamp": 1.5},
    ]
    assert list(records[0]) == ["Type", "Name", "Dimension", "Value", "NodeId", "Timestamp"]


class _BrokenStore(LocalStore):
    def write(self, key, data):
        raise OSError("disk full")


def test_a_failing_store_never_reaches_training(tmp_path, caplog):
    monitor = SystemMonitor(_BrokenStore(tmp_path), interval_ms=100)
    with caplog.at_level(logging.WARNING, logger="stepscope.profiler"):
        monitor.start()
        time.sleep(0.25)
        monitor.stop()  # must not raise
    assert monitor.stats().publish_errors >= 1
    warnings = [r for r in caplog.records if "could not publish" in r.getMessage()]
    assert len(warnings) == 1 and "disk full" in warnings[0].getMessage()


def test_a_failing_source_is_dropped_alone(tmp_path, monkeypatch, caplog):
    def broken(*args, **kwargs):
        raise OSError("no /proc/diskstats")

    monkeypatch.setattr(psutil, "disk_io_counters", broken)
    with caplog.at_level(logging.WARNING, logger="stepscope.profiler"):
        with SystemMonitor(tmp_path, interval_ms=100):
            time.sleep(0.35)
    df = ProfilerTrial(tmp_path).system_metrics()
    assert "DiskReadBytesPerSecond" not in set(df["dimension"])
    assert "CPUUtilization" in set(df["dimension"])
    assert sum("disk metrics unavailable" in r.getMessage() for r in caplog.records) == 1


def test_sampling_in_a_process_of_its_own(tmp_path):
    """What the hooks use: samples taken in a sampler process, reporting this process's
    CPU and memory; flush publishes the open minute at once; stop brings the statistics."""
    import os
    import subprocess
    import sys

    # A child of this process, as a data loader's worker is: counted; the sampler is not
    # (it counted itself, so a loop without workers read one).
    worker = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    monitor = SystemMonitor(tmp_path, interval_ms=100, node_id="algo-1", process=True)
    monitor.start()
    assert monitor.in_own_process and monitor.running
    deadline = time.monotonic() + 30
    rows = 0
    while rows == 0 and time.monotonic() < deadline:  # the child's start-up, on a loaded machine
        time.sleep(0.3)
        monitor.flush()
        rows = len(ProfilerTrial(tmp_path).system_metrics())
    assert rows > 0  # published before the minute ended
    time.sleep(0.3)
    others = [c for c in psutil.Process().children(recursive=True) if c.pid != worker.pid and "sampler_main" not in " ".join(c.cmdline())]
    monitor.stop()
    worker.kill()
    worker.wait()
    assert not monitor.running
    df = ProfilerTrial(tmp_path).system_metrics()
    children = df[df["dimension"] == "ChildProcessCount"]["value"]
    assert len(children) and (children == 1 + len(others)).all(), (children.tolist(), others)
    stats = monitor.stats()
    # Jitter: one value per sample after the first, less those due during the start-up.
    assert stats.samples == df["timestamp"].nunique() >= 2 and 0 < len(stats.jitter_s) <= stats.samples - 1
    rss = df[df["dimension"] == "ProcessMemoryRSSBytes"]["value"]
    mine = psutil.Process(os.getpid()).memory_info().rss
    assert len(rss) and abs(float(rss.iloc[-1]) - mine) < 0.5 * mine  # this process, not the sampler's
