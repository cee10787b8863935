"""Check the system monitor against real NVML on a GPU machine: run it for a few seconds,
read the files back, print the GPU samples. Exits 1 when no GPU is seen.

    pip install -e 'packages/core[gpu]'
    python scripts/check_nvml_gpu.py                      # 5 s at 500 ms
    python scripts/check_nvml_gpu.py --seconds 10 --interval 100 --load

With --load, a matrix multiply loop (torch, if installed) keeps GPU 0 busy, so that
utilization, power and clocks should visibly rise."""

from __future__ import annotations

import argparse
import sys
import tempfile
import threading
import time

from stepscope.capture.nvml import NvmlSampler
from stepscope.profiler import ProfilerTrial, SystemMonitor


def _gpu_load(stop: threading.Event) -> None:
    try:
        import torch
    except ImportError:
        print("--load: torch not installed; no load")
        return
    a = torch.randn(8192, 8192, device="cuda")
    while not stop.is_set():
        (a @ a).sum().item()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--interval", type=int, default=500, help="ms, one of the monitor's intervals")
    parser.add_argument("--out", default=None, help="keep the files here (default: a temporary folder)")
    parser.add_argument("--load", action="store_true", help="keep GPU 0 busy while sampling (needs torch)")
    args = parser.parse_args()

    sampler = NvmlSampler.open()
    if sampler is None:
        print("NVML found no GPU (is nvidia-ml-py installed and the driver loaded?)")
        return 1
    names = []
    for handle in sampler.handles:
        name = sampler.nvml.nvmlDeviceGetName(handle)
        names.append(name.decode() if isinstance(name, bytes) else str(name))
    print(f"NVML: {sampler.device_count} GPU(s): {', '.join(names)}")
    started = time.perf_counter()
    direct = sampler.sample()
    print(f"one direct sample: {len(direct)} values in {1000 * (time.perf_counter() - started):.2f} ms")
    sampler.close()

    out_dir = args.out or tempfile.mkdtemp(prefix="stepscope-nvml-")
    stop = threading.Event()
    loader = threading.Thread(target=_gpu_load, args=(stop,), daemon=True) if args.load else None
    if loader:
        loader.start()
    monitor = SystemMonitor(out_dir, interval_ms=args.interval, node_id="gpu-check")
    monitor.start()
    time.sleep(args.seconds)
    monitor.stop()
    stop.set()

    stats = monitor.stats()
    print(
        f"monitor: {stats.samples} samples in {args.seconds:g} s at {args.interval} ms; "
        f"{1000 * stats.sampling_cpu_s / max(1, stats.samples):.2f} ms CPU per sample; "
        f"jitter p99 {stats.jitter_ms(99):.2f} ms; files in {out_dir}"
    )
    gpu = ProfilerTrial(out_dir).system_metrics()
    gpu = gpu[gpu["type"] == "gpu"]
    if gpu.empty:
        print("no GPU lines were written")
        return 1
    gpu = gpu.assign(time=gpu["timestamp"].map(lambda t: time.strftime("%H:%M:%S", time.gmtime(t)) + f"{t % 1:.3f}"[1:]))
    table = gpu.pivot_table(index=["time", "name"], columns="dimension", values="value", observed=True)
    with_units = {
        "GPUUtilization": "util %", "GPUMemoryUtilization": "mem %", "GPUMemoryBandwidthUtilization": "membw %",
        "GPUMemoryUsedBytes": "used GiB", "GPUPowerWatts": "W", "GPUTemperatureCelsius": "C",
        "GPUSMClockMHz": "SM MHz", "GPUMemoryClockMHz": "mem MHz",
    }
    table = table[[c for c in with_units if c in table.columns]].rename(columns=with_units)
    if "used GiB" in table:
        table["used GiB"] = table["used GiB"] / 2**30
    print(table.round(2).to_string())
    expected = {"GPUUtilization", "GPUMemoryUtilization", "GPUMemoryUsedBytes", "GPUMemoryTotalBytes"}
    missing = expected - set(gpu["dimension"])
    if missing:
        print(f"missing dimensions: {sorted(missing)}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
