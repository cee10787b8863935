"""The labelled fault suite (tests/fault_suite/jobs.py): trains every healthy and every
faulty job on CPU, runs the default `stepscope check` rule set over each, and prints a
table and the one line

    healthy jobs with any finding: N; planted faults caught by the right rule: M/K

    python bench/bench_fault_suite.py            # every job
    python bench/bench_fault_suite.py --quick    # the fast subset the tests run
    python bench/bench_fault_suite.py --only lstm,dead_relu --keep /tmp/suite
    python bench/bench_fault_suite.py --config defaults   # PyTorch jobs hooked without a save_config
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def load_jobs():
    spec = importlib.util.spec_from_file_location("stepscope_fault_suite_jobs", ROOT / "tests" / "fault_suite" / "jobs.py")
    module = importlib.util.module_from_spec(spec)
    assert spec.loader is not None
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="only the fast subset")
    parser.add_argument("--only", default="", help="comma-separated job names")
    parser.add_argument("--keep", default=None, help="write the jobs here and keep them")
    parser.add_argument("--skip-frameworks", default="", help="comma-separated: keras, lightning")
    parser.add_argument(
        "--config", default="quick-start", choices=("quick-start", "defaults", "bare"),
        help="how the PyTorch jobs are hooked: the README's quick start, the same collections without a save_config, or Hook(out_dir)",
    )
    args = parser.parse_args(argv)
    suite = load_jobs()
    os.environ[suite.CONFIG_ENV] = args.config
    jobs = suite.JOBS
    if args.quick:
        jobs = [j for j in jobs if j.fast]
    if args.only:
        jobs = [suite.by_name(n) for n in args.only.split(",")]
    skip = {s for s in args.skip_frameworks.split(",") if s}
    jobs = [j for j in jobs if j.framework not in skip]
    root = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="stepscope-faults-"))
    rows = []
    try:
        for job in jobs:
            out = root / job.name
            shutil.rmtree(out, ignore_errors=True)
            started = time.perf_counter()
            job.train(out)
            trained = time.perf_counter() - started
            started = time.perf_counter()
            reports = suite.check(out)
            checked = time.perf_counter() - started
            row = suite.judge(job, reports)
            row.update(train_s=trained, check_s=checked)
            rows.append(row)
            print(f"{job.name:<20} {'ok' if row['ok'] else 'WRONG':<5} fired={','.join(row['fired']) or '-'}  ({trained:.1f} s + {checked:.1f} s)", flush=True)
    finally:
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)
    print()
    width = max(len(r["job"]) for r in rows)
    print(f"{'JOB':<{width}}  {'FAULT':<42}  {'RESULT':<6}  RULES THAT FIRED")
    for row in rows:
        print(f"{row['job']:<{width}}  {row['fault']:<42}  {'ok' if row['ok'] else 'WRONG':<6}  {', '.join(row['fired']) or '-'}")
    healthy = [r for r in rows if r["fault"] == "-"]
    faulty = [r for r in rows if r["fault"] != "-"]
    false_alarms = sum(1 for r in healthy if r["fired"])
    caught = sum(1 for r in faulty if r["ok"])
    print(f"\n[{args.config}] healthy jobs with any finding: {false_alarms}; planted faults caught by the right rule: {caught}/{len(faulty)}")
    return 0 if false_alarms == 0 and caught == len(faulty) else 1


if __name__ == "__main__":
    sys.exit(main())
