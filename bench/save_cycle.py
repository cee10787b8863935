"""Where a save of weights and gradients costs the training loop, step by step: the MLP of
bench_vs_smdebug.py (256-512-512-10, batch 64, SGD) plain and hooked (weights and gradients
every 10 steps, profiler off) in one process, in interleaved blocks, each step timed (wall
and the training thread's CPU). Per position in the 10-step save cycle, the hooked loop's
median step minus the plain loop's: the save step itself is what the hook does on the
training thread (the copies and the hook's Python); the steps after it are what the
writer's work costs training while it runs (on a machine whose cores all train, the core
it takes from torch's intra-op threads). The sum over the positions is the cost of one
save; medians per position make it steadier than a loop's total time on a noisy machine.
`--capture-only`: the hook hands nothing to its writer (the training thread's part alone).
Also prints the CPU each of stepscope's threads used per save.

    python bench/save_cycle.py [--threads N] [--rounds 60] [--capture-only]"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import tempfile
import threading
import time

import torch
from _quiet import mark_removed, wait_for_quiet  # (this folder is the script's)
from ab_writer_parts import plain_and_hooked

from stepscope.config import ProfilerConfig, SaveConfig
from stepscope_torch import Hook

EVERY = 10  # the save interval (steps)
BLOCK = 4 * EVERY  # steps per block: whole cycles, so that every position is timed alike
QUIET = range(5, EVERY)  # positions long after a save (its writing is done by then)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="torch intra-op threads (default: every core)")
    parser.add_argument("--rounds", type=int, default=60, help="blocks of each loop, interleaved")
    parser.add_argument("--capture-only", action="store_true", help="hand nothing to the writer")
    parser.add_argument("--out", help="write the job into a new folder under OUT and keep it (a run that deletes its files "
                        "makes the next run's files dearer on ext4: docs/pytorch.md#cost); 3.2 MB a save, about 0.8 GB a run "
                        "at the defaults: remove them when done")
    args = parser.parse_args()
    wait_for_quiet()  # (the hooked loop makes files: a bench's recent removal makes them dearer)
    torch.set_num_threads(args.threads)
    g = torch.Generator().manual_seed(1)
    batches = [(torch.randn(64, 256, generator=g), torch.randint(0, 10, (64,), generator=g)) for _ in range(4)]
    with contextlib.nullcontext(tempfile.mkdtemp(dir=args.out)) if args.out else tempfile.TemporaryDirectory(dir=os.environ.get("TMPDIR")) as out:
        hook = Hook(out, save_config=SaveConfig(save_interval=EVERY), include_collections=["weights", "gradients"], profiler_config=ProfilerConfig.disabled())
        writer = hook._runtime.writer
        if args.capture_only:
            writer._put = lambda job, nbytes: True
        loops = plain_and_hooked(hook)
        wall = {name: [[] for _ in range(EVERY)] for name in loops}
        cpu = {name: [[] for _ in range(EVERY)] for name in loops}
        clocks = {t.name: time.pthread_getcpuclockid(t.ident) for t in threading.enumerate() if t.name.startswith("stepscope-") and t.ident}
        used = dict.fromkeys(clocks, 0.0)
        for round_ in range(args.rounds + 1):  # (the first round warms up, untimed)
            for name, (model, loss_fn, optimizer) in loops.items():
                before = {k: time.clock_gettime(c) for k, c in clocks.items()}
                for i in range(BLOCK):  # (the hook's step i of the block is position i % EVERY: blocks are whole cycles)
                    x, y = batches[i % 4]
                    start, start_cpu = time.perf_counter(), time.thread_time()
                    optimizer.zero_grad()
                    loss_fn(model(x), y).backward()
                    optimizer.step()
                    if round_:
                        wall[name][i % EVERY].append(time.perf_counter() - start)
                        cpu[name][i % EVERY].append(time.thread_time() - start_cpu)
                if name == "hooked":
                    writer.flush()  # (its writing is this block's, not the next one's)
                    if round_:
                        for k, c in clocks.items():
                            used[k] += time.clock_gettime(c) - before[k]
        hook.close()
    if not args.out:
        mark_removed()  # (the job's folder was just removed)
    saves = args.rounds * BLOCK // EVERY
    plain = statistics.median(t for position in wall["plain"] for t in position)
    print(f"save_cycle: {args.threads} thread(s), {args.rounds} rounds of {BLOCK}-step blocks{', capture only' if args.capture_only else ''}; "
          f"plain loop {plain * 1e3:.3f} ms a step")
    print("position  wall added (ms)  training CPU added (ms)   (position 0 saves)")
    total = total_cpu = 0.0
    for position in range(EVERY):
        added = statistics.median(wall["hooked"][position]) - statistics.median(wall["plain"][position])
        added_cpu = statistics.median(cpu["hooked"][position]) - statistics.median(cpu["plain"][position])
        total, total_cpu = total + added, total_cpu + added_cpu
        print(f"{position:8}  {added * 1e3:15.3f}  {added_cpu * 1e3:22.3f}")
    print(f"per save: {total * 1e3:.3f} ms wall, {total_cpu * 1e3:.3f} ms of the training thread's CPU "
          f"({total / EVERY / plain * 100:.1f} % of the plain step)")
    # Two models are two sets of memory: where the quiet positions of the save cycle differ
    # by as much, that is the loops' own difference, not the save's.
    quiet = statistics.median(statistics.median(wall["hooked"][p]) - statistics.median(wall["plain"][p]) for p in QUIET)
    print(f"per save over the quiet positions' level ({quiet * 1e3:.3f} ms a step at positions {QUIET[0]}-{QUIET[-1]}): "
          f"{(total - EVERY * quiet) * 1e3:.3f} ms wall")
    for name, seconds in sorted(used.items()):
        if seconds > 0:
            print(f"  {name}: {seconds / saves * 1e3:.3f} ms of CPU per save")


if __name__ == "__main__":
    sys.exit(main())
