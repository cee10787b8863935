"""Every malformed or hostile job folder of stepscope.testing.hostile_jobs, through the
trial and `stepscope check`: no traceback, no hang, nothing read or written outside the
job, intact steps read back exactly, unreadable files named (and check exits 2)."""

from __future__ import annotations

import json
import time

import numpy as np
import pytest

from stepscope import create_trial
from stepscope.cli import main
from stepscope.exceptions import StepscopeError
from stepscope.testing import hostile_jobs
from stepscope.testing.hostile_jobs import CANARY, CASES, build, expected_value, outside_snapshot

BOUND_S = 10.0  # each case: far above what it takes, far below a hang


def _values(trial, step):
    try:
        return trial.tensor("fc.weight").value(step)
    except StepscopeError as exc:
        return exc


@pytest.mark.timeout(60)
@pytest.mark.parametrize("case", CASES)
def test_trial_reads_what_is_intact_and_names_what_is_not(case, tmp_path):
    job = build(case, tmp_path)
    before = outside_snapshot(job)
    started = time.monotonic()
    trial = create_trial(str(job.job))
    for step in job.intact_steps:
        np.testing.assert_array_equal(trial.tensor("fc.weight").value(step), expected_value(step))
    for step in set(trial.steps()) - set(job.intact_steps):
        value = _values(trial, step)  # a damaged step: an error naming a file, or its true value
        if isinstance(value, StepscopeError):
            assert str(job.job) in str(value) or "outside the job" in str(value) or "not available" in str(value), value
        else:
            assert value.tobytes() != CANARY
            np.testing.assert_array_equal(value, expected_value(step))
    for name in trial.collections():
        trial.tensor_names(collection=name)
    if job.unreadable:
        assert trial.problems and all(str(job.job) in p for p in trial.problems), trial.problems
    assert time.monotonic() - started < BOUND_S
    assert outside_snapshot(job) == before


@pytest.mark.timeout(60)
@pytest.mark.parametrize("case", CASES)
def test_check_exits_cleanly_and_writes_only_inside_the_job(case, tmp_path, capsys):
    job = build(case, tmp_path)
    before = outside_snapshot(job)
    started = time.monotonic()
    status = main(["check", str(job.job), "--rule", "ExplodingTensor", "--rule", "AllZero", "--quiet"])
    captured = capsys.readouterr()
    assert time.monotonic() - started < BOUND_S
    assert "Traceback" not in captured.err + captured.out
    if job.unreadable:
        assert status == 2 and "could not be read" in captured.err, captured.err
    else:
        assert status in (0, 1, 2)
    assert outside_snapshot(job) == before
    assert (job.job / "rule-output/summary.json").is_file()
    # The default set: profiler rules too, where the job has profiler data.
    status = main(["check", str(job.job), "--quiet", "--no-write"])
    captured = capsys.readouterr()
    assert status in (0, 1, 2) and "Traceback" not in captured.err + captured.out
    assert outside_snapshot(job) == before


def test_the_catastrophic_regex_is_bounded(tmp_path):
    job = build("collections_catastrophic_regex", tmp_path)
    trial = create_trial(str(job.job))
    started = time.monotonic()
    for _ in range(50):
        assert trial.tensor_names(collection="evil") == []
    assert time.monotonic() - started < 2.0


def test_a_step_table_that_disagrees_loses_to_the_index_files(tmp_path, caplog):
    job = build("step_table_disagrees_with_index", tmp_path)
    trial = create_trial(str(job.job))
    for step in range(hostile_jobs.STEPS):
        np.testing.assert_array_equal(trial.tensor("fc.weight").value(step), expected_value(step))


def test_a_mistyped_path_raises_and_check_creates_nothing(tmp_path, capsys):
    typo = tmp_path / "typo"
    with pytest.raises(FileNotFoundError, match="typo"):
        create_trial(str(typo))
    for extra in ([], ["--watch", "--timeout", "1"]):
        assert main(["check", str(typo), *extra]) == 2
        assert "mistyped" in capsys.readouterr().err
    assert not typo.exists()


@pytest.mark.parametrize(
    "args, message",
    [
        (["--poll-interval", "-1"], "positive"),
        (["--poll-interval", "0"], "positive"),
        (["--poll-interval", "nan"], "positive"),
        (["--timeout", "x"], "number of seconds"),
    ],
)
def test_bad_numbers_on_the_command_line_exit_2(tmp_path, capsys, args, message):
    job = build("event_file_truncated", tmp_path)
    assert main(["check", str(job.job), "--watch", *args]) == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize(
    "config, message",
    [
        ({"CollectionConfigurations": [], "DebugRuleConfigurations": 5}, ""),
        ({"DebugRuleConfigurations": [{"RuleConfigurationName": "x", "RuleParameters": {"rule_to_invoke": "AllZero", "tensor_regex": "("}}]}, ""),
    ],
)
def test_bad_rules_configs_exit_2_without_traceback(tmp_path, capsys, config, message):
    job = build("event_file_truncated", tmp_path)
    path = tmp_path / "rules.json"
    path.write_text(json.dumps(config))
    assert main(["check", str(job.job), "--rules-config", str(path), "--quiet"]) == 2
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err and message in captured.err


def test_rule_output_names_cannot_leave_the_job(tmp_path, capsys):
    job = build("event_file_truncated", tmp_path)
    path = tmp_path / "rules.json"
    path.write_text(json.dumps({"DebugRuleConfigurations": [{"RuleConfigurationName": "../../../escaped_report", "RuleParameters": {"rule_to_invoke": "AllZero"}}]}))
    before = outside_snapshot(job)
    status = main(["check", str(job.job), "--rules-config", str(path), "--quiet"])
    capsys.readouterr()
    assert status in (0, 1, 2)
    assert outside_snapshot(job) == before
    assert not list(tmp_path.rglob("escaped_report*")) or all(str(job.job / "rule-output") in str(p) for p in tmp_path.rglob("escaped_report*"))
    assert list((job.job / "rule-output").glob("*escaped_report.json"))
