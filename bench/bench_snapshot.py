"""How long reading and summarising a large CUDA allocator snapshot takes, and the memory
it needs: a generated snapshot (stepscope.testing.snapshots, torch's `_snapshot()` format)
of about `--entries` history entries is pickled, then a fresh process loads it with
AllocatorSnapshot and computes the summary, the live bytes by frame, the peak and the
entries around the OOM. Printed: the pickle's size, the load and summary seconds, the
process's peak RSS.

    python bench/bench_snapshot.py                    # about 1,000,000 entries
    python bench/bench_snapshot.py --entries 200000"""

from __future__ import annotations

import argparse
import pickle
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from stepscope.testing.snapshots import SnapshotSpec, make_snapshot

_READ = """
import resource, sys, time
started = time.perf_counter()
from stepscope.traces.snapshot import AllocatorSnapshot
snap = AllocatorSnapshot.load(sys.argv[1])
loaded = time.perf_counter()
summary = snap.summary()
snap.by_frame(0)
at, live = snap.peak(0)
snap.around(0)
done = time.perf_counter()
print(f"load {loaded - started:.2f} s, summaries {done - loaded:.2f} s, peak RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MB, "
      f"{int(summary['trace_entries'].sum()):,} entries, {len(snap.stacks)} distinct stacks, peak {at['allocated']:,} bytes")
"""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--entries", type=int, default=1_000_000)
    args = parser.parse_args()
    per_step = 100
    steps = max(1, args.entries // (per_step * 3))  # each allocation freed: alloc + free_requested + free_completed
    started = time.perf_counter()
    raw, _ = make_snapshot(SnapshotSpec(steps=steps, allocations_per_step=per_step, keep_per_step=1, segment_bytes=1 << 30, oom=True))
    with tempfile.TemporaryDirectory(prefix="stepscope-bench-snapshot-") as folder:
        path = Path(folder) / "snapshot.pickle"
        path.write_bytes(pickle.dumps(raw))
        del raw
        print(f"generated in {time.perf_counter() - started:.1f} s: {path.stat().st_size / 1e6:.0f} MB pickle "
              f"(generator peak RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MB)")  # fmt: skip
        subprocess.run([sys.executable, "-c", _READ, str(path)], check=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
