"""`stepscope ui STORE` as a user starts it: one command, a free port, the first admin
created and announced, a real job served over HTTP on 127.0.0.1."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
import urllib.error
import urllib.request

import pytest

from .conftest import write_profiler_job

pytestmark = pytest.mark.heavy


def test_serves_a_store_on_loopback(tmp_path):
    from stepscope.cli import main

    write_profiler_job(tmp_path / "store" / "team-a" / "run-1")
    db = str(tmp_path / "users.db")
    assert main(["ui", "users", "--db", db, "add", "alice", "--prefix", "team-a"]) == 0
    token_out = subprocess.run([sys.executable, "-m", "stepscope.cli", "ui", "users", "--db", db, "new-token", "alice"],
                               capture_output=True, text=True, check=True, env=os.environ | {"PYTHONPATH": os.pathsep.join(sys.path)})
    token = token_out.stdout.strip()
    proc = subprocess.Popen([sys.executable, "-m", "stepscope.cli", "ui", str(tmp_path / "store"), "--port", "0", "--db", db],
                            stderr=subprocess.PIPE, text=True, env=os.environ | {"PYTHONPATH": os.pathsep.join(sys.path)})
    try:
        lines = []
        deadline = time.monotonic() + 60
        match = None
        while time.monotonic() < deadline:
            line = proc.stderr.readline()
            if not line:  # the process ended
                break
            lines.append(line)
            match = re.search(r"serving .* on (http://127\.0\.0\.1:\d+)/", line)
            if match:
                break
        if match is None:
            pytest.fail(f"server did not start: {lines[-5:]}")
        url = match.group(1)
        assert any("created user 'admin' with password" in line for line in lines)
        with pytest.raises(urllib.error.HTTPError) as denied:
            urllib.request.urlopen(f"{url}/api/jobs", timeout=10)
        assert denied.value.code == 401
        request = urllib.request.Request(f"{url}/api/jobs", headers={"Authorization": f"Bearer {token}"})
        jobs = json.load(urllib.request.urlopen(request, timeout=30))["jobs"]
        assert [j["id"] for j in jobs] == ["team-a/run-1"] and jobs[0]["steps"] == 40
    finally:
        proc.terminate()
        proc.wait(10)
        proc.stderr.close()
