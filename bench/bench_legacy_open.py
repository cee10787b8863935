"""Opening a job that smdebug 1.0.34 wrote (no step tables: one index file per step) and
reading one tensor over every step, stepscope against smdebug's own reader, each a whole
process (interpreter start, imports, listing, every index file parsed and validated, one
ranged read per step), side by side in one run. Goal: stepscope >= 30x faster, in wall
time and in CPU time.

    python bench/bench_legacy_open.py --smdebug-python ../smdebug-venv/bin/python
    python bench/bench_legacy_open.py --smdebug-python ../smdebug-venv/bin/python --job /tmp/legacy-job

The job (10,000 steps x 50 tensors of 16 floats by default) is written by smdebug's own
FileWriter in its environment (see bench_vs_smdebug.py's docstring for that virtualenv);
that takes minutes, so `--job DIR` keeps it for later runs (written only if DIR is absent).
Both readers must return the same values (their sums are compared). Wall time is what a
user waits; CPU time (user + system of the process) is printed too, as it moves less
when other work shares the machine."""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

TENSOR = "layer7.weight"

# Runs in the smdebug environment: `python -c GENERATE out_dir steps tensors`.
GENERATE = r"""
import os, sys
import numpy as np
from smdebug.core.modes import ModeKeys
from smdebug.core.writer import FileWriter
from smdebug.pytorch.collection import CollectionManager

out, steps, tensors = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
rng = np.random.default_rng(0)
values = [rng.standard_normal(16).astype(np.float32) for _ in range(tensors)]
manager = CollectionManager()
manager.set_num_workers(1)
manager.export(out, "worker_0_collections.json")
for step in range(steps):
    with FileWriter(trial_dir=out, worker="worker_0", step=step) as writer:
        for i, value in enumerate(values):
            writer.write_tensor(value * (1 + step % 7), f"layer{i}.weight", mode=ModeKeys.TRAIN, mode_step=step)
open(os.path.join(out, "training_job_end.ts"), "w").close()
"""

READ_STEPSCOPE = r"""
import json, sys
from stepscope import create_trial
values = create_trial(sys.argv[1]).tensor(sys.argv[2]).values()
print(json.dumps({"steps": len(values), "sum": float(sum(float(v.sum()) for v in values.values()))}))
"""

READ_SMDEBUG = r"""
import json, logging, sys
logging.disable(logging.CRITICAL)
from smdebug.trials import create_trial
trial = create_trial(sys.argv[1])
tensor = trial.tensor(sys.argv[2])
values = [tensor.value(step) for step in trial.steps()]
print(json.dumps({"steps": len(values), "sum": float(sum(float(v.sum()) for v in values))}))
"""


def timed(argv: list[str], env: dict[str, str] | None = None) -> tuple[float, float, dict]:
    """(wall s, CPU s, its JSON answer) of one whole process."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    reply = subprocess.run(argv, capture_output=True, text=True, env=env)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if reply.returncode != 0:
        raise RuntimeError(f"{argv[0]} failed: {reply.stderr.strip()[-2000:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu, json.loads(reply.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--smdebug-python", default=os.environ.get("SMDEBUG_PYTHON"), required=os.environ.get("SMDEBUG_PYTHON") is None, help="python of an environment with smdebug 1.0.34")
    parser.add_argument("--steps", type=int, default=10_000)
    parser.add_argument("--tensors", type=int, default=50)
    parser.add_argument("--job", default=None, help="where the smdebug job is kept between runs (written when absent)")
    parser.add_argument("--rounds", type=int, default=3, help="stepscope runs (median); smdebug runs once, between them")
    args = parser.parse_args()
    scratch = None
    if args.job is None:
        scratch = tempfile.mkdtemp(prefix="stepscope-bench-legacy-")
        job = os.path.join(scratch, "job")
    else:
        job = args.job
    try:
        if not os.path.isdir(job):
            start = time.perf_counter()
            subprocess.run([args.smdebug_python, "-c", GENERATE, job, str(args.steps), str(args.tensors)], check=True, capture_output=True)
            print(f"smdebug wrote {args.steps} steps x {args.tensors} tensors in {time.perf_counter() - start:.0f} s")
        # As an installed package has it: stepscope's bytecode compiled (a first, untimed
        # run writes it), as pip did for smdebug's. The first run also brings the job's
        # files into the page cache for both readers.
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        timed([sys.executable, "-c", READ_STEPSCOPE, job, TENSOR], env)
        ours, theirs = [], None
        for i in range(args.rounds):
            ours.append(timed([sys.executable, "-c", READ_STEPSCOPE, job, TENSOR], env))
            if i == args.rounds // 2 - (1 if args.rounds % 2 == 0 else 0) or args.rounds == 1:
                theirs = timed([args.smdebug_python, "-c", READ_SMDEBUG, job, TENSOR])
        assert theirs is not None
        answers = {json.dumps(r[2], sort_keys=True) for r in ours}
        if len(answers) != 1 or abs(ours[0][2]["sum"] - theirs[2]["sum"]) > 1e-6 * max(1.0, abs(theirs[2]["sum"])) or ours[0][2]["steps"] != theirs[2]["steps"]:
            raise SystemExit(f"the readers disagree: stepscope {sorted(answers)}, smdebug {theirs[2]}")
        wall, cpu = statistics.median(r[0] for r in ours), statistics.median(r[1] for r in ours)
        print(f"open a legacy smdebug job + read {TENSOR} over {theirs[2]['steps']} steps ({args.tensors} tensors per step), whole process")
        print(f"  stepscope: {wall:6.2f} s wall, {cpu:6.2f} s CPU (median of {args.rounds}: {', '.join(f'{r[0]:.2f}' for r in ours)} s wall)")
        print(f"  smdebug:   {theirs[0]:6.2f} s wall, {theirs[1]:6.2f} s CPU")
        ratio, cpu_ratio = theirs[0] / wall, theirs[1] / cpu
        # Both: the wall ratio moves with the machine's load (smdebug waits on more I/O), the
        # CPU ratio is what a quiet machine would show.
        print(f"  stepscope is {ratio:.1f}x faster (wall), {cpu_ratio:.1f}x (CPU); goal >= 30x on both: {'met' if min(ratio, cpu_ratio) >= 30 else 'MISSED'}")
    finally:
        if scratch is not None:
            shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
