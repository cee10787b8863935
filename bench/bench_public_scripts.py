"""The public-scripts suite (bench/public_scripts/): training programs modelled on public
scripts (pytorch/examples, Lightning examples, keras-io), each run healthy under the
README's one-liner defaults and under its quick-start configuration, and with planted
faults (under the quick-start configuration; --fault-configs for both), each job judged
by the default rule set. Prints per run the rules that fired, per rule its
precision and recall, and the two goals:

    healthy runs with a false finding: N (goal 0); planted faults caught by the right rule: M/K (goal all)

A finding on a healthy run is a false positive; a rule of the fault's expected set
(catalogue.FAULTS) firing on a faulty run is a true positive; a fault that no expected
rule caught is a miss. A defect of a published script itself (catalogue.Program.defect)
is expected on every run of it. Each run is its own process, at most --jobs at a time.

    python bench/bench_public_scripts.py                       # everything (about 12 CPU minutes)
    python bench/bench_public_scripts.py --quick               # healthy runs only
    python bench/bench_public_scripts.py --only torch_mnist,keras_mnist_convnet --configs quickstart
    python bench/bench_public_scripts.py --json results.json --markdown table.md --keep /tmp/jobs
    python bench/bench_public_scripts.py --rescore results.json   # judge saved results against the catalogue again
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

from public_scripts.capture import CONFIGS  # noqa: E402
from public_scripts.catalogue import PROGRAMS, Run, by_name, expected_rules, runs  # noqa: E402


def run_in_process(run: Run, root: Path, timeout: float) -> dict:
    """Train and judge `run` in a fresh interpreter (frameworks do not share a process;
    a crash or hang of one run is that run's result)."""
    out = root / run.label.replace("/", "__")
    shutil.rmtree(out, ignore_errors=True)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "bench"), os.environ.get("PYTHONPATH", "")]),
           "TF_CPP_MIN_LOG_LEVEL": "3", "TF_ENABLE_ONEDNN_OPTS": "0", "OMP_NUM_THREADS": "1"}
    command = [sys.executable, "-m", "public_scripts.runner", run.program, run.config, run.fault or "healthy", str(out)]
    started = time.perf_counter()
    try:
        done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=timeout, cwd=str(root))
    except subprocess.TimeoutExpired:
        return _failed(run, f"timed out after {timeout:.0f} s")
    for line in done.stdout.splitlines():
        if line.startswith("VERDICT "):
            verdict = json.loads(line[len("VERDICT "):])
            verdict["wall_s"] = round(time.perf_counter() - started, 1)
            return verdict
    tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
    return _failed(run, f"exit {done.returncode}: {' | '.join(tail)}")


def _failed(run: Run, error: str) -> dict:
    return {"run": run.label, "program": run.program, "config": run.config, "fault": run.fault, "fired": [], "right": [], "ok": False,
            "statuses": {}, "evidence": {}, "error": error}


def score(results: list[dict]) -> dict:
    """Per rule: true positives (fired on a fault it is expected to catch), false positives
    (fired on a healthy run), misses (expected on a fault and silent); precision and recall
    from those. Plus the two goals."""
    per_rule: dict[str, dict[str, int]] = defaultdict(lambda: {"tp": 0, "fp": 0, "fn": 0, "other": 0})
    for r in results:
        if r.get("error"):
            continue
        planted, defect = expected_rules(Run(r["program"], r["config"], r["fault"]))
        for rule in r["fired"]:
            if rule in planted or rule in defect:
                per_rule[rule]["tp"] += 1
            else:
                per_rule[rule]["fp" if r["fault"] is None else "other"] += 1
        # A planted fault's expected rules that stayed silent; a published defect counts
        # on the healthy runs (a planted fault may hide it) where the rule could judge (the
        # one-liner defaults save no layer outputs, so DeadRelu cannot see the VAE's).
        judged = {rule for rule, status in r.get("statuses", {}).items() if status in ("ok", "fired")}
        for rule in (planted | (defect & judged if r["fault"] is None else set())) - set(r["fired"]):
            per_rule[rule]["fn"] += 1
    table = {}
    for rule, c in sorted(per_rule.items()):
        precision = c["tp"] / (c["tp"] + c["fp"]) if c["tp"] + c["fp"] else None
        recall = c["tp"] / (c["tp"] + c["fn"]) if c["tp"] + c["fn"] else None
        table[rule] = {**c, "precision": precision, "recall": recall}
    healthy = [r for r in results if r["fault"] is None]
    faulty = [r for r in results if r["fault"] is not None]
    return {
        "rules": table,
        "healthy_runs": len(healthy),
        "healthy_with_finding": sum(1 for r in healthy if not r["ok"]),
        "faulty_runs": len(faulty),
        "faults_caught": sum(1 for r in faulty if r["ok"]),
        "errors": sum(1 for r in results if r.get("error")),
    }


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.0f}%"


def _judged(r: dict) -> str:
    """How many of the rules that ran could judge (fired or ok), of all that ran."""
    statuses = r.get("statuses", {})
    return f"{sum(1 for s in statuses.values() if s in ('ok', 'fired'))}/{len(statuses)}"


def _cell(r: dict) -> str:
    if r.get("error"):
        return "ERROR"
    fired = ", ".join(f"{rule} (defect)" if rule in r.get("defect_found", ()) else rule for rule in r["fired"]) or "-"
    verdict = fired if r["ok"] else f"{fired} (WRONG)" if r["fault"] is None else f"{fired} (MISSED)"
    return f"{verdict} [{_judged(r)}]"


def markdown(results: list[dict], scores: dict, command: str) -> str:
    """The tables docs/rules.md publishes."""
    lines = [f"`{command}`, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}:", ""]
    lines += ["Each cell: the rules that fired, then [rules that could judge / rules that ran].", "",
              "| program | run | one-liner defaults | quick-start config |", "|---|---|---|---|"]
    by_key = {(r["program"], r["fault"], r["config"]): r for r in results}
    for program in dict.fromkeys(r["program"] for r in results):
        for fault in dict.fromkeys(r["fault"] for r in results if r["program"] == program):
            cells = [_cell(by_key[(program, fault, c)]) if (program, fault, c) in by_key else "" for c in CONFIGS]
            lines.append(f"| {program} | {fault or 'healthy'} | {cells[0]} | {cells[1]} |")
    lines += ["", "| rule | true positives | false positives | misses | fired on a fault it does not name | precision | recall |",
              "|---|---|---|---|---|---|---|"]
    for rule, s in scores["rules"].items():
        lines.append(f"| {rule} | {s['tp']} | {s['fp']} | {s['fn']} | {s['other']} | {_pct(s['precision'])} | {_pct(s['recall'])} |")
    lines += ["", f"Healthy runs with a false finding: **{scores['healthy_with_finding']} of {scores['healthy_runs']}** (goal 0); "
              f"planted faults caught by the right rule: **{scores['faults_caught']} of {scores['faulty_runs']}** (goal all)."]
    return "\n".join(lines) + "\n"


def print_report(results: list[dict], scores: dict) -> None:
    width = max(len(r["run"]) for r in results)
    print(f"\n{'RUN':<{width}}  {'RESULT':<7} {'JUDGED':>6} RULES THAT FIRED")
    for r in results:
        result = "ERROR" if r.get("error") else "ok" if r["ok"] else "WRONG" if r["fault"] is None else "MISSED"
        print(f"{r['run']:<{width}}  {result:<7} {_judged(r):>6} {r.get('error') or ', '.join(r['fired']) or '-'}")
        for rule, summary in r.get("evidence", {}).items():
            if r["fault"] is None or rule not in r["right"]:
                print(f"{'':<{width}}          {rule}: {summary[:220]}")
    print(f"\n{'RULE':<24} {'TP':>4} {'FP':>4} {'MISS':>5} {'OTHER':>6} {'PRECISION':>10} {'RECALL':>7}")
    for rule, s in scores["rules"].items():
        print(f"{rule:<24} {s['tp']:>4} {s['fp']:>4} {s['fn']:>5} {s['other']:>6} {_pct(s['precision']):>10} {_pct(s['recall']):>7}")
    print(f"\nhealthy runs with a false finding: {scores['healthy_with_finding']} of {scores['healthy_runs']} (goal 0); "
          f"planted faults caught by the right rule: {scores['faults_caught']}/{scores['faulty_runs']} (goal all)"
          + (f"; {scores['errors']} run(s) failed" if scores["errors"] else ""))


def rescore(path: Path, args: argparse.Namespace) -> int:
    """The verdicts of a saved run recomputed from the rules that fired (and their
    statuses) against the catalogue as it is now."""
    from public_scripts.runner import verdict_from

    results = []
    for r in json.loads(path.read_text())["results"]:
        if not r.get("error"):
            r = {**r, **verdict_from(Run(r["program"], r["config"], r["fault"]), r["fired"], r["statuses"], r["evidence"])}
        results.append(r)
    scores = score(results)
    print_report(results, scores)
    if args.markdown:
        Path(args.markdown).write_text(markdown(results, scores, f"python bench/bench_public_scripts.py --rescore {path.name}"))
    return 0 if scores["healthy_with_finding"] == 0 and scores["faults_caught"] == scores["faulty_runs"] else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="healthy runs only")
    parser.add_argument("--only", default="", help="comma-separated program names")
    parser.add_argument("--configs", default=",".join(CONFIGS), help=f"comma-separated, of {', '.join(CONFIGS)}: healthy runs")
    parser.add_argument("--fault-configs", default="quickstart", help="comma-separated: the configs the planted faults run under")
    parser.add_argument("--jobs", type=int, default=max(1, min(os.cpu_count() or 1, 4)), help="runs at a time (default: cores, at most 4)")
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds per run")
    parser.add_argument("--keep", default=None, help="write the jobs here and keep them")
    parser.add_argument("--json", default=None, help="write the results and scores here")
    parser.add_argument("--markdown", default=None, help="write the published tables here")
    parser.add_argument("--rescore", default=None, help="no training: judge the rules that fired in a --json file again")
    args = parser.parse_args(argv)
    if args.rescore:
        return rescore(Path(args.rescore), args)
    programs = [by_name(n) for n in args.only.split(",") if n] or PROGRAMS
    configs = tuple(c for c in args.configs.split(",") if c)
    fault_configs = tuple(c for c in args.fault_configs.split(",") if c)
    unknown = [c for c in configs + fault_configs if c not in CONFIGS]
    if unknown:
        parser.error(f"--configs: unknown {unknown}; known: {', '.join(CONFIGS)}")
    todo = runs(programs, tuple(dict.fromkeys(configs + fault_configs)), faults=not args.quick, fault_configs=fault_configs)
    root = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="stepscope-public-scripts-"))
    root.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    results: list[dict] = []
    try:
        with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
            for r in pool.map(lambda run: run_in_process(run, root, args.timeout), todo):
                results.append(r)
                print(f"{r['run']:<52} {'ok' if r['ok'] else 'ERROR' if r.get('error') else 'WRONG'}  "
                      f"fired={','.join(r['fired']) or '-'}  ({r.get('wall_s', '?')} s)", flush=True)
    finally:
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)
    scores = score(results)
    print_report(results, scores)
    print(f"({len(results)} runs in {time.perf_counter() - started:.0f} s, {args.jobs} at a time)")
    command = "python bench/bench_public_scripts.py" + (" " + " ".join(argv if argv is not None else sys.argv[1:])).rstrip()
    if args.json:
        Path(args.json).write_text(json.dumps({"results": results, "scores": scores}, indent=1))
    if args.markdown:
        Path(args.markdown).write_text(markdown(results, scores, command))
    return 0 if scores["healthy_with_finding"] == 0 and scores["faults_caught"] == scores["faulty_runs"] else 1


if __name__ == "__main__":
    sys.exit(main())
