"""Trace engine: a generated Kineto GPU trace (about 500 MB, 2.5 M events, ground truth
known) loaded and analysed (kernel statistics, launch latency, temporal and idle
breakdown) by stepscope and by Holistic Trace Analysis, side by side, each in its own
process so that peak RSS is its own. Then stepscope again from the persisted Parquet
tables. Goals: stepscope <= 5 s and <= 600 MB; from Parquet <= 1 s.

    python bench/bench_traces.py            # the full trace (HTA needs ~3 GB and a minute)
    python bench/bench_traces.py --quick    # a ~25 MB trace
    python bench/bench_traces.py --no-hta   # stepscope only"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

from stepscope.traces.synth import SynthSpec, write_trace

DETAILED = "profiler-output/framework/pytorch/detailed/rank0"

OURS = textwrap.dedent(
    """
    import json, resource, sys, time
    start = time.perf_counter()
    from stepscope.traces import TraceAnalysis
    analysis = TraceAnalysis(sys.argv[1])
    kernels = analysis.kernel_stats(rank=0)
    latency = analysis.launch_latency(rank=0)
    breakdown = analysis.temporal_breakdown(rank=0)
    idle = analysis.idle_breakdown(rank=0)
    seconds = time.perf_counter() - start
    usage = resource.getrusage(resource.RUSAGE_SELF)
    print(json.dumps({"seconds": seconds, "cpu_s": usage.ru_utime + usage.ru_stime, "rss_mb": usage.ru_maxrss / 1024,
                      "kernel_total_us": float(kernels.total_us.sum()), "launches": int(latency.launches.sum()),
                      "idle_us": float(breakdown.idle_us.iloc[0]), "streams": len(idle)}))
    """
)

HTA = textwrap.dedent(
    """
    import json, logging, resource, sys, time, warnings
    warnings.simplefilter("ignore")
    logging.disable(logging.WARNING)
    start = time.perf_counter()
    from hta.trace_analysis import TraceAnalysis
    analysis = TraceAnalysis(trace_dir=sys.argv[1])
    loaded = time.perf_counter() - start
    kernels = analysis.get_gpu_kernel_breakdown(visualize=False)
    launch = analysis.get_cuda_kernel_launch_stats(visualize=False)
    breakdown = analysis.get_temporal_breakdown(visualize=False)
    seconds = time.perf_counter() - start
    usage = resource.getrusage(resource.RUSAGE_SELF)
    print(json.dumps({"seconds": seconds, "load_seconds": loaded, "cpu_s": usage.ru_utime + usage.ru_stime, "rss_mb": usage.ru_maxrss / 1024,
                      "idle_us": float(breakdown["idle_time(us)"].iloc[0])}))
    """
)


def _run(script: str, path: Path, timeout: float) -> dict:
    reply = subprocess.run([sys.executable, "-c", script, str(path)], capture_output=True, text=True, timeout=timeout)
    if reply.returncode != 0:
        raise RuntimeError(reply.stderr[-2000:])
    return json.loads(reply.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="a ~25 MB trace")
    parser.add_argument("--no-hta", action="store_true")
    parser.add_argument("--keep", default=None, help="generate into (and reuse) this folder")
    args = parser.parse_args()
    steps, ops = (50, 500) if args.quick else (1000, 500)  # 5 trace events per op
    root = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="stepscope-bench-traces-"))
    job = root / f"job-{steps}x{ops}"
    trace = job / DETAILED / "window_000000.pt.trace.json"
    try:
        truth_file = job / "truth.json"
        if not trace.exists():
            start = time.perf_counter()
            truth = write_trace(SynthSpec(steps=steps, ops_per_step=ops, streams=(7, 20, 24)), trace)
            truth_file.write_text(json.dumps({"idle_ns": truth.gpu_idle_ns, "kernel_ns": sum(k["total_ns"] for k in truth.kernels.values())}))
            print(f"traces: generated {trace.stat().st_size / 1e6:.0f} MB in {time.perf_counter() - start:.1f} s")
        shutil.rmtree(job / "stepscope-traces", ignore_errors=True)
        truth = json.loads(truth_file.read_text())
        size_mb = trace.stat().st_size / 1e6
        print(f"traces: {size_mb:.0f} MB Kineto JSON, {steps * ops * 5 / 1e6:.2f} M events")
        timeout = 600
        ours = _run(OURS, job, timeout)
        again = _run(OURS, job, timeout)
        assert abs(ours["idle_us"] * 1000 - truth["idle_ns"]) < 1, (ours, truth)
        assert abs(ours["kernel_total_us"] * 1000 - truth["kernel_ns"]) < 1, (ours, truth)
        # CPU seconds beside wall seconds: on a shared machine the wall time measures the neighbours.
        print(f"  stepscope, parse + persist + analyse: {ours['seconds']:.2f} s wall, {ours['cpu_s']:.2f} s CPU, peak RSS {ours['rss_mb']:.0f} MB (goal <= 5 s, <= 600 MB)")
        print(f"  stepscope, from Parquet + analyse:    {again['seconds']:.2f} s wall, {again['cpu_s']:.2f} s CPU, peak RSS {again['rss_mb']:.0f} MB (goal <= 1 s)")
        if not args.no_hta:
            # HTA reads every *.json / *.gz in the folder: hand it the trace's folder only.
            hta = _run(HTA, trace.parent, 1800)
            print(f"  HTA 0.5, load + analyse:              {hta['seconds']:.2f} s wall (load {hta['load_seconds']:.2f} s), {hta['cpu_s']:.2f} s CPU, peak RSS {hta['rss_mb']:.0f} MB")
            print(f"  ratios HTA / stepscope: wall {hta['seconds'] / ours['seconds']:.1f}x, CPU {hta['cpu_s'] / ours['cpu_s']:.1f}x, memory {hta['rss_mb'] / ours['rss_mb']:.1f}x; "
                  f"from Parquet: wall {hta['seconds'] / again['seconds']:.1f}x, CPU {hta['cpu_s'] / again['cpu_s']:.1f}x")
            print(f"  idle time: stepscope {ours['idle_us']:.1f} us, HTA {hta['idle_us']:.1f} us, truth {truth['idle_ns'] / 1000:.1f} us")
    finally:
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
