"""Write the report of the job at PATH (a folder or s3:// URL): verdict, rules, training health,
system usage, steps, GPU work and stepscope's own cost, as one HTML file that needs no network.
Written next to the job (stepscope-report.html) unless -o says where.
"""
# The docstring above is `stepscope report --help`'s description.

from __future__ import annotations

import argparse
import sys

from ..cli_common import JOB_PATH_HELP, add_command, add_progress_option


def add_parser(sub: argparse._SubParsersAction) -> None:
    parser = add_command(sub, "report", run, summary="write one self-contained HTML report (and PDF) of a job", description=__doc__)
    parser.add_argument("path", help=JOB_PATH_HELP)
    parser.add_argument("-o", "--output", metavar="FILE", help="where to write the HTML (a local path)")
    parser.add_argument("--pdf", action="store_true", help="also print it to PDF beside the HTML (headless Chromium)")
    parser.add_argument(
        "--rules", choices=("auto", "saved", "run", "none"), default="auto",
        help="rule results: saved (rule-output/ from `stepscope check`), run (the default rules, now), auto (saved if any, else run), none",
    )
    add_progress_option(parser)


def run(args: argparse.Namespace) -> int:
    from ..cli_common import EXIT_OK, require_saved_data
    from ..progress import ProgressBar
    from ..store import open_store
    from ..trial import create_trial
    from .build import write_report

    store = open_store(args.path)
    require_saved_data(store)
    with ProgressBar("stepscope report", args.progress) as bar:
        written = write_report(create_trial(store), args.output, pdf=args.pdf, rules=args.rules, progress=bar)
    print(f"report: {written.html}", file=sys.stdout)
    if written.pdf:
        print(f"pdf: {written.pdf}", file=sys.stdout)
    return EXIT_OK
