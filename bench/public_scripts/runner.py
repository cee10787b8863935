"""Train one run of the suite and judge it with the default rule set (what `stepscope check
PATH` runs). `python -m public_scripts.runner PROGRAM CONFIG FAULT OUT_DIR` (from bench/)
prints the verdict as one JSON line: the benchmark runs each run in its own process."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

from .catalogue import Run, by_name, expected_rules


def check(out_dir: Path) -> list:
    """The default `stepscope check` over a job: its reports (nothing written)."""
    from stepscope import create_trial
    from stepscope.rules import default_rules, run_rules

    trial = create_trial(str(out_dir))
    return run_rules(default_rules(trial))


def judge(run: Run, reports: list) -> dict:
    """What the default set said: the rules that fired, every rule's status, and whether
    that is right (healthy: no finding but those of the program's published defect; faulty:
    a rule of the fault's `caught_by`)."""
    fired = sorted(r.rule for r in reports if r.fired)
    return verdict_from(run, fired, {r.rule: r.status for r in reports}, {r.rule: r.summary() for r in reports if r.fired})


def verdict_from(run: Run, fired: list[str], statuses: dict, evidence: dict) -> dict:
    """`judge` from the rules that fired (also used to judge saved results again)."""
    planted, defect = expected_rules(run)
    right = [rule for rule in fired if rule in planted]
    ok = bool(right) if run.fault else not [rule for rule in fired if rule not in defect]
    return {"run": run.label, "program": run.program, "config": run.config, "fault": run.fault, "fired": fired, "right": right,
            "ok": ok, "defect_found": sorted(defect & set(fired)), "statuses": statuses, "evidence": evidence}


def train_and_judge(run: Run, out_dir: Path) -> dict:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    program = by_name(run.program)
    cpu = time.process_time()
    started = time.perf_counter()
    program.train()(out_dir, run.config, run.fault)
    trained = time.perf_counter() - started
    started = time.perf_counter()
    verdict = judge(run, check(out_dir))
    # CPU seconds of this process: what the run costs on an idle machine, whatever the load.
    verdict.update(train_s=round(trained, 2), check_s=round(time.perf_counter() - started, 2), cpu_s=round(time.process_time() - cpu, 2))
    return verdict


def main(argv: list[str]) -> int:
    program, config, fault, out_dir = argv
    verdict = train_and_judge(Run(program, config, None if fault in ("-", "healthy") else fault), Path(out_dir))
    print("VERDICT " + json.dumps(verdict), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
