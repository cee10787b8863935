"""Writer throughput: MB/s of saving large tensors every step, against numpy's tofile of
the same bytes to the same disk, measured side by side in one run (goal: ratio >= 0.7).
Also: our zero-copy event encoding against protobuf's serializer for the same event."""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

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


if __name__ == "__main__":
    main()
