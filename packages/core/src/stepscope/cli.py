"""The `stepscope` command. Each subcommand registers itself in `_SUBCOMMANDS` with a
function adding its arguments and one running it; `main(argv)` returns the exit status."""

from __future__ import annotations

import argparse
import json
import logging
import re
import shutil
import sys
import textwrap
import time
from collections.abc import Callable, Sequence
from typing import Any

from .cli_common import (
    EXIT_ERROR,
    EXIT_FIRED,
    EXIT_INTERRUPTED,
    EXIT_NOT_JUDGED,
    EXIT_OK,
    JOB_PATH_HELP,
    UsageError,
    add_command,
    require_saved_data,
)
from .exceptions import ConfigError, OutputError, StepscopeError
from .layout import INDEX_DIR, STATUS_DIR, status_key

_INDEX_PREFIX = f"{INDEX_DIR}/"


# --- rule specifications ----------------------------------------------------------------


def parse_rule_spec(spec: str) -> tuple[str, dict[str, str]]:
    """`NAME`, `NAME:key=value,...`, `package.module:ClassName[:key=value,...]` -> (name,
    parameters); rules.config.parse_rule_spec, with a --rule usage error."""
    from .rules.config import parse_rule_spec as parse

    try:
        return parse(spec)
    except ConfigError as exc:
        raise UsageError(f"--rule {exc}") from None


# --- check ------------------------------------------------------------------------------


def _add_check(sub: argparse._SubParsersAction) -> None:
    parser = add_command(
        sub, "check", _run_check,
        summary="run rules over a job (after or during training)",
        description=(
            "Run rules over the job at PATH (a folder or s3:// URL). Without --rule or --rules-config it runs "
            "stepscope's default set: every built-in rule whose inputs the job saved (NaN/inf, vanishing gradients, "
            "weight updates, all-zero weights, loss trend, divergence and chance level, slow convergence, overfitting, dead ReLUs and saturated activations when "
            "activations were saved, class imbalance when labels and predictions were), with thresholds tuned not to "
            "fire on healthy training, plus the profiler rules when the job has profiler data; `stepscope rules` "
            "lists them. A rule named with --rule or from --rules-config keeps SageMaker's parameters and meaning. "
            "Every rule says whether it could judge (a rule without the evidence it needs says \"no data\" or "
            "\"not enough data (needs N, has M)\", never \"ok\"); the last line says how many could and what to save for the others. "
            "Reports are written to PATH/rule-output/. Exit status: 0 no rule fired, 1 some rule fired, "
            "2 bad usage, unreadable data, a worker whose hook failed (stepscope-status/) or a job folder two trainings wrote into, "
            "3 no rule fired and none could judge the job (not enough saved data). `--explain RULE` prints what a rule checks and what to do when it fires."
        ),
    )
    parser.add_argument("path", nargs="?", help=JOB_PATH_HELP)
    parser.add_argument(
        "--rule", action="append", default=[], metavar="NAME[:key=value,...]",
        help="a rule to run (repeatable): a built-in or profiler rule name, or package.module:ClassName",
    )
    parser.add_argument("--rules-config", metavar="FILE", help="JSON file of rule configurations (smdebug_rulesconfig dicts, SageMaker entries)")
    parser.add_argument("--explain", metavar="RULE", help="print what RULE checks, its parameters, likely causes and advice, and exit")
    parser.add_argument("--watch", action="store_true", help="follow a running job until it ends (training_job_end.ts)")
    parser.add_argument("--timeout", type=_seconds, default=None, metavar="S", help="with --watch: stop following after S seconds")
    parser.add_argument("--poll-interval", type=_seconds, default=5.0, metavar="S", help="with --watch: longest wait between looks for new steps (> 0)")
    parser.add_argument("--start-step", type=int, default=0, metavar="N", help="first global step to check")
    parser.add_argument("--end-step", type=int, default=None, metavar="N", help="check steps before N only")
    parser.add_argument("--json", action="store_true", help="print the reports as JSON instead of a table")
    parser.add_argument("--no-write", action="store_true", help="do not write reports to PATH/rule-output/")
    parser.add_argument("--quiet", action="store_true", help="no progress on stderr")


def _seconds(text: str) -> float:
    """A positive, finite number of seconds (argparse type): 0 would busy-loop."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, got {text!r}") from None
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"must be a positive number of seconds, got {text!r}")
    return value


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


def _build_rules(args: argparse.Namespace, trial: Any) -> list[Any]:
    """Rules from --rule and --rules-config, or the default set for `trial`."""
    from .rules import default_rules
    from .rules.config import build_rule, load_rules_config, rules_from_config

    if not args.rule and not args.rules_config:
        return default_rules(trial)
    rules = [build_rule(name, trial, params) for name, params in (parse_rule_spec(s) for s in args.rule)]
    if args.rules_config:
        for entry in load_rules_config(args.rules_config):
            rules += rules_from_config(entry, trial)
    names = [r.name for r in rules]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise ConfigError(f"rule name(s) {', '.join(duplicates)} given twice; their reports would overwrite each other")
    if "ProfilerReport" in names:  # the report shows the other rules of this run
        from .report.profiler_report import with_companions

        with_companions(rules)
    return rules


def _explain(name: str) -> int:
    from .rules.registry import rule_class

    cls = rule_class(name)
    described = cls.describe()
    print(f"{described['name']} ({'whole-job' if described['kind'] == 'job' else 'step-wise tensor'} rule)\n")
    print(cls.explain().render())
    params = ", ".join(f"{k}={v!r}" for k, v in described["parameters"].items())
    print(f"\nParameters (SageMaker defaults): {params or '(none)'}")
    if described["preset"]:
        print("In stepscope's default set: " + ", ".join(f"{k}={v!r}" for k, v in described["preset"].items()))
    return EXIT_OK


def _run_check(args: argparse.Namespace) -> int:
    from .rules import format_table, run_rules
    from .rules.output import save_reports
    from .store import open_store
    from .trial import create_trial

    if args.explain:
        return _explain(args.explain)
    if not args.path:
        raise UsageError("give the job's PATH (or --explain RULE)")
    if args.end_step is not None and args.end_step <= args.start_step:
        raise UsageError(f"--end-step ({args.end_step}) must be greater than --start-step ({args.start_step})")
    store = open_store(args.path)
    if not store.root_exists():
        # A job that has not started may not have made its folder yet: --watch waits for it
        # (within --timeout), creating nothing; without --watch a missing folder is a typo.
        deadline = None if args.timeout is None else time.monotonic() + args.timeout
        while args.watch and not store.root_exists() and (deadline is None or time.monotonic() < deadline):
            time.sleep(min(args.poll_interval, 0.5))
        if not store.root_exists():
            raise UsageError(f"no saved data at {store.describe()}: no such folder (a mistyped path?)")
    failed = _failed_hooks(store)
    for worker, cause in failed.items():
        if cause.startswith(_MIXED_PREFIX):  # two trainings wrote this worker's files (job_claim.py)
            print(f"stepscope check: {cause[len(_MIXED_PREFIX):]} ({STATUS_DIR}/{worker}.lock)", file=sys.stderr)
        else:
            print(f"stepscope check: the hook of {worker} failed and switched itself off: {cause} ({status_key(worker)})", file=sys.stderr)
    if failed and not store.list(_INDEX_PREFIX):
        return EXIT_ERROR  # not "no data": the job's hook broke before saving anything
    if not args.watch:
        require_saved_data(store, "wrong path? use --watch for a job that has not written yet")
    trial = create_trial(store)
    rules = _build_rules(args, trial)
    progress = _Progress(enabled=not args.quiet)
    reports = run_rules(
        rules, args.start_step, args.end_step, watch=args.watch, timeout=args.timeout,
        max_poll_interval=args.poll_interval, progress=progress,
    )
    if not args.no_write:
        save_reports(store, reports, store.describe())
    if args.json:
        json.dump([report.to_json() for report in reports], sys.stdout, indent=1)
        print()
    else:
        format_table(reports, sys.stdout)
        if not args.rule and not args.rules_config:
            _print_left_out(trial)
    if trial.problems:
        # Unreadable files are not a rule firing: say which were skipped, and exit 2.
        print(f"stepscope check: {len(trial.problems)} file(s) could not be read and were skipped:", file=sys.stderr)
        for problem in trial.problems[:20]:
            print(f"  {problem}", file=sys.stderr)
    if failed or trial.problems:
        return EXIT_ERROR
    if any(report.fired for report in reports):
        return EXIT_FIRED
    if any(report.status == "error" for report in reports):
        return EXIT_ERROR
    if not any(report.judged for report in reports):
        print("stepscope check: no rule could judge this job (see the DETAIL column for what each needs)", file=sys.stderr)
        return EXIT_NOT_JUDGED
    return EXIT_OK


def _print_left_out(trial: Any) -> None:
    from .rules.registry import left_out_of_default
    from .rules.report import to_save_hints

    left = left_out_of_default(trial)
    if left:
        print(f"{len(left)} default rule(s) not run, the job saved nothing they read; save: {to_save_hints(left)}")


_MIXED_PREFIX = "mixed: "


def _failed_hooks(store: Any) -> dict[str, str]:
    """Worker -> what is wrong: a hook that failed, or files of several trainings ("mixed: ...")."""
    from .trial import Trial

    failed = Trial.failed_workers_in(store)
    statuses = Trial.status_in(store)
    for worker, status in statuses.items():
        if status.get("state") == "mixed" and worker in failed:
            failed[worker] = f"{_MIXED_PREFIX}{worker}: {status.get('error', '')}"
    return failed


# --- rules (list) -------------------------------------------------------------------------


def _add_rules(sub: argparse._SubParsersAction) -> None:
    parser = add_command(sub, "rules", _run_rules, summary="list the rules `check` knows, with their parameters and defaults")
    parser.add_argument("--json", action="store_true")


def _run_rules(args: argparse.Namespace) -> int:
    from .rules.registry import describe_rules

    described = describe_rules()
    if args.json:
        json.dump(described, sys.stdout, indent=1)
        print()
        return EXIT_OK
    width = max(60, min(shutil.get_terminal_size((100, 24)).columns, 120))
    for rule in described:
        params = ", ".join(f"{k}={v!r}" for k, v in rule["parameters"].items())
        marker = " [default set]" if rule["default"] else ""
        definition = " ".join(str(rule["explanation"]["definition"]).split())  # whole, wrapped, never cut
        print(textwrap.fill(f"{rule['name']} ({rule['kind']}){marker}: {definition}", width=width, subsequent_indent="    ", break_on_hyphens=False))
        print(textwrap.fill(params or "(no parameters)", width=width, initial_indent="    ", subsequent_indent="      "))
    return EXIT_OK


# --- entry point ------------------------------------------------------------------------

def _add_trace_commands(sub: argparse._SubParsersAction) -> None:
    # `profile` lives in stepscope/traces/cli.py, `sql` in traces/cluster_cli.py, `timeline`
    # (the merged Perfetto trace: step timeline, system metrics, detailed traces, rule
    # firings) with the other exports in stepscope/export/cli.py.
    from .export.cli import add_timeline
    from .traces.cli import add_profile
    from .traces.cluster_cli import add_sql

    add_profile(sub)
    add_timeline(sub)
    add_sql(sub)


def _add_export(sub: argparse._SubParsersAction) -> None:
    from .export.cli import add_parser

    add_parser(sub)


def _add_report(sub: argparse._SubParsersAction) -> None:
    from .report.cli import add_parser

    add_parser(sub)


def _add_diff(sub: argparse._SubParsersAction) -> None:
    from .diff import add_parser

    add_parser(sub)


def _add_memory(sub: argparse._SubParsersAction) -> None:
    from .traces.snapshot_cli import add_parser

    add_parser(sub)


def _add_ui(sub: argparse._SubParsersAction) -> None:
    from .ui.cli import add_ui  # the app's own module; flask loads only when it runs

    add_ui(sub)


_SUBCOMMANDS: list[Callable[[argparse._SubParsersAction], None]] = [_add_check, _add_rules, _add_trace_commands, _add_export, _add_report, _add_diff, _add_memory, _add_ui]


def _version() -> str:
    from . import __version__

    return __version__


class _Version(argparse.Action):
    """`--version`: the version and, on a second line, which compiled paths run (worked
    out only when asked: it loads the extensions)."""

    def __init__(self, option_strings: list[str], dest: str = argparse.SUPPRESS, **kwargs: Any) -> None:
        super().__init__(option_strings, dest=dest, nargs=0, help="show the version and which compiled paths run, and exit", **kwargs)

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any, option_string: str | None = None) -> None:
        from .compiled import describe

        print(f"{parser.prog} {_version()}\n{describe()}")  # (to stdout, as argparse's own version action)
        parser.exit()


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="stepscope", description="Debugger and profiler for deep-learning training.")
    parser.add_argument("-v", "--verbose", action="store_true", help="log debug messages")
    parser.add_argument("--version", action=_Version)
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
    except OutputError as exc:
        print(f"stepscope {args.command}: {exc}", file=sys.stderr)
        return EXIT_ERROR
    except (StepscopeError, OSError) as exc:
        print(f"stepscope {args.command}: cannot read the data: {exc}", file=sys.stderr)
        return EXIT_ERROR
    except re.error as exc:
        print(f"stepscope {args.command}: bad regular expression {exc.pattern!r}: {exc}", file=sys.stderr)
        return EXIT_ERROR
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except (RecursionError, MemoryError) as exc:
        print(f"stepscope {args.command}: input too deeply nested or too large: {type(exc).__name__}", file=sys.stderr)
        return EXIT_ERROR
    except Exception as exc:  # bad data must never end in a traceback (it is logged with -v)
        logging.getLogger("stepscope").debug("stepscope %s failed", args.command, exc_info=True)
        print(f"stepscope {args.command}: failed on unexpected input: {type(exc).__name__}: {exc}", file=sys.stderr)
        return EXIT_ERROR


__all__ = ["main", "build_parser", "parse_rule_spec", "EXIT_OK", "EXIT_FIRED", "EXIT_ERROR", "EXIT_NOT_JUDGED", "UsageError"]

if __name__ == "__main__":
    sys.exit(main())
