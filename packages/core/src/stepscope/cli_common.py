"""What every `stepscope` subcommand shares: its exit statuses, the error that means "bad
arguments", how a subcommand registers, and the one reading of `--steps A:B`. Imports nothing
of stepscope but its exceptions, so that the top-level CLI and the sub-CLIs (export, report,
profile, timeline, ui) all stand on it without importing each other."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

from .exceptions import ConfigError

EXIT_OK = 0
EXIT_FIRED = 1  # `check`: a rule fired
EXIT_ERROR = 2  # bad arguments, unreadable data, a hook that failed
# No rule could judge the job (each said "no data" or "not enough data"): a CI gate must
# not pass a job that nothing judged.
EXIT_NOT_JUDGED = 3
EXIT_INTERRUPTED = 130  # Ctrl-C, as a shell reports SIGINT


class UsageError(Exception):
    """Bad arguments or unreadable data: exit status 2 with a one-line message."""


def require_saved_data(store: Any, hint: str = "wrong path?") -> None:
    """UsageError naming the store when nothing at all is saved there (one cheap look, not
    a listing of the whole job)."""
    if store.is_empty():
        raise UsageError(f"no saved data at {store.describe()} ({hint})")


JOB_PATH_HELP = "the job's folder or s3:// URL"


def add_command(
    sub: argparse._SubParsersAction, name: str, run: Callable[[argparse.Namespace], int], *, summary: str, description: str | None = None,
) -> argparse.ArgumentParser:
    """Registers the subcommand NAME: `summary` is its line in `stepscope --help`, `description`
    heads its own --help (reflowed, so a module docstring serves), and `stepscope.cli.main`
    returns `run(args)` as the exit status."""
    parser = sub.add_parser(name, help=summary, description=description)
    parser.set_defaults(run=run)
    return parser


def add_progress_option(parser: argparse.ArgumentParser) -> None:
    """--progress / --no-progress, for the commands that read a whole job."""
    parser.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None, help="progress bar on stderr (default: on a terminal)")


STEPS_HELP = "steps A to B, both included; either end may be left out (A:, :B), and A alone is one step"


def parse_steps(text: str | None, option: str = "--steps") -> tuple[int | None, int | None] | None:
    """`A:B` -> (A, B), the steps from A to B with both ends included; `A:` and `:B` leave
    one end open (None), `A` is the one step A. None (or blank, or `:`) -> None: every step.

    Both ends are included because that is how people say a range of steps ("steps 100 to
    102" holds step 102, as `seq`, `sed -n 10,20p` and a print dialog's pages do), and it
    lets `A` and `A:A` name a single step. `stepscope export` used to read B as excluded (a
    Python slice); it says so when a command's output would differ (see export/cli.py)."""
    if text is None or text.strip() in ("", ":"):
        return None
    first_text, sep, last_text = text.strip().partition(":")
    try:
        first = int(first_text) if first_text.strip() else None
        last = (int(last_text) if last_text.strip() else None) if sep else first
    except ValueError:
        raise ConfigError(f"{option} must be A:B, A:, :B or A with whole step numbers, got {text!r}") from None
    for value in (first, last):
        if value is not None and value < 0:
            raise ConfigError(f"{option} {text!r}: steps are numbered from 0, got {value}")
    if first is not None and last is not None and last < first:
        raise ConfigError(f"{option} {text!r}: the last step ({last}) is before the first ({first})")
    return first, last


__all__ = [
    "EXIT_OK", "EXIT_FIRED", "EXIT_ERROR", "EXIT_NOT_JUDGED", "EXIT_INTERRUPTED",
    "UsageError", "STEPS_HELP", "parse_steps", "require_saved_data", "JOB_PATH_HELP", "add_command", "add_progress_option",
]
