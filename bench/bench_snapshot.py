"""How long reading and summarising a large CUDA allocator snapshot takes, and the memory
it needs: a generated snapshot (stepscope.testing.snapshots, torch's `_snapshot()` format)
of about `--entries` history entries is pickled, then a fresh process loads it with
AllocatorSnapshot and computes the summary, the live bytes by frame, the peak and the
entries around the OOM. Printed: the pickle's size, the load and summary seconds, the
process's peak RSS.

With `--stream-gb N`, a snapshot of about N GB (stepscope.testing.snapshots'
write_large_snapshot: the same format, written as a pickle stream, never held in memory)
is written to a file and a fresh process summarises it with the streamed reader
(stepscope.traces.snapshot_stream.summarize): printed, its size, the seconds and the peak
RSS, beside the peak RSS of a process that only imports the reader (the floor).

    python bench/bench_snapshot.py                    # about 1,000,000 entries, in-memory reader
    python bench/bench_snapshot.py --entries 200000
    python bench/bench_snapshot.py --stream-gb 1.5    # a 1.5 GB snapshot, streamed reader"""

from __future__ import annotations

import argparse
import pickle
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from stepscope.testing.snapshots import LargeSnapshotSpec, SnapshotSpec, make_snapshot, write_large_snapshot

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


_STREAM = """
import resource, sys, time
started = time.perf_counter()
from stepscope.traces.snapshot_stream import summarize
floor = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
snap = summarize(sys.argv[1])
at, frames = snap.peak(0)
usage = resource.getrusage(resource.RUSAGE_SELF)
print(f"streamed: {time.perf_counter() - started:.1f} s wall, {usage.ru_utime + usage.ru_stime:.1f} s CPU, peak RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MB "
      f"(after imports {floor:.0f} MB); {snap.stats()}; peak {at['allocated']:,} bytes (expected {sys.argv[2]})")
"""

# Bytes of pickle per history entry of write_large_snapshot (measured on a small one).
_BYTES_PER_ENTRY_PROBE = LargeSnapshotSpec(steps=200)


def stream(gigabytes: float) -> None:
    import io

    probe = io.BytesIO()
    write_large_snapshot(probe, _BYTES_PER_ENTRY_PROBE)
    per_entry = len(probe.getvalue()) / _BYTES_PER_ENTRY_PROBE.entries_per_device()
    spec = LargeSnapshotSpec(steps=max(1, int(gigabytes * 1e9 / per_entry / (1 + 3 * (_BYTES_PER_ENTRY_PROBE.allocations_per_step - 1)))))
    with tempfile.TemporaryDirectory(prefix="stepscope-bench-snapshot-") as folder:
        path = Path(folder) / "snapshot.pickle"
        started = time.perf_counter()
        with open(path, "wb", buffering=8 << 20) as handle:
            truth = write_large_snapshot(handle, spec)
        print(f"generated in {time.perf_counter() - started:.1f} s: {path.stat().st_size / 1e9:.2f} GB pickle, "
              f"{spec.entries_per_device():,} history entries (generator peak RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MB)")  # fmt: skip
        subprocess.run([sys.executable, "-c", _STREAM, str(path), f"{truth['peak']:,}"], check=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--entries", type=int, default=1_000_000)
    parser.add_argument("--stream-gb", type=float, default=None, metavar="GB", help="a snapshot of about GB gigabytes, streamed reader")
    args = parser.parse_args()
    if args.stream_gb is not None:
        stream(args.stream_gb)
        return 0
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
