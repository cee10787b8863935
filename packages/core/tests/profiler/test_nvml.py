"""GPU sampling against a fake NVML at the pynvml function boundary (a two-GPU host)."""

from __future__ import annotations

import sys
import time

import pytest

from stepscope.capture.nvml import NvmlSampler
from stepscope.profiler import ProfilerTrial, SystemMonitor


def _by_key(samples):
    return {(name, dimension): value for name, dimension, value in samples}


def test_two_gpus_every_metric(fake_nvml):
    sampler = NvmlSampler.open()
    assert sampler is not None and sampler.device_count == 2 and fake_nvml.initialised
    values = _by_key(sampler.sample())
    assert values[("gpu0", "GPUUtilization")] == 75
    assert values[("gpu1", "GPUUtilization")] == 20
    assert values[("gpu0", "GPUMemoryBandwidthUtilization")] == 30
    assert values[("gpu0", "GPUMemoryUtilization")] == pytest.approx(50.0)  # 8 of 16 GiB
    assert values[("gpu1", "GPUMemoryUtilization")] == pytest.approx(12.5)
    assert values[("gpu0", "GPUMemoryUsedBytes")] == 8 * 2**30
    assert values[("gpu1", "GPUMemoryTotalBytes")] == 16 * 2**30
    assert values[("gpu0", "GPUPowerWatts")] == pytest.approx(250.0)  # from milliwatts
    assert values[("gpu1", "GPUTemperatureCelsius")] == 45
    assert values[("gpu0", "GPUSMClockMHz")] == 1410
    assert values[("gpu1", "GPUMemoryClockMHz")] == 1215
    assert len(values) == 2 * 9
    sampler.close()
    assert not fake_nvml.initialised


def test_an_unsupported_metric_is_dropped_for_that_gpu_only(fake_nvml):
    fake_nvml.unsupported.add((1, "power"))
    sampler = NvmlSampler.open()
    first = _by_key(sampler.sample())
    second = _by_key(sampler.sample())
    for values in (first, second):
        assert ("gpu1", "GPUPowerWatts") not in values
        assert ("gpu0", "GPUPowerWatts") in values
        assert ("gpu1", "GPUUtilization") in values
    # Asked once per GPU in the first sample, then only for the GPU that supports it.
    assert fake_nvml.calls["nvmlDeviceGetPowerUsage"] == 3


def test_no_driver_means_no_gpu_metrics(fake_nvml, monkeypatch):
    import pynvml

    def no_library():
        raise pynvml.NVMLError(pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)

    monkeypatch.setattr(pynvml, "nvmlInit", no_library)
    assert NvmlSampler.open() is None


def test_no_pynvml_means_no_gpu_metrics(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import pynvml now raises ImportError
    assert NvmlSampler.open() is None


def test_monitor_writes_gpu_lines(tmp_path, fake_nvml):
    with SystemMonitor(tmp_path, interval_ms=100, node_id="algo-1") as monitor:
        time.sleep(0.45)
    assert not fake_nvml.initialised  # shut down when the monitor stopped
    df = ProfilerTrial(tmp_path).system_metrics(names=["gpu0", "gpu1"])
    assert set(df["type"]) == {"gpu"}
    utilization = df[df["dimension"] == "GPUUtilization"]
    assert len(utilization) == 2 * monitor.stats().samples
    assert sorted(utilization.groupby("name", observed=True)["value"].first().tolist()) == [20, 75]
