"""What a detailed-profiling window's export costs the training thread, in the window's
last step: the step that stops the profiler. The export of the trace (Kineto JSON), the
gzip and the write run on the background publisher; the training thread stops Kineto
(which it must: Kineto hands its events over there) and queues the rest. Measured side by
side in one run, windows alternating, on a CPU torch loop whose window writes a trace of
about `--mb` MB (default 50):

- `no export`: the last step when the window's files are dropped (the stop alone);
- `publisher`: the last step as stepscope runs it (export etc. on the publisher);
- `on thread`: the last step with export, gzip and write on the training thread (the
  path before the publisher).

Also printed: a step without profiler, a profiled step, and the two steps after the window
(which share the CPU with the publisher).

    python bench/bench_windows.py            # a ~50 MB trace, 3 windows of each kind
    python bench/bench_windows.py --mb 10 --repeat 1

Goal (issue 19): the last step with the publisher within 5 % of the last step without export."""

from __future__ import annotations

import argparse
import gzip
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

from stepscope.config import ProfilerConfig
from stepscope.store import open_store
from stepscope_torch import profiling as torch_profiling

BYTES_PER_OP = 2200  # Kineto JSON per tiny op with shapes (its cpu_op and children), measured with torch 2.13


def _step(x: torch.Tensor, ops: int) -> torch.Tensor:
    for _ in range(ops):
        x = torch.add(x, 1.0)
    return x


def _run(out: Path, ops: int, window: int, mode: str) -> dict[str, list[float]]:
    config = ProfilerConfig(detailed_windows=[(4, window)], warmup_steps=1, profile_memory=False)
    profiling = torch_profiling.create_profiling(config, open_store(str(out)))
    assert profiling is not None
    scheduler = profiling.schedulers[0]
    publisher = scheduler.publisher
    if mode == "on thread":  # the path before the publisher: export, gzip and write on this thread

        def submit(files, payloads, cost):  # type: ignore[no-untyped-def]
            for (key, _), payload in zip(files, payloads):
                data = payload() if callable(payload) else payload
                scheduler.store.write(key, data)
                publisher.published.append(key)

        publisher.submit = submit  # type: ignore[method-assign]
    elif mode == "no export":
        publisher.submit = lambda files, payloads, cost: None  # type: ignore[method-assign]
    x = torch.zeros(8)
    times: dict[str, list[float]] = {"plain": [], "profiled": [], "last": [], "after": []}
    last = 4 + window - 1
    for step in range(last + 3):
        started = time.perf_counter()
        profiling.step_started(step)
        x = _step(x, ops)
        profiling.step_ended(step)
        elapsed = time.perf_counter() - started
        if step < 2:
            times["plain"].append(elapsed)
        elif 4 <= step < last:
            times["profiled"].append(elapsed)
        elif step == last:
            times["last"].append(elapsed)
        elif step > last:
            times["after"].append(elapsed)
    profiling.close()
    return times


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mb", type=float, default=50.0, help="trace size to aim at (MB of JSON)")
    parser.add_argument("--window", type=int, default=5, help="profiled steps")
    parser.add_argument("--repeat", type=int, default=3, help="windows of each kind (alternating)")
    args = parser.parse_args()
    ops = max(100, int(args.mb * 1e6 / BYTES_PER_OP / args.window))
    modes = ("no export", "publisher", "on thread")
    runs: dict[str, dict[str, list[float]]] = {m: {"plain": [], "profiled": [], "last": [], "after": []} for m in modes}
    size = 0
    with tempfile.TemporaryDirectory(prefix="stepscope-bench-windows-") as folder:
        for round_ in range(args.repeat):
            for mode in modes:
                out = Path(folder) / f"{mode.replace(' ', '-')}-{round_}"
                for name, values in _run(out, ops, args.window, mode).items():
                    runs[mode][name] += values
                traces = sorted(out.rglob("*.pt.trace.json.gz"))
                if traces and not size:
                    size = len(gzip.decompress(traces[0].read_bytes()))
    print(f"{ops} ops per step, window of {args.window} steps, trace {size / 1e6:.1f} MB of JSON, {args.repeat} windows of each kind")
    median = {m: {k: statistics.median(v) if v else float("nan") for k, v in runs[m].items()} for m in modes}
    print(f"step without profiler       {median['publisher']['plain'] * 1e3:9.1f} ms")
    print(f"profiled step               {median['publisher']['profiled'] * 1e3:9.1f} ms")
    base = median["no export"]["last"]
    for mode in modes:
        last = median[mode]["last"]
        print(f"last step, {mode:10s}       {last * 1e3:9.1f} ms  ({100 * (last / base - 1):+6.1f} % vs no export; each: "
              f"{', '.join(f'{v * 1e3:.0f}' for v in runs[mode]['last'])} ms); the 2 steps after: {median[mode]['after'] * 1e3:.1f} ms")
    goal = median["publisher"]["last"] <= 1.05 * base
    print(f"goal (last step with the publisher within 5 % of the last step without export): {'met' if goal else 'not met'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
