"""Writer throughput: MB/s of saving large tensors every step, against numpy's tofile of
the same bytes to the same disk, measured side by side in one run (goal: ratio >= 0.7).
Also: our zero-copy event encoding against protobuf's serializer for the same event; and
the CPU a scalar-only step costs (the default config saves the loss at every step: batches
of 100 steps, one event file per batch, one index file per step) against the floor of
publishing the same files with plain os calls (a temporary written, closed, renamed); last,
the writing thread's CPU per 3.2 MB save written around the page cache and through it."""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
from _quiet import mark_removed, wait_for_quiet  # (this folder is the script's)

from stepscope import events, records
from stepscope.capture.writer import Writer
from stepscope.modes import ModeKeys


def bench_stepscope(root: Path, tensors: list[np.ndarray], steps: int) -> float:
    out = root / "stepscope"
    start = time.perf_counter()
    writer = Writer(str(out))
    for step in range(steps):
        writer.write_step(step, ModeKeys.TRAIN, step, {f"t{i}": t for i, t in enumerate(tensors)})
    writer.close()
    elapsed = time.perf_counter() - start
    shutil.rmtree(out)
    return elapsed


def bench_tofile(root: Path, tensors: list[np.ndarray], steps: int) -> float:
    out = root / "tofile"
    out.mkdir()
    start = time.perf_counter()
    for step in range(steps):
        with open(out / f"{step}.bin", "wb") as handle:
            for tensor in tensors:
                tensor.tofile(handle)
    elapsed = time.perf_counter() - start
    shutil.rmtree(out)
    return elapsed


SCALAR_BATCH = 100


def bench_scalar_steps(root: Path, steps: int) -> float:
    """CPU seconds (every thread) of the writer saving `steps` loss-only steps in batches."""
    out = root / "scalars"
    loss = np.float32(0.25)
    start = time.process_time()
    writer = Writer(str(out))
    for first in range(0, steps, SCALAR_BATCH):
        writer.write_steps([(s, ModeKeys.TRAIN, s, {"CrossEntropyLoss_output_0": loss}, {}) for s in range(first, first + SCALAR_BATCH)])
    writer.close()
    elapsed = time.process_time() - start
    shutil.rmtree(out)
    return elapsed


def bench_scalar_floor(root: Path, steps: int, index_bytes: int = 220, event_bytes: int = 120) -> float:
    """CPU seconds of publishing the same files with plain os calls: no framing, no JSON."""
    out = root / "floor"
    start = time.process_time()
    for first in range(0, steps, SCALAR_BATCH):
        for folder, names, size in ((out / "events" / f"{first:012d}", [f"{first:012d}.tfevents"], event_bytes * SCALAR_BATCH),
                                    (out / "index" / f"{first // 1000:09d}", [f"{s:012d}.json" for s in range(first, first + SCALAR_BATCH)], index_bytes)):
            folder.mkdir(parents=True, exist_ok=True)
            dir_fd = os.open(folder, os.O_RDONLY)
            for name in names:
                fd = os.open(f".{name}.tmp", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644, dir_fd=dir_fd)
                os.write(fd, b"x" * size)
                os.close(fd)
                os.replace(f".{name}.tmp", name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
            os.close(dir_fd)
    elapsed = time.process_time() - start
    shutil.rmtree(out)
    return elapsed


def protobuf_encode(name: str, value: np.ndarray) -> bytes:
    event = events.Event(wall_time=time.time(), step=1)
    item = event.summary.value.add(tag=name)
    item.tensor.dtype = events.dtype_code(value.dtype)
    for size in value.shape:
        item.tensor.tensor_shape.dim.add(size=size)
    item.tensor.tensor_content = value.tobytes()
    item.metadata.plugin_data.add(plugin_name="mode_step", content=b"1")
    item.metadata.plugin_data.add(plugin_name="mode", content=b"1")
    return records.frame_bytes(event.SerializeToString())


def hand_encode(name: str, value: np.ndarray) -> list:
    return records.frame(events.encode_tensor_event(name, value, 1, ModeKeys.TRAIN, 1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--mb-per-step", type=int, default=64)
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--dir", default=None, help="folder on the disk to measure (default: system temp)")
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    if args.quick:
        args.mb_per_step, args.steps, args.rounds = 16, 6, 2
    # Its ratios compare two ways in the same conditions; its absolute figures read high
    # within six minutes of a bench's removal of its jobs (bench/_quiet.py), its own too.
    wait_for_quiet(wait=False)
    floats = args.mb_per_step * 1024 * 1024 // 4
    rng = np.random.default_rng(0)
    tensors = [rng.standard_normal(floats // 4, dtype=np.float32) for _ in range(4)]
    total_mb = args.mb_per_step * args.steps
    root = Path(tempfile.mkdtemp(dir=args.dir, prefix="stepscope-bench-"))
    ours, baseline = [], []
    try:
        for round_ in range(args.rounds):
            # Interleaved, alternating which goes first, each starting after a sync: otherwise
            # the one that runs second pays for writing back the other's dirty pages.
            runs = [(baseline, bench_tofile), (ours, bench_stepscope)]
            for results, bench in runs if round_ % 2 == 0 else reversed(runs):
                os.sync()
                results.append(bench(root, tensors, args.steps))
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print(f"writer: {args.steps} steps x {args.mb_per_step} MB (4 tensors), {args.rounds} rounds")
    print(f"  MB/s per round: tofile {[round(total_mb / t) for t in baseline]}, stepscope {[round(total_mb / t) for t in ours]}")
    for label, pick in (("median", statistics.median), ("best", min)):
        ours_mbs, base_mbs = total_mb / pick(ours), total_mb / pick(baseline)
        print(f"  {label:6s} numpy tofile {base_mbs:8.1f} MB/s, stepscope {ours_mbs:8.1f} MB/s, ratio {ours_mbs / base_mbs:5.2f} (goal >= 0.7)")

    value = tensors[0]
    for label, fn in (("protobuf serializer", protobuf_encode), ("zero-copy encoder", hand_encode)):
        times = []
        for _ in range(5):
            start = time.perf_counter()
            fn("t", value)
            times.append(time.perf_counter() - start)
        print(f"  encode+frame {value.nbytes / 2**20:.0f} MB with {label:20s} {statistics.median(times) * 1e3:7.1f} ms")

    # Scalar-only steps: CPU per step, interleaved with the floor (the same files published
    # with plain os calls), best of the rounds (the disk's system calls vary with load).
    steps = 1000 if args.quick else 5000
    root = Path(tempfile.mkdtemp(dir=args.dir, prefix="stepscope-bench-"))
    scalar, floor = [], []
    try:
        for round_ in range(max(3, args.rounds)):
            runs = [(floor, bench_scalar_floor), (scalar, bench_scalar_steps)]
            for results, bench in runs if round_ % 2 == 0 else reversed(runs):
                results.append(bench(root, steps) / steps * 1e6)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print(f"scalar-only steps ({steps} loss-only steps, batches of {SCALAR_BATCH}), CPU per step, best of {len(scalar)}:")
    print(f"  files alone (os calls) {min(floor):6.1f} us, stepscope writer {min(scalar):6.1f} us, ratio {min(scalar) / min(floor):4.2f}")
    save_cpu(args.dir, 60 if args.quick else 200)
    mark_removed()


def save_cpu(folder: str | None, files: int) -> None:
    """CPU of the writing thread per 3.2 MB save (an MLP's weights and gradients as record
    parts), the event file written around the page cache (direct_io.py) and through it,
    interleaved in rounds of `files` new files each, kept until the end (as a job keeps
    them; deleting frees pages the next files would reuse), medians."""
    from stepscope.store.direct_io import DIRECT_IO_ENV, direct_io_allowed
    from stepscope.store.local import LocalStore

    rng = np.random.default_rng(1)
    parts: list = []
    for shape in ((512, 256), (512,), (512, 512), (512,), (10, 512), (10,)) * 2:
        parts += [rng.bytes(24), rng.standard_normal(shape).astype(np.float32), rng.bytes(4)]
    root = Path(tempfile.mkdtemp(dir=folder, prefix="stepscope-bench-"))
    if not direct_io_allowed(str(root)):
        print(f"save CPU: {root} is not on a file system written directly (ext4, XFS, Btrfs on Linux); skipped")
        shutil.rmtree(root, ignore_errors=True)
        return
    costs: dict[str, list[float]] = {"direct": [], "page cache": []}
    try:
        for round_ in range(4):
            for label in ("direct", "page cache") if round_ % 2 == 0 else ("page cache", "direct"):
                os.environ[DIRECT_IO_ENV] = "1" if label == "direct" else "0"
                store = LocalStore(str(root / f"{label.replace(' ', '-')}-{round_}"))
                for i in range(files):
                    start = time.thread_time()
                    store.write(f"events/{i:012d}/{i:012d}_worker_0.tfevents", parts)
                    costs[label].append(time.thread_time() - start)
    finally:
        os.environ.pop(DIRECT_IO_ENV, None)
        shutil.rmtree(root, ignore_errors=True)
    size = sum(memoryview(p).nbytes for p in parts) / 1e6
    direct, cached = statistics.median(costs["direct"]), statistics.median(costs["page cache"])
    print(f"save CPU ({size:.1f} MB event file, {4 * files} files each, medians): direct {direct * 1e3:.2f} ms, page cache {cached * 1e3:.2f} ms, ratio {direct / cached:.2f}")


if __name__ == "__main__":
    main()
