"""The web app's probe, in full (issue 22): over a real server on 127.0.0.1, every hostile
job file (`stepscope.testing.app_probe.HOSTILE_FILES` and the reader's
`stepscope.testing.hostile_jobs.CASES`) and every symlink case x every job endpoint, in
parallel; then idle, silent and half-TLS clients against service, and a flood of parallel
wrong passwords against the login limit and argon2's memory.

    python bench/bench_probe_app.py            # everything
    python bench/bench_probe_app.py --quick    # the app's own hostile files only

Prints cases tried / clean / escapes / tracebacks (500s) / hangs (no answer in 30 s). Goal:
0 escapes, 0 tracebacks, 0 hangs."""

from __future__ import annotations

import argparse
import datetime
import ipaddress
import logging
import shutil
import socket
import ssl
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from stepscope.testing import hostile_jobs
from stepscope.testing.app_probe import ENDPOINTS, Tally, build_hostile_store, plant_links, verdict_hostile, verdict_link
from stepscope.ui import auth
from stepscope.ui.app import create_app
from stepscope.ui.jobs import JobStore
from stepscope.ui.server import ServerLimits, WebServer
from stepscope.ui.users import UserDB

HANG_S = 30.0
PASSWORD = "correct horse battery"


def get(url: str, headers: dict[str, str], context: ssl.SSLContext | None = None) -> tuple[int | None, bytes, float]:
    started = time.monotonic()
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=HANG_S, context=context) as resp:
            return resp.status, resp.read(), time.monotonic() - started
    except urllib.error.HTTPError as err:
        return err.code, err.read(), time.monotonic() - started
    except (TimeoutError, urllib.error.URLError):
        return None, b"", time.monotonic() - started


def serve(app, **options) -> tuple[WebServer, threading.Thread]:
    server = WebServer(app, "127.0.0.1", 0, **options)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    return server, thread


def certificate(folder: Path) -> tuple[str, str]:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(days=1))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
            .sign(key, hashes.SHA256()))
    (folder / "cert.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    (folder / "key.pem").write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
    return str(folder / "cert.pem"), str(folder / "key.pem")


def probe_jobs(root: Path, db: UserDB, quick: bool) -> Tally:
    hostile = build_hostile_store(root)
    if not quick:
        for case in hostile_jobs.CASES:
            made = hostile_jobs.build(case, root.parent / "reader-cases" / case)
            shutil.move(str(made.job), str(root / "team-a" / f"reader-{case}"))
            hostile[f"reader-{case}"] = f"team-a/reader-{case}"
    links = plant_links(root)
    alice = {"Authorization": f"Bearer {db.new_token('alice')}"}
    admin = {"Authorization": f"Bearer {db.new_token('root')}"}
    server, _ = serve(create_app(JobStore(str(root)), db), limits=ServerLimits(threads=8))
    url = f"http://127.0.0.1:{server.port}"
    work = [(case, endpoint.format(job=job), alice, verdict_hostile) for case, job in hostile.items() for endpoint in ENDPOINTS]
    work += [(case, endpoint.format(job=job), who, verdict_link) for case, job in links.items() for endpoint in ENDPOINTS for who in (alice, admin)]
    work += [("jobs list", "/api/jobs", alice, verdict_hostile), ("jobs list (admin)", "/api/jobs?sort=-duration", admin, verdict_link_free)]
    tally = Tally()
    slowest = (0.0, "")
    started = time.monotonic()
    with ThreadPoolExecutor(16) as pool:
        for (case, path, _, verdict), (status, body, seconds) in zip(work, pool.map(lambda w: get(url + w[1], w[2]), work)):
            tally.add(case, path, verdict(status, body))
            slowest = max(slowest, (seconds, path))
    listed = get(url + "/api/jobs", alice)[1]
    if any(job.encode() in listed for job in links.values()):
        tally.add("jobs list", "/api/jobs (a link listed)", "escape")
    print(f"jobs: {len(hostile)} hostile, {len(links)} link cases, {len(ENDPOINTS)} endpoints; 16 requests at a time: "
          f"{time.monotonic() - started:.1f} s, slowest {slowest[0]:.1f} s ({slowest[1]})")
    server.stop()
    return tally


def verdict_link_free(status: int | None, body: bytes) -> str:
    """The administrator's list: must answer, and list no link as a job."""
    if status is None:
        return "hang"
    return "traceback" if status >= 500 else "escape" if b"team-a/link" in body else "clean"


def probe_connections(root: Path, db: UserDB, folder: Path, tally: Tally) -> None:
    cert, key = certificate(folder)
    for tls in (False, True):
        app = create_app(JobStore(str(root)), db, secure_cookies=tls)
        server, _ = serve(app, limits=ServerLimits(connections=100), **({"cert": cert, "key": key} if tls else {}))
        scheme = "https" if tls else "http"
        context = ssl.create_default_context(cafile=cert) if tls else None
        held = [socket.create_connection(("127.0.0.1", server.port), timeout=5) for _ in range(140)]
        half = socket.create_connection(("127.0.0.1", server.port), timeout=5)
        half.sendall(b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" if tls else b"GET / HTTP/1.1\r\nHost: localhost\r\n")
        status, _, seconds = get(f"{scheme}://127.0.0.1:{server.port}/healthz", {}, context)
        case = f"140 idle sockets + a half {'TLS hello' if tls else 'request'}"
        tally.add(case, "/healthz", "hang" if status is None else "clean" if status == 200 else "traceback")
        print(f"{case} ({scheme}): /healthz {status} in {seconds * 1000:.0f} ms; {server.open_connections()} connections open "
              f"(limit {server.connection_limit})")
        for sock in [*held, half]:
            sock.close()
        server.stop()


def rss_mib() -> float:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def probe_logins(root: Path, folder: Path, tally: Tally) -> None:
    db = UserDB(folder / "logins.sqlite3")  # the real argon2 settings: 64 MiB, 3 passes
    db.add_user("alice", PASSWORD)
    for i in range(24):
        db.add_user(f"user{i}", PASSWORD)
    verified = [0]
    counted = threading.Lock()
    real = db._hasher

    class Counting:  # the real hasher, counting verifications
        def hash(self, password: str) -> str:
            return real.hash(password)

        def verify(self, stored: str, password: str) -> bool:
            with counted:
                verified[0] += 1
            return real.verify(stored, password)

    db._hasher = Counting()
    server, _ = serve(create_app(JobStore(str(root)), db, limiter=auth.LoginLimiter()), limits=ServerLimits(threads=32))
    url = f"http://127.0.0.1:{server.port}"

    def login(name: str, address_spread: bool = False) -> int | None:
        token = "t" * 32
        data = urllib.parse.urlencode({"username": name, "password": "wrong password", "csrf_token": token}).encode()
        request = urllib.request.Request(f"{url}/login", data=data, headers={"Cookie": f"{auth.LOGIN_CSRF_COOKIE}={token}"})
        try:
            with urllib.request.urlopen(request, timeout=HANG_S) as resp:
                return resp.status
        except urllib.error.HTTPError as err:
            return err.code
        except (TimeoutError, urllib.error.URLError):
            return None

    before = rss_mib()
    with ThreadPoolExecutor(24) as pool:
        statuses = list(pool.map(lambda _: login("alice"), range(24)))
    peak_one_user = rss_mib()
    print(f"24 parallel wrong passwords for one user: {statuses.count(401)} x 401, {statuses.count(429)} x 429; "
          f"{verified[0]} verified (limit 5); RSS {before:.0f} -> {peak_one_user:.0f} MiB")
    tally.add("24 parallel wrong passwords", "/login", "escape" if verified[0] > 5 else "hang" if None in statuses else "clean")
    # Another address's limit would stop these at 5 too: a fresh limiter lets all 24 reach
    # the hashing cap (4 at once), which is what bounds memory.
    server.stop()
    verified[0] = 0
    server, _ = serve(create_app(JobStore(str(root)), db, limiter=auth.LoginLimiter(attempts=1000)), limits=ServerLimits(threads=32))
    url = f"http://127.0.0.1:{server.port}"
    before = rss_mib()
    sampled = [before]
    done = threading.Event()

    def sample() -> None:
        while not done.wait(0.05):
            sampled.append(rss_mib())

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    with ThreadPoolExecutor(24) as pool:
        statuses = list(pool.map(lambda i: login(f"user{i}"), range(24)))
    done.set()
    sampler.join()
    print(f"24 parallel sign-ins of 24 users (argon2 64 MiB each, 4 at once): {statuses.count(401)} x 401, {statuses.count(503)} x 503; "
          f"{verified[0]} verified; RSS {before:.0f} MiB, peak {max(sampled):.0f} MiB (+{max(sampled) - before:.0f})")
    tally.add("24 parallel sign-ins", "/login", "hang" if None in statuses else "traceback" if 500 in statuses else "clean")
    server.stop()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="the app's own hostile files and the links only")
    args = parser.parse_args()
    logging.disable(logging.CRITICAL)  # the server logs each hostile file's traceback
    folder = Path(tempfile.mkdtemp(prefix="stepscope-probe-app-"))
    try:
        db = UserDB(folder / "users.sqlite3", argon2_memory_kib=256, argon2_time_cost=1)
        db.add_user("alice", PASSWORD, prefixes=["team-a", "team-a-mirror"])
        db.add_user("root", PASSWORD, admin=True)
        root = folder / "store"
        tally = probe_jobs(root, db, args.quick)
        probe_connections(root, db, folder, tally)
        if not args.quick:
            probe_logins(root, folder, tally)
        print(tally.line())
        for problem in tally.problems[:30]:
            print("  " + problem)
        return 0 if (tally.escapes, tally.tracebacks, tally.hangs) == (0, 0, 0) else 1
    finally:
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
