"""What recording allocator events (`ProfilerConfig(profile_memory=True)`, the default of
stepscope's torch windows) costs a profiled step, against the same window without it.
Measured side by side in one run, windows alternating, on CPU torch training:

- `mlp`: an MLP (1024-2048-2048-10, batch 256, Adam): a realistic step (tens of ops, each
  with an output to allocate);
- `small ops`: 400 tiny elementwise ops a step (each allocates its output): the worst
  case, where per-op bookkeeping is most of the step.

Printed per workload: the median recorded step in a window with and without
profile_memory, their ratio, and a step without any profiler.

    python bench/bench_profile_memory.py                 # 5 windows of each kind, 6 recorded steps each
    python bench/bench_profile_memory.py --repeat 2

Goal (issue 26): a window's steps with profile_memory within 10 % of the window without it."""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch

from stepscope.config import ProfilerConfig
from stepscope.store import open_store
from stepscope_torch import profiling as torch_profiling


def _mlp() -> Callable[[], None]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(1024, 2048), torch.nn.ReLU(), torch.nn.Linear(2048, 2048), torch.nn.ReLU(), torch.nn.Linear(2048, 10))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    x, y = torch.randn(256, 1024), torch.randint(0, 10, (256,))

    def step() -> None:
        loss = torch.nn.functional.cross_entropy(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()

    return step


def _small_ops() -> Callable[[], None]:
    x = torch.randn(64)

    def step() -> None:
        y = x
        for _ in range(400):
            y = y * 1.0001 + 0.5
        float(y.sum())

    return step


def _window(out: Path, step: Callable[[], None], profile_memory: bool, recorded: int) -> list[float]:
    """Seconds of each recorded step of one window (after its warm-up step)."""
    config = ProfilerConfig(detailed_windows=[(2, recorded + 1)], warmup_steps=1, profile_memory=profile_memory)
    profiling = torch_profiling.create_profiling(config, open_store(str(out)))
    assert profiling is not None
    times = []
    for number in range(recorded + 4):
        profiling.step_started(number)
        start = time.perf_counter()
        step()
        elapsed = time.perf_counter() - start
        profiling.step_ended(number)
        if 3 <= number < 3 + recorded:  # inside the window, after its warm-up step
            times.append(elapsed)
    profiling.close()
    return times


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=5, help="windows of each kind (alternating)")
    parser.add_argument("--steps", type=int, default=6, help="recorded steps per window")
    args = parser.parse_args()
    torch.set_num_threads(1)
    worst = 0.0
    for name, make in (("mlp", _mlp), ("small ops", _small_ops)):
        step = make()
        for _ in range(3):
            step()  # warm the allocator and the kernels
        plain = []
        for _ in range(args.steps * 2):
            start = time.perf_counter()
            step()
            plain.append(time.perf_counter() - start)
        runs: dict[bool, list[float]] = {True: [], False: []}
        with tempfile.TemporaryDirectory(prefix="stepscope-bench-memory-") as folder:
            for index in range(args.repeat):
                for memory in ((True, False) if index % 2 == 0 else (False, True)):
                    runs[memory] += _window(Path(folder) / f"{name}-{index}-{memory}", step, memory, args.steps)
        with_memory, without = statistics.median(runs[True]), statistics.median(runs[False])
        ratio = with_memory / without
        worst = max(worst, ratio)
        print(f"{name:10s} no profiler {statistics.median(plain) * 1e3:8.3f} ms | window {without * 1e3:8.3f} ms | "
              f"window + profile_memory {with_memory * 1e3:8.3f} ms | ratio {ratio:.3f} ({len(runs[True])} steps each)")  # fmt: skip
    print(f"goal: ratio <= 1.10; worst {worst:.3f}: {'met' if worst <= 1.10 else 'NOT met'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
