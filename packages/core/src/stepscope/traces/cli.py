"""`stepscope profile` (the trace analyses as tables), registered in stepscope/cli.py's
`_SUBCOMMANDS`, and what the commands reading traces share (`stepscope timeline`, the
merged Perfetto trace, is export/cli.py's)."""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

from ..cli_common import EXIT_OK, STEPS_HELP


class _ProgressBar:
    """A one-line progress bar on stderr while a large trace is parsed (only on a terminal
    or when forced)."""

    def __init__(self, enabled: bool):
        self.enabled = enabled
        self.last = 0.0

    def __call__(self, key: str, done: int, total: int | None) -> None:
        now = time.monotonic()
        if not self.enabled or (now - self.last < 0.2 and (total is None or done < total)):
            return
        self.last = now
        name = key.rsplit("/", 1)[-1][-40:]
        if total:
            filled = int(30 * done / total)
            sys.stderr.write(f"\rparsing {name} [{'#' * filled}{'.' * (30 - filled)}] {done / 1e6:.0f}/{total / 1e6:.0f} MB")
        else:
            sys.stderr.write(f"\rparsing {name} {done / 1e6:.0f} MB")
        if total and done >= total:
            sys.stderr.write("\n")
        sys.stderr.flush()


def add_profile(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("profile", help="kernels, launches, memory copies, syncs and GPU idle time from the job's detailed traces")
    parser.add_argument("path", help="a job's folder, a folder of Kineto/XSpace traces (e.g. tensorboard_trace_handler's output), or one trace file; local or s3://")
    parser.add_argument("--rank", type=int, default=None, help="one rank only (default: every rank)")
    parser.add_argument("--steps", default=None, metavar="A:B", help=f"only the profiled {STEPS_HELP}")
    parser.add_argument("--json", action="store_true", help="print the tables as JSON")
    parser.add_argument("--progress", action="store_true", help="show the parsing progress bar even when stderr is not a terminal")
    parser.add_argument("--job-view", action="store_true", help="the job-wide view from per-rank summaries (ranks, stragglers, top kernels); the default above 16 traces without --rank")
    parser.add_argument("--view", choices=("summary", "operators", "kernels"), default="summary",
                        help="operators: CPU operators by name, by name and input shapes, by call stack (record_shapes / with_stack traces); "
                             "kernels: by name and by launching operator, with grid, block, registers, occupancy, tensor-core use")
    parser.add_argument("--top", type=int, default=20, metavar="N", help="rows per table of --view operators|kernels (0: all)")
    from .cluster_cli import add_engine_arguments

    add_engine_arguments(parser)
    parser.set_defaults(run=run_profile)


def require_pyarrow() -> None:
    """Before anything of the engine is imported (its modules import pyarrow)."""
    from ..exceptions import ConfigError

    try:
        import pyarrow  # noqa: F401
    except ImportError:
        raise ConfigError("the trace engine needs pyarrow, which is not installed: pip install 'stepscope[traces]'") from None


def open_analysis(args: argparse.Namespace) -> Any:
    from .analysis import TraceAnalysis

    progress = _ProgressBar(sys.stderr.isatty() or getattr(args, "progress", False))
    return TraceAnalysis(args.path, progress=progress)


def run_profile(args: argparse.Namespace) -> int:
    require_pyarrow()
    from ..exceptions import ConfigError
    from .analysis import parse_steps

    steps = parse_steps(args.steps)
    analysis = open_analysis(args)
    if not analysis.trace_keys():
        raise ConfigError(
            f"no traces in {args.path}: looked for a job's profiler-output/framework/ and for trace files "
            "(*.json, *.json.gz, *.pt.trace.json[.gz], *.xplane.pb) in the folder and below (see docs/traces.md)"
        )
    if getattr(args, "view", "summary") != "summary":
        return _print_tables(_detail_view(analysis, args), args.json)
    from .cluster_cli import JOB_VIEW_MIN_TRACES, job_view

    if args.rank is None and (args.job_view or args.engine == "ray" or len(analysis.trace_keys()) > JOB_VIEW_MIN_TRACES):
        return _print_tables(job_view(args, analysis), args.json)
    try:
        tables = analysis.summary(rank=args.rank, steps=steps)
    finally:
        analysis.wait_persisted()  # the command is done when the tables are on disk
    from .fanout import summarise_loaded

    summarise_loaded(analysis)
    for problem in analysis.problems.values():
        print(f"stepscope: skipped an unreadable trace: {problem}", file=sys.stderr)
    if not analysis.ranks:
        raise ConfigError(f"no readable detailed trace under {args.path}/profiler-output/framework/")
    unknown = tables.get("not_analysed")
    if unknown is not None and not unknown.empty:  # said on stderr too: a table nobody reads is no warning
        for row in unknown.itertuples():
            print(f"stepscope profile: {row.events:,} events of category {row.category} not analysed (rank {getattr(row, 'rank', 0)})", file=sys.stderr)
    return _print_tables(tables, args.json)


def _detail_view(analysis: Any, args: argparse.Namespace) -> dict[str, Any]:
    """`--view operators|kernels`: the tables of stepscope.traces.details over the Kineto
    traces (of `--rank` only when given)."""
    from ..exceptions import ConfigError
    from . import details

    keys = [k for k in analysis.trace_keys() if k.endswith((".json", ".json.gz"))]
    if args.rank is not None:  # the ranks the trace engine reads from each trace
        traces = analysis.traces()
        keys = [k for k in traces.loc[traces["rank"] == args.rank, "key"] if k in set(keys)]
    if not keys:
        raise ConfigError(f"--view {args.view}: no Kineto JSON trace under {args.path}" + (f" for rank {args.rank}" if args.rank is not None else ""))
    try:
        tables = details.views(analysis.store, keys, k=args.top or None)
    except details.TraceDetailError as exc:
        raise ConfigError(f"--view {args.view}: {exc}") from None
    wanted = ("operators", "operators_by_shapes", "operators_by_stack") if args.view == "operators" else ("kernels", "kernels_by_op")
    out = {name: tables[name] for name in wanted}
    if not args.json:  # C++ kernel signatures run to hundreds of characters: a terminal gets their start
        for frame in out.values():
            if "name" in frame:
                frame["name"] = [n if len(n) <= 70 else n[:67] + "..." for n in frame["name"].astype(str)]
    return out


def _print_tables(tables: dict[str, Any], as_json: bool) -> int:
    if as_json:
        json.dump({name: json.loads(frame.to_json(orient="records")) for name, frame in tables.items()}, sys.stdout, indent=1)
        print()
        return EXIT_OK
    import pandas as pd

    with pd.option_context("display.max_columns", 30, "display.width", 200, "display.max_colwidth", 60, "display.float_format", "{:,.1f}".format):
        for name, frame in tables.items():
            print(f"== {name.replace('_', ' ')}")
            print(frame.to_string(index=False) if not frame.empty else "(none)")
            print()
    return EXIT_OK
