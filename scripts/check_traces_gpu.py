"""Check detailed profiling end to end on a machine with a CUDA GPU: train a small CNN with
profiling windows (torch.profiler through stepscope's windows) and run every analysis of
the trace engine on the real Kineto traces. Prints the tables and one line per check;
exits 1 when a check fails, 2 when there is no GPU.

    python scripts/check_traces_gpu.py                    # temporary job folders
    python scripts/check_traces_gpu.py --out /tmp/gpujob --steps 10
    python scripts/check_traces_gpu.py --cpu              # the script's own smoke run on the CPU (GPU checks skipped)

Scenarios and what they check on the real traces:

1. A window with the default warm-up (1 step) and one without: the trace holds exactly the
   window's steps (the warm-up step's work is not in it), the file is named after the
   first recorded step, no `cudaDeviceSynchronize` is in the trace (the loop makes none and
   the window must add none), every kernel is joined with its launch, H2D copies with
   their bytes (pinned batches copied inside the window), the temporal breakdown adds up,
   kernel time in every step, kernels attributed to the `loss-and-backward` annotation, the
   window's cost file (training thread and publisher seconds), and the first profiled
   step's duration with and without warm-up side by side (CUPTI's start-up lands in the
   warm-up).
2. A job with a known gap: each step sleeps `GAP_MS` on the host between its forward and
   backward launches, so the GPU idles at least that long per step, waiting for the host:
   the idle breakdown's host wait per step and the temporal breakdown's idle time must
   cover it.
3. The merged timeline: every flow has both ends.
4. HTA 0.5 (when installed) on each trace, point by point (stepscope.testing.hta_agreement):
   agrees, or differs only where HTA's documented bugs explain it.
5. A user's own traces: a folder written by torch.profiler.tensorboard_trace_handler opens
   with stepscope.traces.open and has its kernels."""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
GAP_MS = 20.0
BATCH = 32


class Checks:
    def __init__(self, gpu: bool):
        self.gpu = gpu
        self.failures: list[str] = []

    def __call__(self, ok: bool, what: str, gpu_only: bool = False) -> None:
        if gpu_only and not self.gpu:
            print(f"skip {what} (no GPU)")
            return
        print(("ok   " if ok else "FAIL ") + what)
        if not ok:
            self.failures.append(what)


def _train(out: Path, steps: int, device: str, *, window: tuple[int, int], warmup: int, gap_ms: float = 0.0) -> list[str]:
    import torch
    from torch import nn

    import stepscope
    from stepscope.config import ProfilerConfig
    from stepscope.store import open_store
    from stepscope_torch.profiling import create_profiling

    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(), nn.AdaptiveAvgPool2d(4), nn.Flatten(), nn.Linear(256, 10)).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    data, labels = torch.randn(steps * BATCH, 3, 32, 32), torch.randint(0, 10, (steps * BATCH,))
    if device == "cuda":
        data, labels = data.pin_memory(), labels.pin_memory()
    config = ProfilerConfig(detailed_windows=[window], warmup_steps=warmup, python_window=(1, 1))
    profiling = create_profiling(config, open_store(str(out)), rank=0, world_size=1)
    assert profiling is not None
    for step in range(steps):
        profiling.step_started(step)
        x = data[step * BATCH : (step + 1) * BATCH].to(device, non_blocking=True)
        y = labels[step * BATCH : (step + 1) * BATCH].to(device, non_blocking=True)
        with stepscope.annotate("loss-and-backward"):
            loss = nn.functional.cross_entropy(model(x), y)
            if gap_ms:
                time.sleep(gap_ms / 1000)  # the host is late: the GPU has nothing queued
            loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        loss.item()  # a D2H copy and a stream sync, as real loops have
        profiling.step_ended(step)
    profiling.close()
    return profiling.published


def _agreement_module():  # type: ignore[no-untyped-def]
    from stepscope.testing import hta_agreement

    return hta_agreement


def _windows(base: Path, steps: int, device: str, check: Checks) -> list[Path]:
    """Scenario 1: with and without warm-up."""
    import pandas as pd

    from stepscope.traces import TraceAnalysis

    window = (3, steps - 5)
    expected = list(range(window[0], window[0] + window[1]))
    first_step_us = {}
    traces = []
    for warmup in (1, 0):
        out = base / f"warmup{warmup}"
        published = _train(out, steps, device, window=window, warmup=warmup)
        print(f"\n### window {window}, warm-up {warmup}: published", *published, sep="\n  ")
        detailed = [k for k in published if "/detailed/" in k]
        check(len(detailed) == 1 and detailed[0].rsplit("/", 1)[1].startswith(f"{window[0]:012d}_pid"), f"[warm-up {warmup}] one trace, named after step {window[0]}")
        traces += [out / k for k in detailed]
        analysis = TraceAnalysis(out)
        for name, frame in analysis.summary().items():
            print(f"\n== {name}\n{frame.to_string(index=False) if not frame.empty else '(none)'}")
        steps_table = analysis.step_breakdown(rank=0)
        recorded = [int(s) for s in steps_table.step if s >= 0]
        check(recorded == expected, f"[warm-up {warmup}] the trace holds the window's steps {expected} (got {recorded})")
        first_step_us[warmup] = float(steps_table[steps_table.step == window[0]].step_us.iloc[0]) if window[0] in recorded else float("nan")
        events = analysis.events(rank=0)
        host = events[~events.kind.isin([0, 1, 2, 7, 10, 11])]  # host work (not GPU records, not Kineto's own `Trace` span)
        check(bool((host.ts_ns >= host[host.name.astype(str) == f"ProfilerStep#{window[0]}"].ts_ns.min()).all()) if len(host) else False,
              f"[warm-up {warmup}] nothing of the warm-up step in the trace")
        device_syncs = int((events.name.astype(str) == "cudaDeviceSynchronize").sum())
        check(device_syncs == 0, f"[warm-up {warmup}] no cudaDeviceSynchronize in the window ({device_syncs})", gpu_only=True)
        gpu = events[events.kind == 0]
        launches = analysis.launches(rank=0)
        check(len(gpu) > 0 and len(launches[launches.kind == 0]) == len(gpu), f"[warm-up {warmup}] every kernel joined with its launch ({len(gpu)} kernels)", gpu_only=True)
        memory = analysis.memory_ops(rank=0)
        h2d = memory[memory.direction == "H2D"] if len(memory) else memory
        check(len(h2d) > 0 and int(h2d["bytes"].sum()) >= BATCH * 3 * 32 * 32 * 4, f"[warm-up {warmup}] H2D copies with their bytes", gpu_only=True)
        breakdown = analysis.temporal_breakdown(rank=0)
        check(len(breakdown) == 1 and abs(breakdown.iloc[0].idle_us + breakdown.iloc[0].compute_us + breakdown.iloc[0].non_compute_us - breakdown.iloc[0].span_us) < 1.0,
              f"[warm-up {warmup}] temporal breakdown adds up", gpu_only=True)
        real = steps_table[steps_table.step >= 0]
        check(len(real) > 0 and bool((real.kernel_us > 0).all()), f"[warm-up {warmup}] kernel time in every profiled step", gpu_only=True)
        by_annotation = analysis.kernel_stats(by="annotation", rank=0)
        check("loss-and-backward" in set(by_annotation.get("annotation", pd.Series(dtype=str))), f"[warm-up {warmup}] kernels attributed to the annotation", gpu_only=True)
        early = analysis.events(rank=0, kinds=["kernel", "memcpy", "memset"])
        print(f"[warm-up {warmup}] GPU work launched before the window: {int((early.step == -2).sum())} activities")
        costs = list((out / "stepscope-cost/profiler-windows").glob("detailed-profiler_*.json"))
        windows = json.loads(costs[0].read_text())["windows"] if costs else []
        check(len(windows) == 1 and windows[0]["warmup_steps"] == warmup and windows[0]["bytes"] > 0, f"[warm-up {warmup}] the window's cost file")
        if windows:
            w = windows[0]
            print(f"[warm-up {warmup}] window cost: training thread {w['training_thread_s'] * 1e3:.1f} ms (start {w['start_s'] * 1e3:.1f}, steps {w['steps_s'] * 1e3:.1f}, "
                  f"stop {w['stop_s'] * 1e3:.1f}), publisher {w['publish_s'] * 1e3:.1f} ms, {w['bytes']:,} bytes")
    print(f"first profiled step: {first_step_us.get(1, float('nan')):,.0f} µs with warm-up, {first_step_us.get(0, float('nan')):,.0f} µs without")
    return traces


def _known_gap(base: Path, steps: int, device: str, check: Checks) -> list[Path]:
    """Scenario 2: a host gap of GAP_MS per step shows as host-wait idle time."""
    from stepscope.traces import TraceAnalysis

    out = base / "gap"
    window = (2, steps - 3)
    published = _train(out, steps, device, window=window, warmup=1, gap_ms=GAP_MS)
    analysis = TraceAnalysis(out)
    per_step = analysis.idle_breakdown(rank=0, per_step=True)
    print(f"\n== idle per stream and step (a {GAP_MS:.0f} ms host gap per step)\n{per_step.to_string(index=False) if len(per_step) else '(none)'}")
    host_wait = per_step[per_step.step >= 0].groupby("step").host_wait_us.sum() if len(per_step) else None
    check(host_wait is not None and len(host_wait) == window[1] and bool((host_wait >= 0.9 * GAP_MS * 1000).all()),
          f"host wait >= {0.9 * GAP_MS:.0f} ms in every profiled step", gpu_only=True)
    temporal = analysis.temporal_breakdown(rank=0, per_step=True)
    real = temporal[temporal.step >= 0] if len(temporal) else temporal
    check(len(real) == window[1] and bool((real.idle_us >= 0.9 * GAP_MS * 1000).all()), f"temporal idle >= {0.9 * GAP_MS:.0f} ms in every profiled step", gpu_only=True)
    return [out / k for k in published if "/detailed/" in k]


def _timeline(base: Path, check: Checks) -> None:
    from stepscope.export.perfetto import write_timeline

    out = base / "warmup1"
    target = out / "timeline.json"
    counts = write_timeline(out, target)
    flows: dict[int, set[str]] = {}
    for event in json.loads(target.read_text())["traceEvents"]:
        if event["ph"] in ("s", "f"):
            flows.setdefault(event["id"], set()).add(event["ph"])
    check(counts["flows"] > 0 and all(v == {"s", "f"} for v in flows.values()), f"timeline flows have both ends ({counts})", gpu_only=True)


def _hta(traces: list[Path], check: Checks) -> None:
    try:
        import hta.trace_analysis  # noqa: F401
    except ImportError:
        print("HTA not installed: cross-check skipped")
        return
    agreement = _agreement_module()
    for path in traces:
        result = agreement.compare(path)
        print(f"HTA: {path.name}: {result.status}, {len(result.points)} points ({result.count('agrees')} agree, {result.count('explained')} explained, "
              f"{result.count('differs')} differ) {result.error}")
        for point in result.differing()[:10]:
            print(f"    {point}")
        check(result.status in ("agrees", "explained") or (not result.points and not check.gpu), f"HTA agrees or its bugs explain it: {path.parent.name}/{path.name}")


def _user_traces(base: Path, device: str, check: Checks) -> None:
    import torch
    from torch.profiler import ProfilerActivity, profile, schedule, tensorboard_trace_handler

    import stepscope.traces

    folder = base / "tensorboard"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
    model = torch.nn.Linear(256, 256).to(device)
    with profile(activities=activities, schedule=schedule(wait=1, warmup=1, active=2), on_trace_ready=tensorboard_trace_handler(str(folder))) as prof:
        for _ in range(5):
            model(torch.randn(64, 256, device=device)).sum().backward()
            prof.step()
    analysis = stepscope.traces.open(str(folder))
    check(len(analysis.trace_keys()) == 1 and analysis.ranks == [0], "a tensorboard_trace_handler folder opens")
    kernels = analysis.kernel_stats(rank=0)
    check(len(kernels) > 0, f"its kernels ({len(kernels)} names)", gpu_only=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default=None, help="folder for the jobs (default: a temporary folder)")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--cpu", action="store_true", help="run on the CPU: checks the script itself; the GPU checks are skipped")
    args = parser.parse_args()
    try:
        import torch
    except ImportError:
        print("torch is not installed")
        return 2
    if not args.cpu and not torch.cuda.is_available():
        print("no CUDA GPU: nothing to check (--cpu runs the script's own smoke test)")
        return 2
    if args.steps < 7:
        parser.error("--steps must be at least 7 (a warm-up, a window of two steps, steps around it)")
    import pandas as pd

    pd.set_option("display.width", 200)
    pd.set_option("display.max_columns", 20)
    pd.set_option("display.max_colwidth", 60)
    device = "cpu" if args.cpu else "cuda"
    base = Path(args.out or tempfile.mkdtemp(prefix="stepscope-gpu-traces-"))
    check = Checks(gpu=device == "cuda")
    traces = _windows(base, args.steps, device, check)
    traces += _known_gap(base, args.steps, device, check)
    _timeline(base, check)
    _hta(traces, check)
    _user_traces(base, device, check)
    print(f"\njobs in: {base}\n" + (f"{len(check.failures)} check(s) failed: " + "; ".join(check.failures) if check.failures else "all checks passed"))
    return 1 if check.failures else 0


if __name__ == "__main__":
    sys.exit(main())
