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


def _self_signed(folder):
    import datetime

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key()).serial_number(1)
            .not_valid_before(now - datetime.timedelta(days=1)).not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.IPAddress(__import__("ipaddress").ip_address("127.0.0.1"))]), critical=False)
            .sign(key, hashes.SHA256()))
    (folder / "cert.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    (folder / "key.pem").write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
    return folder / "cert.pem", folder / "key.pem"


def test_serves_https_with_secure_cookies(tmp_path):
    import ssl

    pytest.importorskip("cryptography")
    cert, key = _self_signed(tmp_path)
    write_profiler_job(tmp_path / "store" / "job")
    proc = subprocess.Popen([sys.executable, "-m", "stepscope.cli", "ui", str(tmp_path / "store"), "--port", "0", "--db", str(tmp_path / "u.db"),
                             "--cert", str(cert), "--key", str(key)], stderr=subprocess.PIPE, text=True,
                            env=os.environ | {"PYTHONPATH": os.pathsep.join(sys.path)})
    try:
        match = None
        while match is None:
            line = proc.stderr.readline()
            assert line, "server ended"
            match = re.search(r"serving .* on (https://127\.0\.0\.1:\d+)/", line)
        context = ssl.create_default_context(cafile=str(cert))
        resp = urllib.request.urlopen(f"{match.group(1)}/login", timeout=20, context=context)
        assert resp.status == 200
        assert "Secure" in resp.headers["Set-Cookie"] and "HttpOnly" in resp.headers["Set-Cookie"]
    finally:
        proc.terminate()
        proc.wait(10)
        proc.stderr.close()
