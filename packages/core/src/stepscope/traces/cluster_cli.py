"""`stepscope sql JOB "SELECT ..."` (any question over the job's views, in DuckDB) and the
job-wide view of `stepscope profile` for many ranks (rank overview, stragglers, the job's
top kernels), both from the per-rank summaries (stepscope.traces.cluster)."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

EXIT_OK = 0
FORMATS = ("table", "csv", "json")
# More traces than this and `stepscope profile` without --rank prints the job view from
# the summaries (per-rank detail tables for hundreds of ranks are no answer to read).
JOB_VIEW_MIN_TRACES = 16


def add_engine_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--engine", choices=("local", "ray"), default="local", help="where traces without a summary are parsed: local worker processes (default) or a Ray cluster")
    parser.add_argument("--workers", type=int, default=None, metavar="N", help="parallel parse tasks (default: every core; with ray: the cluster's)")


def add_sql(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("sql", help="answer your own question about a job with SQL (DuckDB) over its summaries, steps, metrics, tensors and trace tables")
    parser.add_argument("path", help="a job's folder, a folder of traces or one trace; local or s3://")
    parser.add_argument("query", help='one SQL statement, e.g. "SELECT rank, avg(step_ns) FROM summary_steps GROUP BY rank" (views: docs/traces.md)')
    parser.add_argument("--format", choices=FORMATS, default="table", help="output format (default table)")
    add_engine_arguments(parser)
    parser.set_defaults(run=run_sql)


def _query(args: argparse.Namespace, analysis: Any = None) -> Any:
    from .cluster import JobQuery
    from .fanout import progress_printer

    progress = progress_printer() if sys.stderr.isatty() else None
    if analysis is not None:  # the traces listed already
        return JobQuery(analysis.store, engine=args.engine, workers=args.workers, progress=progress, keys=analysis.trace_keys())
    return JobQuery(args.path, engine=args.engine, workers=args.workers, progress=progress)


def _say_problems(query: Any, command: str) -> None:
    for key, problem in sorted(query.problems.items()):
        print(f"stepscope {command}: skipped an unreadable trace {key}: {problem}", file=sys.stderr)


def run_sql(args: argparse.Namespace) -> int:
    from ..exceptions import ConfigError

    query = _query(args)
    _say_problems(query, "sql")
    try:
        frame = query.sql(args.query)
    except Exception as exc:  # DuckDB's parser, binder and catalog errors: the user's SQL
        if type(exc).__module__.split(".")[0] not in ("duckdb", "_duckdb"):
            raise
        raise ConfigError(f"the query failed: {exc}".splitlines()[0] + " (views: summary_steps, summary_kernels, windows, steps, phases, system_metrics, tensors, events, kernels; see docs/traces.md)") from None
    finally:
        query.close()
    write_frame(frame, args.format)
    return EXIT_OK


def write_frame(frame: Any, fmt: str) -> None:
    if fmt == "csv":
        frame.to_csv(sys.stdout, index=False)
    elif fmt == "json":
        json.dump(json.loads(frame.to_json(orient="records")), sys.stdout, indent=1)
        print()
    else:
        import pandas as pd

        with pd.option_context("display.max_columns", 40, "display.width", 200, "display.max_colwidth", 60, "display.max_rows", 500):
            print(frame.to_string(index=False) if not frame.empty else "(no rows)")


def job_view(args: argparse.Namespace, analysis: Any = None) -> dict[str, Any]:
    """The tables `stepscope profile` prints for a many-rank job."""
    query = _query(args, analysis)
    _say_problems(query, "profile")
    try:
        steps = getattr(args, "steps", None)
        tables = {
            "ranks": query.rank_overview(),
            "stragglers": query.straggler_ranks(),
            "slow_steps": query.stragglers(),
            "top_kernels": query.top_kernels(10),
        }
        if steps is not None:
            tables["slow_steps"] = tables["slow_steps"][(tables["slow_steps"]["step"] >= steps[0]) & (tables["slow_steps"]["step"] <= steps[1])]
        return tables
    finally:
        query.close()
