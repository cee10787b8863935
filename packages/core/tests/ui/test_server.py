"""The app's production server (`stepscope.ui.server`, waitress) over real sockets on
127.0.0.1: idle and silent clients never stop service, TLS handshakes never block the
accept loop, idle connections time out, logins are limited atomically and argon2's memory
is bounded under parallel requests; the CLI refuses bad ports and creates no admin for a
store it cannot open."""

from __future__ import annotations

import datetime
import socket
import ssl
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import pytest

from stepscope.exceptions import ConfigError
from stepscope.ui import auth
from stepscope.ui.app import create_app
from stepscope.ui.jobs import JobStore
from stepscope.ui.server import ServerLimits, check_port
from stepscope.ui.users import UserDB

from .browser import LiveServer
from .conftest import PASSWORD

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def certificate(tmp_path_factory):
    """A self-signed certificate for 127.0.0.1 (PEM files), made with `cryptography`."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    folder = tmp_path_factory.mktemp("tls")
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.datetime.now(datetime.timezone.utc)
    import ipaddress

    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(days=1))
            .not_valid_after(now + datetime.timedelta(days=2))
            .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
            .sign(key, hashes.SHA256()))
    cert_file, key_file = folder / "cert.pem", folder / "key.pem"
    cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_file.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
    return str(cert_file), str(key_file)


def _get(url: str, context: ssl.SSLContext | None = None, timeout: float = 10.0, headers: dict[str, str] | None = None) -> tuple[int, bytes, dict[str, str]]:
    request = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=timeout, context=context) as resp:
            return resp.status, resp.read(), dict(resp.headers)
    except urllib.error.HTTPError as err:
        return err.code, err.read(), dict(err.headers)


def _silent_sockets(port: int, count: int) -> list[socket.socket]:
    held = []
    for _ in range(count):
        sock = socket.create_connection(("127.0.0.1", port), timeout=5)
        held.append(sock)
    return held


# --- connections ------------------------------------------------------------------------


def test_140_idle_sockets_do_not_stop_service(app):
    server = LiveServer(app, limits=ServerLimits(connections=100))
    held = _silent_sockets(server.server.port, 140)
    try:
        started = time.monotonic()
        status, body, _ = _get(f"{server.url}/healthz")
        assert status == 200 and b"ok" in body
        assert time.monotonic() - started < 5
        # the limit held: idle sockets were closed (oldest first) to let the request in
        assert server.server.open_connections() <= server.server.connection_limit
        closed = sum(1 for sock in held if _closed_by_server(sock, wait=0.05))
        assert closed >= 140 - server.server.connection_limit
    finally:
        for sock in held:
            sock.close()
        server.stop()


def _closed_by_server(sock: socket.socket, wait: float) -> bool:
    sock.settimeout(wait)
    try:
        return sock.recv(1) == b""
    except TimeoutError:
        return False
    except OSError:
        return True


_SERVE_UNDER_128_DESCRIPTORS = """
import resource, sys, tempfile
resource.setrlimit(resource.RLIMIT_NOFILE, (128, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
from stepscope.ui.app import create_app
from stepscope.ui.server import WebServer
from stepscope.ui.users import UserDB
folder = tempfile.mkdtemp()
server = WebServer(create_app(folder, UserDB(folder + "/u.db", argon2_memory_kib=256, argon2_time_cost=1)), "127.0.0.1", 0)
print(server.port, server.connection_limit, flush=True)
server.run()
"""


def test_140_idle_sockets_against_a_128_descriptor_limit():
    """The issue's case: a server process limited to 128 descriptors, 140 idle clients."""
    import os
    import subprocess
    import sys

    proc = subprocess.Popen([sys.executable, "-c", _SERVE_UNDER_128_DESCRIPTORS], stdout=subprocess.PIPE, text=True,
                            env=os.environ | {"PYTHONPATH": os.pathsep.join(sys.path)})
    held: list[socket.socket] = []
    try:
        port, limit = (int(v) for v in proc.stdout.readline().split())
        assert limit == 128 - 32  # kept below the descriptor limit, so accept() never fails for want of one
        held = _silent_sockets(port, 140)
        started = time.monotonic()
        assert _get(f"http://127.0.0.1:{port}/healthz")[0] == 200
        assert time.monotonic() - started < 5 and proc.poll() is None
    finally:
        for sock in held:
            sock.close()
        proc.kill()
        proc.wait(10)
        proc.stdout.close()


def test_idle_connections_time_out(app):
    server = LiveServer(app, limits=ServerLimits(idle_timeout_s=0.5))
    try:
        [sock] = _silent_sockets(server.server.port, 1)
        started = time.monotonic()
        assert _closed_by_server(sock, wait=10.0)
        assert time.monotonic() - started < 8
        sock.close()
        slow = socket.create_connection(("127.0.0.1", server.server.port), timeout=5)
        slow.sendall(b"GET /healthz HTTP/1.1\r\nHost: localhost\r\n")  # never finishes its headers
        assert _closed_by_server(slow, wait=10.0)
        slow.close()
    finally:
        server.stop()


def test_a_server_whose_wake_up_pipe_is_closed_still_stops(app):
    """stop() where waitress's trigger is gone (CI saw EBADF from it once): no exception, the
    serving loop returns, the port is given back."""
    server = LiveServer(app)
    assert _get(f"{server.url}/healthz")[0] == 200
    server.server._server.trigger.close()
    server.stop()
    assert not server.thread.is_alive()
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", server.server.port), timeout=1).close()


def test_a_request_trickled_a_byte_at_a_time_is_cut_off(app):
    """Each byte resets waitress's idle clock; the whole request still has one timeout."""
    server = LiveServer(app, limits=ServerLimits(idle_timeout_s=1.0))
    try:
        sock = socket.create_connection(("127.0.0.1", server.server.port), timeout=5)
        started = time.monotonic()
        closed = False
        for byte in b"GET /healthz HTTP/1.1\r\nHost: localhost\r\nX-Slow: " + b"a" * 200:
            try:
                sock.sendall(bytes([byte]))
            except OSError:
                closed = True
                break
            if _closed_by_server(sock, wait=0.25):
                closed = True
                break
        assert closed and time.monotonic() - started < 10
        sock.close()
        assert _get(f"{server.url}/healthz")[0] == 200
    finally:
        server.stop()


def test_oversized_headers_are_refused(app):
    server = LiveServer(app, limits=ServerLimits(header_bytes=4096))
    try:
        status, _, _ = _get(f"{server.url}/healthz", headers={"X-Big": "a" * 8000})
        assert status == 431 or status == 400
        assert _get(f"{server.url}/healthz")[0] == 200
    finally:
        server.stop()


# --- TLS --------------------------------------------------------------------------------


def test_tls_client_that_never_sends_a_hello_blocks_nobody(app, certificate):
    cert, key = certificate
    server = LiveServer(app, cert=cert, key=key, limits=ServerLimits(idle_timeout_s=30))
    context = ssl.create_default_context(cafile=cert)
    try:
        silent = _silent_sockets(server.server.port, 5)
        half = socket.create_connection(("127.0.0.1", server.server.port), timeout=5)
        half.sendall(b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03")  # the start of a ClientHello, then nothing
        started = time.monotonic()
        for _ in range(3):
            status, body, headers = _get(f"{server.url}/healthz", context=context)
            assert status == 200 and b"ok" in body
        assert time.monotonic() - started < 5
        assert server.url.startswith("https://")
        for sock in [*silent, half]:
            sock.close()
    finally:
        server.stop()


def test_tls_answers_carry_hsts_and_plain_http_is_dropped(store_root, user_db, certificate):
    cert, key = certificate
    app = create_app(JobStore(str(store_root)), user_db, secure_cookies=True)
    server = LiveServer(app, cert=cert, key=key)
    try:
        status, _, headers = _get(f"{server.url}/login", context=ssl.create_default_context(cafile=cert))
        assert status == 200 and headers["Strict-Transport-Security"].startswith("max-age=")
        with pytest.raises((urllib.error.URLError, ConnectionError, OSError)):
            _get(f"http://127.0.0.1:{server.server.port}/healthz", timeout=5)
        assert _get(f"{server.url}/healthz", context=ssl.create_default_context(cafile=cert))[0] == 200
    finally:
        server.stop()


def test_a_large_answer_arrives_whole_over_tls(app, user_db, certificate):
    cert, key = certificate
    server = LiveServer(app, cert=cert, key=key)
    token = user_db.new_token("alice")
    try:
        status, body, _ = _get(f"{server.url}/api/jobs/team-a/run-1/stats/steps.csv", context=ssl.create_default_context(cafile=cert),
                               headers={"Authorization": f"Bearer {token}"})
        assert status == 200 and body.count(b"\n") == 41  # header + 40 steps
    finally:
        server.stop()


def test_host_header_of_another_site_is_refused_over_the_wire(app):
    server = LiveServer(app)
    try:
        assert _get(f"{server.url}/login", headers={"Host": "rebound.attacker.example"})[0] == 400
        assert _get(f"{server.url}/login")[0] == 200
    finally:
        server.stop()


# --- logins under parallel requests ------------------------------------------------------------


class CountingHasher:
    """The real argon2 hasher, counting verifications and the most running at once."""

    def __init__(self, hasher):
        self._hasher = hasher
        self._lock = threading.Lock()
        self.verified = 0
        self.running = 0
        self.peak = 0

    def hash(self, password):
        return self._hasher.hash(password)

    def verify(self, stored, password):
        with self._lock:
            self.verified += 1
            self.running += 1
            self.peak = max(self.peak, self.running)
        try:
            return self._hasher.verify(stored, password)
        finally:
            with self._lock:
                self.running -= 1


def _login(url: str, name: str, password: str) -> int:
    token = "t" * 32  # the login form's double-submit token: cookie and field must match
    data = urllib.parse.urlencode({"username": name, "password": password, "csrf_token": token}).encode()
    request = urllib.request.Request(f"{url}/login", data=data, headers={"Cookie": f"{auth.LOGIN_CSRF_COOKIE}={token}"})
    opener = urllib.request.build_opener(_NoRedirect)
    try:
        with opener.open(request, timeout=60) as resp:
            return resp.status
    except urllib.error.HTTPError as err:
        return err.code


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args, **kwargs):
        return None


def test_24_parallel_wrong_passwords_verify_at_most_the_limit(store_root, tmp_path):
    db = UserDB(tmp_path / "users.sqlite3", argon2_memory_kib=8 * 1024, argon2_time_cost=2)
    db.add_user("alice", PASSWORD, prefixes=["team-a"])
    db._hasher = counting = CountingHasher(db._hasher)
    limiter = auth.LoginLimiter(attempts=5, window_s=60)
    server = LiveServer(create_app(JobStore(str(store_root)), db, limiter=limiter), limits=ServerLimits(threads=24))
    try:
        with ThreadPoolExecutor(24) as pool:
            statuses = list(pool.map(lambda _: _login(server.url, "alice", "wrong password"), range(24)))
        assert statuses.count(401) <= 5 and statuses.count(401) + statuses.count(429) == 24
        assert counting.verified <= 5  # the other 19 were refused before any hashing
        assert _login(server.url, "alice", PASSWORD) == 429  # the limit holds for the right password too
    finally:
        server.stop()
        db.close()


def test_concurrent_password_checks_are_capped(store_root, tmp_path):
    db = UserDB(tmp_path / "users.sqlite3", argon2_memory_kib=8 * 1024, argon2_time_cost=2, max_concurrent_hashes=2, hash_wait_s=60)
    for i in range(16):
        db.add_user(f"user{i}", PASSWORD)
    db._hasher = counting = CountingHasher(db._hasher)
    limiter = auth.LoginLimiter(attempts=1000, window_s=60)
    server = LiveServer(create_app(JobStore(str(store_root)), db, limiter=limiter), limits=ServerLimits(threads=16))
    try:
        with ThreadPoolExecutor(16) as pool:
            statuses = list(pool.map(lambda i: _login(server.url, f"user{i}", PASSWORD if i % 2 else "wrong password"), range(16)))
        assert statuses.count(302) == 8 and statuses.count(401) == 8
        assert counting.verified == 16 and counting.peak <= 2
    finally:
        server.stop()
        db.close()


def test_no_hashing_slot_answers_503_and_costs_no_attempt(store_root, tmp_path):
    db = UserDB(tmp_path / "users.sqlite3", argon2_memory_kib=1024, argon2_time_cost=1, max_concurrent_hashes=2, hash_wait_s=0.2)
    db.add_user("alice", PASSWORD)
    limiter = auth.LoginLimiter(attempts=2, window_s=60)
    server = LiveServer(create_app(JobStore(str(store_root)), db, limiter=limiter))
    try:
        for _ in range(2):  # every slot taken, as by two long verifications
            assert db._hash_slots.acquire(timeout=1)
        statuses = [_login(server.url, "alice", "wrong password") for _ in range(3)]
        assert statuses == [503, 503, 503]  # not 401: nothing was verified, and not 429: nothing was counted
        for _ in range(2):
            db._hash_slots.release()
        assert _login(server.url, "alice", PASSWORD) == 302
    finally:
        server.stop()
        db.close()


# --- the CLI --------------------------------------------------------------------------------


@pytest.mark.parametrize("port", [99999, -1, 65536])
def test_port_out_of_range_is_an_error(port):
    with pytest.raises(ConfigError, match="--port"):
        check_port(port)


@pytest.mark.parametrize(("option", "value"), [("--threads", "0"), ("--connections", "-5"), ("--idle-timeout", "nan")])
def test_cli_names_the_bad_server_option(store_root, tmp_path, capsys, option, value):
    from stepscope.cli import main

    assert main(["ui", str(store_root), "--port", "0", "--db", str(tmp_path / "u.db"), option, value]) != 0
    assert option in capsys.readouterr().err
    assert not UserDB(tmp_path / "u.db").has_admin()


def test_cli_refuses_a_bad_port_and_a_missing_store_before_creating_the_admin(tmp_path, store_root, capsys):
    from stepscope.cli import main

    db = tmp_path / "users.sqlite3"
    assert main(["ui", str(store_root), "--port", "99999", "--db", str(db)]) != 0
    assert main(["ui", str(tmp_path / "no-such-store"), "--port", "0", "--db", str(db)]) != 0
    captured = capsys.readouterr()
    assert "password" not in captured.err + captured.out
    assert "--port" in captured.err and "no-such-store" in captured.err
    assert not db.exists() or not UserDB(db).has_admin()
