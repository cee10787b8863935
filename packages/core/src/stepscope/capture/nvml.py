"""GPU sampling through NVML (the `pynvml` module of nvidia-ml-py), imported only when asked.

Every NVML call goes through the `pynvml` module's functions, looked up at call time, so a
test can replace exactly those functions and nothing of ours."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

logger = logging.getLogger("stepscope.profiler")

# (dimension, how to read it from a device handle); one entry per metric so that a metric a
# device does not support is dropped alone and the others keep flowing.
_GpuReader = Callable[[Any, Any], float]


def _utilization(nvml: Any, handle: Any) -> float:
    return float(nvml.nvmlDeviceGetUtilizationRates(handle).gpu)


def _bandwidth_utilization(nvml: Any, handle: Any) -> float:
    return float(nvml.nvmlDeviceGetUtilizationRates(handle).memory)


def _power_watts(nvml: Any, handle: Any) -> float:
    return nvml.nvmlDeviceGetPowerUsage(handle) / 1000.0  # NVML reports milliwatts


def _temperature(nvml: Any, handle: Any) -> float:
    return float(nvml.nvmlDeviceGetTemperature(handle, nvml.NVML_TEMPERATURE_GPU))


def _sm_clock(nvml: Any, handle: Any) -> float:
    return float(nvml.nvmlDeviceGetClockInfo(handle, nvml.NVML_CLOCK_SM))


def _memory_clock(nvml: Any, handle: Any) -> float:
    return float(nvml.nvmlDeviceGetClockInfo(handle, nvml.NVML_CLOCK_MEM))


_SCALAR_READERS: tuple[tuple[str, _GpuReader], ...] = (
    ("GPUUtilization", _utilization),
    ("GPUMemoryBandwidthUtilization", _bandwidth_utilization),
    ("GPUPowerWatts", _power_watts),
    ("GPUTemperatureCelsius", _temperature),
    ("GPUSMClockMHz", _sm_clock),
    ("GPUMemoryClockMHz", _memory_clock),
)
_MEMORY = "memory"  # memory info gives three dimensions from one call


def _import_pynvml() -> Any | None:
    try:
        import pynvml  # optional: the `gpu` extra (nvidia-ml-py)
    except ImportError:
        return None
    return pynvml


@dataclass
class NvmlSampler:
    """Reads every GPU of the host; `open()` returns None where there is no NVML or no GPU."""

    nvml: Any
    handles: list[Any]
    _disabled: set[tuple[int, str]] = field(default_factory=set)

    @classmethod
    def open(cls) -> NvmlSampler | None:
        nvml = _import_pynvml()
        if nvml is None:
            logger.debug("pynvml not installed; no GPU metrics (install stepscope[gpu])")
            return None
        try:
            nvml.nvmlInit()
        except Exception as exc:  # no driver, no library: a CPU-only host
            logger.debug("NVML unavailable (%s); no GPU metrics", exc)
            return None
        try:
            count = int(nvml.nvmlDeviceGetCount())
            handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
        except Exception as exc:
            logger.warning("NVML initialised but listing GPUs failed (%s); no GPU metrics", exc)
            _shutdown(nvml)
            return None
        if not handles:
            _shutdown(nvml)
            return None
        return cls(nvml=nvml, handles=handles)

    @property
    def device_count(self) -> int:
        return len(self.handles)

    def sample(self) -> list[tuple[str, str, float]]:
        """(name, dimension, value) for every GPU metric that can be read now."""
        out: list[tuple[str, str, float]] = []
        for index, handle in enumerate(self.handles):
            name = f"gpu{index}"
            for dimension, reader in _SCALAR_READERS:
                value = self._read(index, dimension, reader, handle)
                if value is not None:
                    out.append((name, dimension, value))
            memory = self._read(index, _MEMORY, lambda nvml, h: nvml.nvmlDeviceGetMemoryInfo(h), handle)
            if memory is not None and memory.total:
                # The SageMaker rules read GPUMemoryUtilization as the memory footprint, so it
                # is used/total here; NVML's own "memory utilization" (memory-controller busy
                # time) is GPUMemoryBandwidthUtilization.
                out.append((name, "GPUMemoryUtilization", 100.0 * memory.used / memory.total))
                out.append((name, "GPUMemoryUsedBytes", float(memory.used)))
                out.append((name, "GPUMemoryTotalBytes", float(memory.total)))
        return out

    def _read(self, index: int, dimension: str, reader: Callable[[Any, Any], Any], handle: Any) -> Any:
        if (index, dimension) in self._disabled:
            return None
        try:
            return reader(self.nvml, handle)
        except Exception as exc:
            # A metric that fails once (unsupported on this board, GPU lost) is dropped for
            # good: asking again every sample would only add cost and log noise.
            self._disabled.add((index, dimension))
            not_supported = getattr(exc, "value", None) == getattr(self.nvml, "NVML_ERROR_NOT_SUPPORTED", object())
            log = logger.debug if not_supported else logger.warning
            log("GPU %d: %s unavailable (%s); no longer sampled", index, dimension, exc)
            return None

    def close(self) -> None:
        _shutdown(self.nvml)


def _shutdown(nvml: Any) -> None:
    try:
        nvml.nvmlShutdown()
    except Exception:  # shutting down a half-initialised NVML is best effort
        pass
