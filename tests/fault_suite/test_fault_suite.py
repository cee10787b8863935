"""The fast subset of the labelled fault suite (the full one: bench/bench_fault_suite.py):
real CPU training of healthy jobs and of jobs with a planted fault, judged by the default
`stepscope check` rule set. A healthy job must get no finding; a faulty one must be caught
by a rule that names that fault, with its evidence and advice."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("stepscope_torch")

_spec = importlib.util.spec_from_file_location("stepscope_fault_suite_jobs", Path(__file__).with_name("jobs.py"))
suite = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = suite
_spec.loader.exec_module(suite)

FAST = [job for job in suite.JOBS if job.fast]


def test_the_fast_subset_covers_both_labels():
    assert any(j.fault is None for j in FAST) and sum(j.fault is not None for j in FAST) >= 4
    assert len({j.name for j in suite.JOBS}) == len(suite.JOBS)
    assert all(j.caught_by for j in suite.JOBS if j.fault)


@pytest.mark.heavy
@pytest.mark.parametrize("job", FAST, ids=[j.name for j in FAST])
def test_default_check_on_the_fast_subset(job, tmp_path):
    job.train(tmp_path / job.name)
    reports = suite.check(tmp_path / job.name)
    verdict = suite.judge(job, reports)
    assert verdict["ok"], verdict
    if job.fault is None:
        assert all(r.status in ("ok", "no data") for r in reports), [(r.rule, r.summary()) for r in reports if r.status not in ("ok", "no data")]
        return
    right = next(r for r in reports if r.fired and r.rule in job.caught_by)
    evidence = right.evidence[0]
    # Explained: where (mode step and global step), what, the measured value, the threshold.
    # Overfitting is found at an evaluation (EVAL), the others at a training step.
    assert evidence.step is not None and evidence.mode in ("TRAIN", "EVAL") and f"{evidence.mode} step {evidence.mode_step} (global {evidence.step})" == evidence.where
    assert evidence.message and (evidence.tensor or evidence.value is not None)
    assert right.explanation is not None and right.explanation.advice and right.explanation.causes
