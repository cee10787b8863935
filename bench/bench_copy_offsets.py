"""The snapshot copy's speed over every placement of a source against its arena view.

`_encode.copy_scan` (capture/host_arena.py) copies a CPU tensor into the host arena and
takes its CRC in the same pass, storing around the caches. Streamed stores to a
destination that sits up to 64 bytes after the source in their 4 KiB pages made the copy
12-17 times slower on this project's VM (0.7-1.0 ms per MiB against 0.06): the loads of
the next bytes then alias stores still in the write-combining buffers. A page-aligned
source (an mmap'd checkpoint, a numpy array from an aligned allocator) under an arena view
at a page's start is such a placement. copy_scan takes plain stores there.

For each source offset in a page (16-byte steps) and each destination offset (0, where the
arena puts every view, and 64), the copy's median time over `--reps` copies of 1 MiB;
printed, the median and the worst over the offsets, their ratio (goal <= 1.5: no placement
far slower than the rest), and numpy's copy (no CRC) for scale.

    python bench/bench_copy_offsets.py
    python bench/bench_copy_offsets.py --quick"""

from __future__ import annotations

import argparse
import mmap
import statistics
import time

import numpy as np

from stepscope.compiled import load_extension

SIZE = 1 << 20
PAGE = 4096


def _timed(copy, reps: int) -> float:
    copy()
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        copy()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--reps", type=int, default=21)
    parser.add_argument("--quick", action="store_true", help="5 copies per placement, 64-byte steps")
    args = parser.parse_args()
    encode = load_extension("stepscope.capture", "_encode")
    if encode is None or not hasattr(encode, "copy_scan"):
        print("stepscope.capture._encode is not built here (or STEPSCOPE_PURE_PYTHON): nothing to measure")
        return
    reps, step = (5, 64) if args.quick else (args.reps, 16)
    source_memory, target_memory = mmap.mmap(-1, SIZE + 2 * PAGE), mmap.mmap(-1, SIZE + 2 * PAGE)
    np.frombuffer(source_memory, dtype=np.float32)[:] = np.random.default_rng(0).standard_normal((SIZE + 2 * PAGE) // 4, dtype=np.float32)
    count = SIZE // 4
    print(f"copy_scan of {SIZE >> 20} MiB of float32 (CRC and finite check in the copy), median of {reps} copies per placement")
    for target_offset in (0, 64):
        target = np.frombuffer(target_memory, dtype=np.float32, count=count, offset=target_offset)
        times = {}
        for offset in range(0, PAGE, step):
            source = np.frombuffer(source_memory, dtype=np.float32, count=count, offset=offset)
            times[offset] = _timed(lambda: encode.copy_scan(target, source, 4), reps)  # noqa: B023 - used at once
        median = statistics.median(times.values())
        worst = max(times, key=times.__getitem__)
        numpy_copy = _timed(lambda: np.copyto(target, source), reps)  # noqa: B023
        ratio = times[worst] / median
        print(f"  view at page offset {target_offset:2d}: median {median * 1e6:7.1f} us, worst {times[worst] * 1e6:7.1f} us (source at page offset {worst}); "
              f"worst / median {ratio:.2f} (goal <= 1.5: {'met' if ratio <= 1.5 else 'MISSED'}); numpy's copy {numpy_copy * 1e6:.1f} us")


if __name__ == "__main__":
    main()
