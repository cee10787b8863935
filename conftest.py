"""Fixtures shared by every package's tests: a real S3-protocol server on loopback. And the
order in which pytest-xdist hands out the test files: the longest first."""

from __future__ import annotations

import json
import os
import uuid
from collections import defaultdict
from pathlib import Path

import pytest

# Seconds per test file (nox -s tests -- --record-durations writes it).
DURATIONS = Path(__file__).resolve().parent / ".ci" / "test_durations.json"
NEW_FILE_S = 10.0  # a file not in the table yet


def pytest_addoption(parser):
    parser.addoption("--record-durations", action="store_true", help=f"write each test file's seconds to {DURATIONS.name} at the end (the files run are updated, the others kept)")


def _file(nodeid: str) -> str:
    return nodeid.split("::", 1)[0]


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config, items):
    """In a pytest-xdist worker (nox runs `--dist loadfile --no-loadscope-reorder`), the files
    go to the workers in the order collected, one whole file to each free worker: the longest
    first, so that no long file (a DDP job, a browser suite) starts when the other workers are
    nearly done. A stable sort: the tests of one file keep their order."""
    if not hasattr(config, "workerinput") or not DURATIONS.is_file():
        return
    seconds = json.loads(DURATIONS.read_text())["seconds"]
    first = {}
    for index, item in enumerate(items):
        first.setdefault(_file(item.nodeid), index)
    items.sort(key=lambda item: (-seconds.get(_file(item.nodeid), NEW_FILE_S), first[_file(item.nodeid)]))


_recorded: defaultdict[str, float] = defaultdict(float)


def pytest_runtest_logreport(report):
    _recorded[_file(report.nodeid)] += report.duration


def pytest_sessionfinish(session):
    # In the controller only (the workers' reports reach it too).
    if not session.config.getoption("--record-durations") or hasattr(session.config, "workerinput") or not _recorded:
        return
    table = json.loads(DURATIONS.read_text()) if DURATIONS.is_file() else {"about": "", "seconds": {}}
    table["seconds"].update({name: round(s, 1) for name, s in _recorded.items()})
    table["seconds"] = dict(sorted(table["seconds"].items(), key=lambda kv: -kv[1]))
    DURATIONS.write_text(json.dumps(table, indent=1) + "\n")


@pytest.fixture(scope="session")
def s3_endpoint():
    """moto's S3 server in a thread on 127.0.0.1 (an ephemeral port): boto3 talks HTTP to
    it exactly as it would to AWS; nothing inside boto3 is patched."""
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    endpoint = f"http://{host}:{port}"
    saved = {k: os.environ.get(k) for k in ("AWS_ENDPOINT_URL_S3", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_DEFAULT_REGION")}
    os.environ.update(
        {"AWS_ENDPOINT_URL_S3": endpoint, "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}
    )
    yield endpoint
    server.stop()
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


@pytest.fixture
def s3_url(s3_endpoint):
    """A fresh bucket on the loopback server; returns s3://bucket/job."""
    import boto3

    bucket = f"test-{uuid.uuid4().hex[:12]}"
    boto3.client("s3").create_bucket(Bucket=bucket)
    return f"s3://{bucket}/job"
