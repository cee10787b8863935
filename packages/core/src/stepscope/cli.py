"""The `stepscope` command. Each subcommand registers itself in `_SUBCOMMANDS` with a
function adding its arguments and one running it; `main(argv)` returns the exit status."""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

from .exceptions import ConfigError, StepscopeError

EXIT_OK, EXIT_FIRED, EXIT_ERROR = 0, 1, 2


class UsageError(Exception):
    """Bad arguments or unreadable data: exit status 2 with a one-line message."""


# --- rule specifications ----------------------------------------------------------------


def parse_rule_spec(spec: str) -> tuple[str, dict[str, str]]:
    """`NAME`, `NAME:key=value,key=value`, `package.module:ClassName` or
    `package.module:ClassName:key=value,...` -> (name, parameters). A comma-separated item
    without `=` continues the previous value, so lists work: `token_values=0,1`."""
    from .rules.registry import BUILTIN_RULES, profiler_rules

    parts = spec.split(":")
    known = parts[0] in BUILTIN_RULES or parts[0] in profiler_rules()
    if len(parts) >= 2 and "=" not in parts[1] and not known:
        name, rest = f"{parts[0]}:{parts[1]}", ":".join(parts[2:])
    else:
        name, rest = parts[0], ":".join(parts[1:])
    if not name.strip(":"):
        raise UsageError(f"--rule {spec!r}: no rule name")
    params: dict[str, str] = {}
    last = None
    for item in rest.split(",") if rest else []:
        if "=" in item:
            key, _, value = item.partition("=")
            last = key.strip()
            if not last:
                raise UsageError(f"--rule {spec!r}: empty parameter name in {item!r}")
            params[last] = value.strip()
        elif last is not None:
            params[last] += "," + item.strip()
        else:
            raise UsageError(f"--rule {spec!r}: expected key=value, got {item!r}")
    return name, params


# --- check ------------------------------------------------------------------------------


def _add_check(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "check",
        help="run rules over a job (after or during training)",
        description=(
            "Run rules over the job at PATH (a folder or s3:// URL). Without --rule or --rules-config "
            "it runs the default set (VanishingGradient, ExplodingTensor, LossNotDecreasing, WeightUpdateRatio, "
            "Overfit). Reports are written to PATH/rule-output/. Exit status: 0 no rule fired, 1 some rule fired, "
            "2 bad usage or unreadable data."
        ),
    )
    parser.add_argument("path", help="the job's folder or s3:// URL")
    parser.add_argument(
        "--rule", action="append", default=[], metavar="NAME[:key=value,...]",
        help="a rule to run (repeatable): a built-in or profiler rule name, or package.module:ClassName",
    )
    parser.add_argument("--rules-config", metavar="FILE", help="JSON file of rule configurations (smdebug_rulesconfig dicts, SageMaker entries)")
    parser.add_argument("--watch", action="store_true", help="follow a running job until it ends (training_job_end.ts)")
    parser.add_argument("--timeout", type=float, default=None, metavar="S", help="with --watch: stop following after S seconds")
    parser.add_argument("--poll-interval", type=float, default=5.0, metavar="S", help="with --watch: longest wait between looks for new steps")
    parser.add_argument("--start-step", type=int, default=0, metavar="N", help="first global step to check")
    parser.add_argument("--end-step", type=int, default=None, metavar="N", help="check steps before N only")
    parser.add_argument("--json", action="store_true", help="print the reports as JSON instead of a table")
    parser.add_argument("--no-write", action="store_true", help="do not write reports to PATH/rule-output/")
    parser.add_argument("--quiet", action="store_true", help="no progress on stderr")
    parser.set_defaults(run=_run_check)


class _Progress:
    """Progress lines on stderr, at most one every `every` seconds, none for a short run."""

    def __init__(self, enabled: bool, every: float = 2.0):
        self.enabled, self.every = enabled, every
        self.started = time.monotonic()
        self.last = self.started

    def __call__(self, done: int, known: int | None, step: int) -> None:
        now = time.monotonic()
        if not self.enabled or now - self.last < self.every:
            return
        self.last = now
        rate = done / max(now - self.started, 1e-9)
        total = f"/{known}" if known else ""
        print(f"stepscope check: {done}{total} steps (at step {step}, {rate:.0f} steps/s)", file=sys.stderr, flush=True)


def _has_profiler_data(trial: Any) -> bool:
    from .layout import PROFILER_DIR

    return bool(trial.store.list(PROFILER_DIR + "/"))


def _build_rules(args: argparse.Namespace, trial: Any) -> tuple[list[Any], list[Any]]:
    """(tensor rules, profiler rules) from --rule, --rules-config, or the default set."""
    from .rules import DEFAULT_RULES
    from .rules.config import load_rules_config, rules_from_config
    from .rules.registry import build_profiler_rule, rule_kind, tensor_rule_class

    tensor_rules: list[Any] = []
    profiler_rules: list[Any] = []
    specs = [parse_rule_spec(s) for s in args.rule]
    if not specs and not args.rules_config:
        specs = [(name, {}) for name in DEFAULT_RULES]
        if _has_profiler_data(trial):
            from .profiler.rules import PROFILER_RULES

            specs += [(name, {}) for name in PROFILER_RULES]
    for name, params in specs:
        kind = rule_kind(name)
        if kind == "profiler":
            profiler_rules.append(build_profiler_rule(name, params))
            continue
        try:
            tensor_rules.append(tensor_rule_class(name)(trial, **params))
        except TypeError as exc:
            raise ConfigError(f"{name}: {exc}") from None
    if args.rules_config:
        from .rules.base import Rule

        for entry in load_rules_config(args.rules_config):
            for rule in rules_from_config(entry, trial):
                (tensor_rules if isinstance(rule, Rule) else profiler_rules).append(rule)
    names = [r.name for r in tensor_rules]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise ConfigError(f"rule name(s) {', '.join(duplicates)} given twice; their reports would overwrite each other")
    return tensor_rules, profiler_rules


def _profiler_row(report: dict[str, Any]) -> dict[str, Any]:
    error = report.get("error")
    fired = bool(report.get("fired"))
    return {
        "rule": str(report.get("rule") or report.get("rule_name") or "?"),
        "kind": "profiler",
        "status": "fired" if fired else "error" if error else "ok",
        "fired": fired,
        "violations": int(report.get("violations") or 0),
        "summary": str(error) if error else f"{report.get('violations', 0)} violation(s) over {report.get('datapoints', 0)} datapoint(s)",
        "report": report,
    }


def _tensor_row(report: Any) -> dict[str, Any]:
    return {
        "rule": report.rule, "kind": "tensor", "status": report.status, "fired": report.fired,
        "violations": report.violations, "summary": report.summary(), "report": report.to_json(),
    }


def _print_table(rows: list[dict[str, Any]], out: Any) -> None:
    if not rows:
        print("no rules were run", file=out)
        return
    width = max(len(r["rule"]) for r in rows)
    print(f"{'RULE':<{width}}  {'STATUS':<7}  {'VIOLATIONS':>10}  DETAIL", file=out)
    for row in rows:
        summary = row["summary"] if len(row["summary"]) <= 110 else row["summary"][:107] + "..."
        print(f"{row['rule']:<{width}}  {row['status']:<7}  {row['violations']:>10}  {summary}", file=out)


def _write_reports(store: Any, rows: list[dict[str, Any]], path: str) -> None:
    from .layout import RULE_OUTPUT_DIR

    for row in rows:
        store.write(f"{RULE_OUTPUT_DIR}/{row['rule']}.json", json.dumps(row["report"], indent=1, default=str).encode())
    summary = {"path": path, "time": time.time(), "rules": [{k: v for k, v in row.items() if k != "report"} for row in rows]}
    store.write(f"{RULE_OUTPUT_DIR}/summary.json", json.dumps(summary, indent=1, default=str).encode())


def _run_check(args: argparse.Namespace) -> int:
    from .rules import run_rules
    from .store import open_store
    from .trial import create_trial

    if args.end_step is not None and args.end_step <= args.start_step:
        raise UsageError(f"--end-step ({args.end_step}) must be greater than --start-step ({args.start_step})")
    store = open_store(args.path)
    if not args.watch and not store.list(""):
        raise UsageError(f"no saved data at {store.describe()} (wrong path? use --watch for a job that has not written yet)")
    trial = create_trial(store)
    tensor_rules, profiler_rules = _build_rules(args, trial)
    progress = _Progress(enabled=not args.quiet)
    rows = []
    if tensor_rules:
        reports = run_rules(
            tensor_rules, args.start_step, args.end_step, watch=args.watch, timeout=args.timeout,
            max_poll_interval=args.poll_interval, progress=progress,
        )
        rows += [_tensor_row(r) for r in reports]
    if profiler_rules:
        from .profiler.rules import run_profiler_rules

        rows += [_profiler_row(r) for r in run_profiler_rules(trial, profiler_rules)]
    if not args.no_write:
        _write_reports(store, rows, store.describe())
    if args.json:
        json.dump([row["report"] | {"status": row["status"], "kind": row["kind"]} for row in rows], sys.stdout, indent=1, default=str)
        print()
    else:
        _print_table(rows, sys.stdout)
    if any(row["fired"] for row in rows):
        return EXIT_FIRED
    return EXIT_ERROR if any(row["status"] == "error" for row in rows) else EXIT_OK


# --- rules (list) -------------------------------------------------------------------------


def _add_rules(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("rules", help="list the rules `check` knows, with their parameters and defaults")
    parser.add_argument("--json", action="store_true")
    parser.set_defaults(run=_run_rules)


def _run_rules(args: argparse.Namespace) -> int:
    from .rules.registry import describe_rules

    described = describe_rules()
    if args.json:
        json.dump(described, sys.stdout, indent=1, default=str)
        print()
        return EXIT_OK
    for rule in described:
        params = ", ".join(f"{k}={v!r}" for k, v in rule["parameters"].items())
        print(f"{rule['name']} ({rule['kind']}): {rule['doc']}\n    {params or '(no parameters)'}")
    return EXIT_OK


# --- entry point ------------------------------------------------------------------------

def _add_ui(sub: argparse._SubParsersAction) -> None:
    from .ui.cli import add_ui  # the app's own module; flask loads only when it runs

    add_ui(sub)


_SUBCOMMANDS: list[Callable[[argparse._SubParsersAction], None]] = [_add_check, _add_rules, _add_ui]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="stepscope", description="Debugger and profiler for deep-learning training.")
    parser.add_argument("-v", "--verbose", action="store_true", help="log debug messages")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for add in _SUBCOMMANDS:
        add(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # argparse exits 2 on bad usage, 0 on --help
        return int(exc.code or 0)
    if not getattr(args, "run", None):
        parser.print_help(sys.stderr)
        return EXIT_ERROR
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.ERROR, format="%(message)s")
    try:
        return args.run(args)
    except (UsageError, ConfigError) as exc:
        print(f"stepscope {args.command}: {exc}", file=sys.stderr)
        return EXIT_ERROR
    except (StepscopeError, OSError) as exc:
        print(f"stepscope {args.command}: cannot read the data: {exc}", file=sys.stderr)
        return EXIT_ERROR
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
