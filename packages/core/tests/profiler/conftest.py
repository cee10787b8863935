"""Shared fixtures for the profiler tests: synthetic SageMaker-layout metric jobs, and a fake
NVML that replaces only the pynvml module's functions."""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Callable, Iterable
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from stepscope.modes import ModeKeys
from stepscope.profiler import TimelineWriter

T0 = 1_700_000_000.0  # 2023-11-14 22:13:20 UTC

Values = "float | Callable[[np.ndarray], np.ndarray]"


def write_system_metrics(root: Path, rows: Iterable[tuple[float, str, str, str, str, float]], legacy_flat: bool = False) -> list[Path]:
    """Write (timestamp, node, type, name, dimension, value) rows as SageMaker files, one per
    node per minute; `legacy_flat` leaves out the hour folder as older jobs did."""
    files: dict[tuple[int, str], list[str]] = defaultdict(list)
    for timestamp, node, type_, name, dimension, value in rows:
        files[int(timestamp // 60) * 60, node].append(
            f'{{"Type": "{type_}", "Name": "{name}", "Dimension": "{dimension}", "Value": {value!r}, "NodeId": "{node}", "Timestamp": {timestamp!r}}}'
        )
    paths = []
    for (minute, node), lines in files.items():
        folder = root / "profiler-output/system/incremental"
        if not legacy_flat:
            folder = folder / time.strftime("%Y%m%d%H", time.gmtime(minute))
        folder.mkdir(parents=True, exist_ok=True)
        paths.append(folder / f"{minute}.{node}.json")
        paths[-1].write_text("\n".join(lines) + "\n")
    return sorted(paths)


def _values(spec: float | Callable[[np.ndarray], np.ndarray], index: np.ndarray, rng: np.random.Generator, noise: float) -> np.ndarray:
    if callable(spec):
        return np.asarray(spec(index), dtype=float)
    return np.clip(spec + rng.uniform(-noise, noise, len(index)), 0, 100)


def synthetic_job(
    root: Path,
    *,
    nodes: tuple[str, ...] = ("algo-1",),
    samples: int = 1300,
    interval_s: float = 0.5,
    start: float = T0,
    cores: int = 2,
    cpu: Values = 50.0,
    iowait: Values = 2.0,
    gpus: tuple[Values, ...] = (85.0, 85.0),
    gpu_memory: tuple[Values, ...] = (40.0, 40.0),
    children: int | None = 2,
    legacy_flat: bool = False,
    seed: int = 0,
) -> Path:
    """A job's system metrics: healthy by default (busy GPUs, moderate CPU, flat GPU memory,
    one dataloader process per core); each argument plants a condition."""
    rng = np.random.default_rng(seed)
    index = np.arange(samples)
    timestamps = start + index * interval_s
    rows = []
    for node in nodes:
        cpu_values = _values(cpu, index, rng, 5)
        io_values = _values(iowait, index, rng, 1)
        gpu_values = [_values(spec, index, rng, 5) for spec in gpus]
        memory_values = [_values(spec, index, rng, 0.2) for spec in gpu_memory]
        for i, ts in enumerate(timestamps):
            ts = round(float(ts), 6)
            for core in range(cores):
                rows.append((ts, node, "cpu", f"cpu{core}", "CPUUtilization", float(cpu_values[i])))
                rows.append((ts, node, "cpu", f"cpu{core}", "I/OWaitPercentage", float(io_values[i])))
            rows.append((ts, node, "memory", "system", "MemoryUsedPercent", 30.0))
            for g, (util, memory) in enumerate(zip(gpu_values, memory_values)):
                rows.append((ts, node, "gpu", f"gpu{g}", "GPUUtilization", float(util[i])))
                rows.append((ts, node, "gpu", f"gpu{g}", "GPUMemoryUtilization", float(memory[i])))
            if children is not None and i % 20 == 0:
                rows.append((ts, node, "process", "main", "ChildProcessCount", float(children)))
    write_system_metrics(root, rows, legacy_flat=legacy_flat)
    return root


def synthetic_steps(
    root: Path,
    *,
    first_step_at: float = T0 + 30,
    steps: int = 40,
    step_s: float = 0.1,
    slow_steps: dict[int, float] | None = None,
    node_id: str = "algo-1",
    rank: int = 0,
    seed: int = 0,
) -> None:
    """A TRAIN step timeline with data/forward/backward phases, durations within ±2 %, the
    given steps taking `slow_steps[step]` seconds instead."""
    rng = np.random.default_rng(seed)
    writer = TimelineWriter(root, node_id=node_id, rank=rank, framework="pytorch", flush_interval_s=3600)
    t = int(first_step_at * 1e9)
    for step in range(steps):
        duration = (slow_steps or {}).get(step, step_s * rng.uniform(0.98, 1.02))
        end = t + int(duration * 1e9)
        quarter = (end - t) // 4
        writer.add("data", t, t + quarter, step=step, mode=ModeKeys.TRAIN, phase="data")
        writer.add("forward", t + quarter, t + 2 * quarter, step=step, mode=ModeKeys.TRAIN, phase="forward")
        writer.add("backward", t + 2 * quarter, end, step=step, mode=ModeKeys.TRAIN, phase="backward")
        writer.add(f"Step {step}", t, end, step=step, mode=ModeKeys.TRAIN, phase="step")
        t = end + 1000
    writer.close()


@pytest.fixture
def fake_nvml(monkeypatch: pytest.MonkeyPatch) -> SimpleNamespace:
    """A two-GPU host behind the real pynvml module: only its functions are replaced.
    `state` holds the values the fake reports and counts the calls."""
    pynvml = pytest.importorskip("pynvml")
    state = SimpleNamespace(
        utilization=[75, 20],
        memory_bandwidth=[30, 5],
        memory_used=[8 * 2**30, 2 * 2**30],
        memory_total=[16 * 2**30, 16 * 2**30],
        power_mw=[250_000, 90_000],
        temperature=[70, 45],
        sm_clock=[1410, 1200],
        memory_clock=[1215, 1215],
        unsupported=set(),  # {(index, "power")} raises NVML_ERROR_NOT_SUPPORTED
        calls=defaultdict(int),
        initialised=False,
    )

    def counted(name: str, fn: Callable) -> Callable:
        def wrapper(*args):
            state.calls[name] += 1
            return fn(*args)

        return wrapper

    def device(handle: object) -> int:
        assert isinstance(handle, SimpleNamespace), "a handle from nvmlDeviceGetHandleByIndex"
        return handle.index

    def check(index: int, what: str) -> None:
        if (index, what) in state.unsupported:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)

    def init() -> None:
        state.initialised = True

    def shutdown() -> None:
        state.initialised = False

    def power(handle):
        check(device(handle), "power")
        return state.power_mw[device(handle)]

    def clock(handle, kind):
        index = device(handle)
        check(index, "clock")
        return state.sm_clock[index] if kind == pynvml.NVML_CLOCK_SM else state.memory_clock[index]

    def memory(handle, version=None):
        index = device(handle)
        used, total = state.memory_used[index], state.memory_total[index]
        return SimpleNamespace(total=total, used=used, free=total - used)

    functions = {
        "nvmlInit": init,
        "nvmlShutdown": shutdown,
        "nvmlDeviceGetCount": lambda: 2,
        "nvmlDeviceGetHandleByIndex": lambda index: SimpleNamespace(index=index),
        "nvmlDeviceGetUtilizationRates": lambda h: SimpleNamespace(gpu=state.utilization[device(h)], memory=state.memory_bandwidth[device(h)]),
        "nvmlDeviceGetMemoryInfo": memory,
        "nvmlDeviceGetPowerUsage": power,
        "nvmlDeviceGetTemperature": lambda h, sensor: state.temperature[device(h)],
        "nvmlDeviceGetClockInfo": clock,
    }
    for name, fn in functions.items():
        monkeypatch.setattr(pynvml, name, counted(name, fn))
    return state


# Helpers as fixtures: with --import-mode=importlib a test module cannot import conftest.


@pytest.fixture
def metric_files() -> Callable[..., list[Path]]:
    return write_system_metrics


@pytest.fixture
def metrics_job() -> Callable[..., Path]:
    return synthetic_job


@pytest.fixture
def step_timeline_job() -> Callable[..., None]:
    return synthetic_steps
