"""The default rule set (`stepscope check` without --rule) over a job of 10,000 saved steps
of a small model: the cost of today's default set (stepscope.rules.default_rules: more
rules, trend statistics) against the set it replaced (five SageMaker rules with SageMaker's
parameters), side by side in one run (target: at most 1.5x); then the rules sharing reads
(run_rules) against the same rules run one by one (invoke_rule each), with store reads.

    python bench/bench_rules.py            # 10,000 steps
    python bench/bench_rules.py --quick    # 1,000 steps
    python bench/bench_rules.py --steps 3000 --keep /tmp/job   # keep the generated job
    python bench/bench_rules.py --compare-with ../old/packages/core/src   # another checkout's default set, side by side

The job is written with the core Writer: a 16-32-32-1 MLP's weights, biases and their
gradients (raw) and the loss every step, plus an EVAL loss every 100 steps."""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np
from _mlp_job import SHAPES, write_mlp_job

from stepscope import create_trial
from stepscope.rules import BUILTIN_RULES, invoke_rule, run_rules
from stepscope.rules import default_rules as current_default_rules
from stepscope.store.local import LocalStore


class CountingStore(LocalStore):
    def __init__(self, root):
        super().__init__(root)
        self.range_reads = 0

    def read_range(self, key, start, length):
        self.range_reads += 1
        return super().read_range(key, start, length)


def generate(out_dir: Path, steps: int) -> float:
    started = time.perf_counter()
    write_mlp_job(out_dir, steps, np.random.default_rng(0))
    return time.perf_counter() - started


PREVIOUS_DEFAULT = ("VanishingGradient", "ExplodingTensor", "LossNotDecreasing", "WeightUpdateRatio", "Overfit")


def previous_rules(trial):
    """The default set before the rule rework: five rules with SageMaker's parameters."""
    return [BUILTIN_RULES[name](trial) for name in PREVIOUS_DEFAULT]


def default_rules(trial):
    return current_default_rules(trial)


def _timed(make_rules, root: Path) -> tuple[float, list]:
    started = time.perf_counter()
    trial = create_trial(str(root))
    reports = run_rules(make_rules(trial))
    return time.perf_counter() - started, reports


_TIME_DEFAULT_SET = """
import sys, time
from stepscope import create_trial
from stepscope.rules import default_rules, run_rules
started = time.perf_counter()
trial = create_trial(sys.argv[1])
reports = run_rules(default_rules(trial))
print(time.perf_counter() - started, len(reports), sum(r.fired for r in reports))
"""


def compare_with(other_src: str, root: Path, rounds: int = 3) -> None:
    """The default set of this checkout against another checkout's (`other_src`: its
    packages/core/src), each in a fresh process, alternating, best of `rounds`."""
    import os
    import subprocess
    import sys

    here = str(Path(__file__).resolve().parents[1] / "packages" / "core" / "src")
    times: dict[str, list[float]] = {"other": [], "this": []}
    for round_ in range(rounds):
        order = [("other", other_src), ("this", here)]
        for label, src in order if round_ % 2 == 0 else order[::-1]:
            env = {**os.environ, "PYTHONPATH": src}
            out = subprocess.run([sys.executable, "-c", _TIME_DEFAULT_SET, str(root)], env=env, capture_output=True, text=True, check=True).stdout.split()
            times[label].append(float(out[0]))
            print(f"  round {round_ + 1} {label:<5s} checkout: {float(out[0]):7.2f} s, {out[1]} rules, {out[2]} fired", flush=True)
    this, other = min(times["this"]), min(times["other"])
    print(f"default set: this checkout {this:.2f} s vs {other_src} {other:.2f} s (best of {rounds}): {this / other:.2f}x (target <= 1.5x)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=10_000)
    parser.add_argument("--quick", action="store_true", help="1,000 steps")
    parser.add_argument("--keep", help="write the job here and keep it")
    parser.add_argument("--compare-with", metavar="SRC", help="another checkout's packages/core/src: time both default sets side by side, then stop")
    args = parser.parse_args()
    steps = 1_000 if args.quick else args.steps
    root = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="stepscope-bench-rules-"))
    try:
        if not (root / "training_job_end.ts").exists():
            seconds = generate(root, steps)
            print(f"generated {steps} steps ({len(SHAPES) * 2 + 1} tensors each) in {seconds:.1f} s")
        if args.compare_with:
            compare_with(args.compare_with, root)
            return
        trial_steps = len(create_trial(str(root)).steps())
        names = [r.name for r in default_rules(create_trial(str(root)))]
        print(f"default rule set: {', '.join(names)}; {trial_steps} saved steps")
        print(f"previous default set: {', '.join(PREVIOUS_DEFAULT)}")
        times: dict[str, list[float]] = {"previous": [], "current": []}
        for round_ in range(3):
            order = [("previous", previous_rules), ("current", default_rules)]
            for label, make in order if round_ % 2 == 0 else order[::-1]:
                seconds, reports = _timed(make, root)
                times[label].append(seconds)
                fired = [r.rule for r in reports if r.fired]
                print(f"  round {round_ + 1} {label:<8s} {seconds:7.2f} s, {1e6 * seconds / trial_steps:7.1f} us/step; fired: {fired or 'none'}")
        previous, current = min(times["previous"]), min(times["current"])
        print(f"default set cost: current {current:.2f} s vs previous {previous:.2f} s (best of 3): {current / previous:.2f}x (target <= 1.5x)")

        store = CountingStore(root)
        started = time.perf_counter()
        trial = create_trial(store)
        reports = run_rules(default_rules(trial))
        shared = time.perf_counter() - started
        fired = [r.rule for r in reports if r.fired]
        print(f"shared reads (run_rules):  {shared:7.2f} s total, {1e6 * shared / trial_steps:7.1f} us/step, {store.range_reads:8d} reads; fired: {fired or 'none'}")

        store = CountingStore(root)
        started = time.perf_counter()
        trial = create_trial(store)
        per_rule = {}
        for rule in default_rules(trial):
            rule_started = time.perf_counter()
            invoke_rule(rule)
            per_rule[rule.name] = time.perf_counter() - rule_started
        apart = time.perf_counter() - started
        print(f"one by one (invoke_rule):  {apart:7.2f} s total, {1e6 * apart / trial_steps:7.1f} us/step, {store.range_reads:8d} reads")
        for name, seconds in per_rule.items():
            print(f"    {name:<20s} {seconds:6.2f} s")
        print(f"sharing reads: {apart / shared:.2f}x faster")
    finally:
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
