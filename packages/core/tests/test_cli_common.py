"""The CLI's shared parts: one reading of `--steps A:B` (both ends included) in every
command, and the note `export` prints where that reading changes what it exports."""

from __future__ import annotations

import h5py
import numpy as np
import pytest

from stepscope import cli, cli_common
from stepscope.cli_common import parse_steps
from stepscope.exceptions import ConfigError
from stepscope.export.selection import Selection
from stepscope.traces.analysis import parse_steps as trace_steps


@pytest.mark.parametrize(
    ("text", "expected"),
    [("3:5", (3, 5)), ("3", (3, 3)), ("3:3", (3, 3)), ("3:", (3, None)), (":5", (None, 5)), (" 2 : 4 ", (2, 4)), (None, None), ("", None), (":", None)],
)
def test_parse_steps(text, expected):
    assert parse_steps(text) == expected


@pytest.mark.parametrize(("text", "message"), [("a:b", "whole step numbers"), ("5:3", "before the first"), ("-1:2", "numbered from 0"), ("1:2:3", "whole step numbers")])
def test_parse_steps_refuses_with_the_option_named(text, message):
    with pytest.raises(ConfigError, match=message) as info:
        parse_steps(text, option="--steps")
    assert "--steps" in str(info.value)


def test_every_reader_of_steps_agrees(tmp_path, write_job):
    # profile/timeline's range and export's selection hold the same steps for one text.
    write_job(str(tmp_path / "job"), steps=8, eval_steps=0)
    from stepscope.trial import create_trial

    trial = create_trial(str(tmp_path / "job"))
    for text in ("2:5", "3", "6:", ":1"):
        first, last = trace_steps(text)
        exported = Selection.from_args(steps=text).global_steps(trial)
        assert exported == [s for s in range(8) if first <= s <= last], text


def test_cli_modules_share_one_set_of_exit_codes():
    from stepscope.export import cli as export_cli
    from stepscope.report import cli as report_cli

    assert cli.UsageError is cli_common.UsageError
    assert (cli.EXIT_OK, cli.EXIT_FIRED, cli.EXIT_ERROR, cli.EXIT_NOT_JUDGED) == (0, 1, 2, 3)
    for module in (export_cli, report_cli):
        assert not hasattr(module, "EXIT_ERROR") or module.EXIT_ERROR is cli_common.EXIT_ERROR


def _exported_steps(path):
    with h5py.File(path) as h5:
        return sorted(set(int(s) for s in h5["tensors"]["loss"]["step"][:]))


def test_export_includes_the_end_and_says_so_where_that_changed(tmp_path, write_job, capsys):
    written, _ = write_job(str(tmp_path / "job"), steps=6, eval_steps=0)
    job = str(tmp_path / "job")
    assert cli.main(["export", job, "--hdf5", str(tmp_path / "a.h5"), "--steps", "1:3", "--no-progress"]) == 0
    assert _exported_steps(tmp_path / "a.h5") == [1, 2, 3]
    err = capsys.readouterr().err
    assert "includes step 3" in err and "--steps 1:2" in err
    # The old spelling it suggests gives the old selection (steps 1 and 2).
    assert cli.main(["export", job, "--hdf5", str(tmp_path / "b.h5"), "--steps", "1:2", "--no-progress"]) == 0
    assert _exported_steps(tmp_path / "b.h5") == [1, 2]
    with h5py.File(tmp_path / "b.h5") as h5:
        np.testing.assert_array_equal(h5["tensors"]["loss"]["values"][:], [written[s]["loss"] for s in (1, 2)])
    capsys.readouterr()
    # Nothing changed where the end is not saved, for one step, or for a range refused before.
    for steps, expected in (("1:40", [1, 2, 3, 4, 5]), ("4", [4]), ("4:4", [4]), (":0", [0])):
        assert cli.main(["export", job, "--hdf5", str(tmp_path / "c.h5"), "--steps", steps, "--no-progress"]) == 0
        assert _exported_steps(tmp_path / "c.h5") == expected, steps
        assert "includes step" not in capsys.readouterr().err, steps


def test_check_on_a_missing_folder_says_so_and_creates_nothing(tmp_path, capsys):
    missing = tmp_path / "typo"
    assert cli.main(["check", str(missing)]) == cli.EXIT_ERROR
    assert "no such folder" in capsys.readouterr().err
    assert cli.main(["check", str(missing), "--watch", "--timeout", "0.3", "--poll-interval", "0.05"]) == cli.EXIT_ERROR
    assert "no such folder" in capsys.readouterr().err
    assert not missing.exists()


def test_the_cli_starts_without_the_analysis_libraries():
    """`stepscope --help` (and every command's argument parsing) loads no pandas, pyarrow,
    matplotlib or DuckDB: each command imports what it needs when it runs (it took ~3 s
    when the report package imported its sections to register its arguments)."""
    import ast
    import subprocess
    import sys

    code = ("import sys; from stepscope.cli import build_parser; build_parser(); "
            "print(sorted(m for m in ('pandas', 'pyarrow', 'matplotlib', 'duckdb', 'numpy') if m in sys.modules))")
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    heavy = ast.literal_eval(loaded)  # a list literal printed by the child
    assert not set(heavy) & {"pandas", "pyarrow", "matplotlib", "duckdb"}, heavy


def test_every_subcommand_registers_a_run_a_summary_and_a_description():
    # add_command: each subcommand's line in `stepscope --help`, its own --help and the
    # function main calls; a module docstring used as the description is reflowed.
    parser = cli.build_parser()
    sub = next(action for action in parser._actions if action.dest == "command")
    summaries = {choice.dest: choice.help for choice in sub._choices_actions}
    for name, subparser in sub.choices.items():
        assert callable(subparser.get_default("run")), name
        assert summaries[name], name
    for name in ("export", "report", "ui", "check"):
        text = sub.choices[name].format_help()
        description = text.split("\n\n")[1]
        assert description.split()[0] in ("Export", "Write", "Serve", "Run"), (name, description)
        assert "  " not in description.replace("\n", " "), (name, description)  # reflowed, no docstring indent
