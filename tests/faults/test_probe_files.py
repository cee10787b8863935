"""The fast part of the file probe (stepscope.testing.probe_files; the full run is
bench/bench_probe_files.py): a real job with a link planted at the folders the issue
named, hostile files of the kinds that used to hang or print tracebacks, and special files
as outputs, each through the command line readers that touch them, in child processes
watched for any file opened or changed outside the job."""

from __future__ import annotations

import pytest

from stepscope.testing.probe_files import all_cases, make_base_job, run_case

pytestmark = pytest.mark.heavy

# (case, readers): what the issue found broken, one reader or two each.
FAST = [
    ("link:rule-output", ["check"]),
    ("link:stepscope-traces", ["profile"]),
    ("link:stepscope-traces/pytorch/detailed/rank0", ["profile"]),
    ("link:events", ["export-hdf5"]),
    ("trace:gzip-of-2GiB-whitespace", ["profile"]),
    ("trace:rank-1e20", ["profile"]),
    ("table:forged-schema", ["profile"]),
    ("metrics:deep-line", ["report"]),
    ("rule-output:violations-text", ["report"]),
    ("output:symlink", ["export-hdf5"]),
    ("output:device", ["timeline"]),
]


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    return make_base_job(tmp_path_factory.mktemp("probe") / "job")


@pytest.fixture(scope="module")
def cases(base):
    return {case.name: case for case in all_cases(base)}


@pytest.mark.timeout(600)
@pytest.mark.parametrize("name, readers", FAST, ids=[name for name, _ in FAST])
def test_case_is_clean(name, readers, base, cases, tmp_path):
    outcomes = run_case(cases[name], base, tmp_path, readers)
    assert outcomes and len(outcomes) == len(readers)
    for outcome in outcomes:
        assert outcome.verdict == "clean", (outcome.reader, outcome.verdict, outcome.detail, outcome.touched)


def test_the_detector_sees_a_read_through_a_link(tmp_path):
    # What makes "0 escapes" mean something: a plain read through a planted link is seen.
    from stepscope.testing.probe_files import _Inotify

    outside, job = tmp_path / "outside", tmp_path / "job"
    outside.mkdir()
    job.mkdir()
    (outside / "secret.json").write_bytes(b"x")
    (job / "rule-output").symlink_to(outside)
    watch = _Inotify(outside)
    try:
        assert watch.events() == []
        (job / "rule-output" / "secret.json").read_bytes()
        assert any(path.endswith("/secret.json") for path in watch.events())
    finally:
        watch.close()
