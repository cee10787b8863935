"""CPU each thread of a training process spends per step under the torch hook's default
configuration: the training thread and each of stepscope's own (writer, publisher,
timeline flush, held steps, stop poller), from /proc (Linux), over interleaved blocks of a
plain and a hooked MLP loop. The wall ratio printed beside it is as noisy as the machine;
the per-thread CPU is the figure to compare across commits (where the background threads'
CPU goes on a machine with no spare core). Not run by `nox -s bench` (Linux only).
`--saves`: weights and gradients every 10 steps instead (4.3 MB a save, the profiler
side off), with each thread's CPU per save too; `--threads`: torch's intra-op threads.

    python bench/threads_torch_hook.py [--blocks 5] [--steps 1000] [--saves] [--threads 1]"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import threading
import time

import torch
from bench_torch_hook import Loop, _steady_malloc, mlp  # (this folder is the script's)

from stepscope.config import ProfilerConfig, SaveConfig
from stepscope_torch import Hook

EVERY = 10  # --saves: a save every this many steps


def thread_cpu_s() -> dict[int, float]:
    """CPU seconds (user + system) of each thread of this process, by native id."""
    ticks = os.sysconf("SC_CLK_TCK")
    found = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/stat") as handle:
                fields = handle.read().rsplit(")", 1)[1].split()
        except OSError:
            continue  # (a thread that ended meanwhile)
        found[int(tid)] = (int(fields[11]) + int(fields[12])) / ticks
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--blocks", type=int, default=5)
    parser.add_argument("--steps", type=int, default=1000, help="steps per block")
    parser.add_argument("--saves", action="store_true", help=f"weights and gradients every {EVERY} steps, profiler off")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    args = parser.parse_args()
    if not os.path.isdir("/proc/self/task"):
        sys.exit("needs Linux's /proc")
    torch.set_num_threads(args.threads)
    _steady_malloc()
    with tempfile.TemporaryDirectory() as root:
        if args.saves:
            hook = Hook(os.path.join(root, "job"), save_config=SaveConfig(save_interval=EVERY), include_collections=["weights", "gradients"],
                        profiler_config=ProfilerConfig.disabled())  # fmt: skip
        else:
            hook = Hook(os.path.join(root, "job"))
        loops = {"plain": Loop(mlp), "hooked": Loop(mlp, hook)}
        for loop in loops.values():
            loop.run(100)
        times: dict[str, list[tuple[float, float]]] = {"plain": [], "hooked": []}
        # The whole process's CPU per step too: torch's own threads (OpenMP workers that
        # spin between parallel regions) pay for a core the writer takes from them.
        process: dict[str, list[float]] = {"plain": [], "hooked": []}
        before = thread_cpu_s()
        for block in range(args.blocks):
            for name in ("plain", "hooked") if block % 2 == 0 else ("hooked", "plain"):
                started = time.process_time()
                times[name].append(loops[name].run(args.steps))
                if name == "hooked":
                    hook.flush()  # (the block's saves written within it)
                process[name].append((time.process_time() - started) / args.steps)
        after = thread_cpu_s()
        names = {t.native_id: t.name for t in threading.enumerate()}
        hook.close()
    (plain_wall, plain_cpu), (hooked_wall, hooked_cpu) = (
        (statistics.median(t[0] for t in times[n]), statistics.median(t[1] for t in times[n])) for n in ("plain", "hooked")
    )
    steps = args.blocks * args.steps
    config = f"weights and gradients every {EVERY} steps" if args.saves else "default config"
    print(f"MLP, {config}, {args.threads} torch thread(s), {args.blocks} blocks x {args.steps} steps, interleaved; medians per block")
    print(f"wall: plain {plain_wall * 1e3:.3f} ms, hooked {hooked_wall * 1e3:.3f} ms ({hooked_wall / plain_wall:.3f}x)")
    print(f"training thread CPU: plain {plain_cpu * 1e3:.3f} ms, hooked {hooked_cpu * 1e3:.3f} ms ({(hooked_cpu - plain_cpu) * 1e6:+.1f} us/step)")
    plain_all, hooked_all = (statistics.median(process[n]) for n in ("plain", "hooked"))
    print(f"whole process CPU (every thread): plain {plain_all * 1e3:.3f} ms, hooked {hooked_all * 1e3:.3f} ms ({(hooked_all - plain_all) * 1e6:+.1f} us/step)")
    print("stepscope's threads, CPU per hooked step:")
    total = 0.0
    for tid, seconds in sorted(after.items()):
        name = names.get(tid, "?")
        if name.startswith("stepscope"):
            spent = (seconds - before.get(tid, 0.0)) / steps * 1e6
            total += spent
            print(f"  {name:32} {spent:7.1f} us" + (f"  ({spent * EVERY / 1e3:.2f} ms per save)" if args.saves else ""))
    print(f"  {'together':32} {total:7.1f} us (counted in clock ticks of {1e3 / os.sysconf('SC_CLK_TCK'):.0f} ms: use long runs)")


if __name__ == "__main__":
    main()
