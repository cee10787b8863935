"""Export the job at PATH (a folder or s3:// URL). --tensorboard DIR writes losses, metrics and saved
reductions as scalars and other saved tensors as histograms, one run per mode (tensorboard --logdir DIR).
--hdf5 FILE writes the chosen tensors stacked over steps with step/mode/mode_step/worker index datasets.
"""
# The docstring above is `stepscope export --help`'s description.

from __future__ import annotations

import argparse
import sys
from typing import Any

from ..cli_common import JOB_PATH_HELP, STEPS_HELP, add_command, add_progress_option


def add_parser(sub: argparse._SubParsersAction) -> None:
    parser = add_command(sub, "export", run, summary="export saved tensors to TensorBoard event files or one HDF5 file", description=__doc__)
    parser.add_argument("path", help=JOB_PATH_HELP)
    parser.add_argument("--tensorboard", metavar="DIR", help="write TensorBoard runs under DIR")
    parser.add_argument("--hdf5", metavar="FILE", help="write one HDF5 file")
    parser.add_argument("--regex", action="append", default=[], metavar="R", help="only tensors whose name matches R (repeatable)")
    parser.add_argument("--steps", metavar="A:B", help=f"only {STEPS_HELP}; mode steps with --mode")
    parser.add_argument("--mode", metavar="M", help="only this mode: train, eval, predict or global")
    parser.add_argument("--step-axis", choices=("global", "mode"), default="global", help="TensorBoard x axis: the global step (default) or each mode's step")
    add_progress_option(parser)


def add_timeline(sub: argparse._SubParsersAction) -> None:
    parser = add_command(sub, "timeline", run_timeline, summary="write one Perfetto-loadable trace of the job: metrics, steps, annotations, CPU ops, GPU streams, rule firings")
    parser.add_argument("path", help="a job's folder, a folder of traces, or one trace file; local or s3://")
    parser.add_argument("-o", "--output", default="timeline.json", metavar="FILE", help="trace.json or trace.json.gz (default timeline.json; - for stdout)")
    parser.add_argument("--steps", default=None, metavar="A:B", help=f"only the time of {STEPS_HELP}")
    parser.add_argument("--no-cpu-ops", action="store_true", help="leave CPU operators out (a smaller file)")


def run_timeline(args: argparse.Namespace) -> int:
    from ..traces.cli import open_analysis, require_pyarrow

    require_pyarrow()  # before anything of the trace engine is imported
    from ..cli_common import EXIT_OK
    from ..exceptions import ConfigError
    from ..traces.analysis import parse_steps
    from .perfetto import write_timeline

    if args.output != "-" and not args.output.endswith((".json", ".json.gz")):
        raise ConfigError(f"-o must end in .json or .json.gz (or be -), got {args.output!r}")
    analysis = open_analysis(args)
    try:
        counts = write_timeline(analysis.store, args.output, steps=parse_steps(args.steps), analysis=analysis, include_cpu_ops=not args.no_cpu_ops)
    finally:
        analysis.wait_persisted()
    print(f"wrote {args.output}: " + ", ".join(f"{v} {k}" for k, v in counts.items()) + " (open it in https://ui.perfetto.dev)", file=sys.stderr)
    return EXIT_OK


def run(args: argparse.Namespace) -> int:
    from ..cli_common import EXIT_OK, UsageError, require_saved_data
    from ..progress import ProgressBar
    from ..store import open_store
    from ..trial import create_trial
    from .selection import Selection

    if not args.tensorboard and not args.hdf5:
        raise UsageError("say where to export: --tensorboard DIR and/or --hdf5 FILE")
    selection = Selection.from_args(args.regex, args.steps, args.mode)
    store = open_store(args.path)
    require_saved_data(store)
    trial = create_trial(store)
    if not trial.steps():
        raise UsageError(f"no saved steps at {store.describe()}")
    _warn_if_end_now_included(args.steps, selection, trial)
    done: list[str] = []
    if args.tensorboard:
        from .tensorboard import export_tensorboard

        with ProgressBar("stepscope export --tensorboard", args.progress) as bar:
            tb = export_tensorboard(trial, args.tensorboard, selection, step_axis=args.step_axis, progress=bar)
        done.append(f"TensorBoard: {tb.scalars} scalar and {tb.histograms} histogram values over {tb.steps} steps, runs {', '.join(tb.runs) or '(none)'} in {tb.logdir}")
    if args.hdf5:
        from .hdf5 import export_hdf5

        with ProgressBar("stepscope export --hdf5", args.progress) as bar:
            h5 = export_hdf5(trial, args.hdf5, selection, progress=bar)
        done.append(f"HDF5: {h5.tensors} tensors, {h5.rows} rows in {h5.path}")
    _print(done, sys.stdout)
    return EXIT_OK


def _warn_if_end_now_included(steps: str | None, selection: Any, trial: Any) -> None:
    """`export --steps A:B` used to leave step B out (a Python slice) where `profile` and
    `timeline` took it; now every command includes both ends. Where that changes what this
    command exports (step B is saved), say so, with the spelling of the old selection."""
    if not steps or ":" not in steps or selection.stop is None:
        return  # `A` and `A:` meant nothing else before
    last = selection.stop - 1
    if last <= (selection.start or 0):
        return  # `A:A` was refused and `:0` selected nothing: no working command changes meaning
    if any(selection.position(trial, step) == last for step in selection.global_steps(trial)):
        first = "" if selection.start is None else selection.start
        print(
            f"stepscope export: note: --steps {steps} includes step {last} (both ends are included, as in "
            f"`stepscope profile`; export used to leave the end out); for the old selection write --steps {first}:{last - 1}",
            file=sys.stderr,
        )


def _print(lines: list[str], out: Any) -> None:
    for line in lines:
        print(line, file=out)
