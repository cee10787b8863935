"""Trial reader: open a job of 10,000 steps x 50 tensors and read one tensor over every
step (goal: well under a second). With --smdebug-python, the same read through smdebug's
reader in that interpreter (an environment with smdebug 1.0.34), side by side."""

from __future__ import annotations

import argparse
import shutil
import subprocess
import tempfile
import textwrap
import time
from pathlib import Path

import numpy as np

from stepscope import create_trial
from stepscope.capture.collection_manager import CollectionManager
from stepscope.capture.writer import Writer
from stepscope.modes import ModeKeys


def generate(out: Path, steps: int, tensors: int, payload_crc: str = "crc32c") -> None:
    rng = np.random.default_rng(0)
    values = {f"layer{i}.weight": rng.standard_normal(16).astype(np.float32) for i in range(tensors)}
    with Writer(str(out), payload_crc=payload_crc) as writer:
        writer.write_collections(CollectionManager().dumps())
        for step in range(steps):
            writer.write_step(step, ModeKeys.TRAIN, step, values)


def read_with_stepscope(out: Path) -> tuple[float, float, int]:
    start = time.perf_counter()
    trial = create_trial(str(out))
    opened = time.perf_counter() - start
    values = trial.tensor("layer7.weight").values()
    total = time.perf_counter() - start
    return opened, total, len(values)


SMDEBUG_SCRIPT = textwrap.dedent(
    """
    import sys, time
    start = time.perf_counter()
    from smdebug.trials import create_trial
    t0 = time.perf_counter()
    trial = create_trial(sys.argv[1])
    steps = trial.steps()
    opened = time.perf_counter() - t0
    tensor = trial.tensor("layer7.weight")
    values = [tensor.value(s) for s in steps]
    print(opened, time.perf_counter() - t0, len(values))
    """
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=10_000)
    parser.add_argument("--tensors", type=int, default=50)
    parser.add_argument("--smdebug-python", default=None, help="python of an environment with smdebug 1.0.34")
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    if args.quick:
        args.steps = 2_000
    root = Path(tempfile.mkdtemp(prefix="stepscope-bench-trial-"))
    try:
        out = root / "job"
        start = time.perf_counter()
        # smdebug's reader accepts only its placeholder payload CRC (see docs/format.md).
        generate(out, args.steps, args.tensors, payload_crc="smdebug" if args.smdebug_python else "crc32c")
        print(f"trial: generated {args.steps} steps x {args.tensors} tensors in {time.perf_counter() - start:.1f} s")
        runs = [read_with_stepscope(out) for _ in range(3)]
        opened, total, count = sorted(runs, key=lambda r: r[1])[1]
        print(f"  stepscope: open {opened:.3f} s, open + read one tensor over {count} steps {total:.3f} s (median of 3; goal well under 1 s)")
        if args.smdebug_python:
            reply = subprocess.run([args.smdebug_python, "-c", SMDEBUG_SCRIPT, str(out)], capture_output=True, text=True, check=True)
            s_opened, s_total, s_count = reply.stdout.split()[-3:]
            print(f"  smdebug:   open {float(s_opened):.3f} s, open + read {s_count} steps {float(s_total):.3f} s")
            print(f"  ratio smdebug / stepscope: {float(s_total) / total:.1f}x")
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
