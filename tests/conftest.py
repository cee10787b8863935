"""Fixtures of the cross-package tests (faults, distributed): a fault-injecting HTTP proxy in
front of the S3-protocol test server (real sockets on 127.0.0.1; boto3 talks to it as to
any S3 endpoint)."""

from __future__ import annotations

import random
import re
import socket
import threading
import time
from collections import Counter
from collections.abc import Callable

import pytest

FAULTS = ("drop", "drop_after", "500", "503", "slowdown", "truncate", "stall", "continue_close")

_ERROR_BODY = '<?xml version="1.0" encoding="UTF-8"?><Error><Code>{code}</Code><Message>injected</Message><RequestId>fault</RequestId></Error>'


def _read_head(conn: socket.socket) -> tuple[bytes, bytes] | None:
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = conn.recv(65536)
        if not chunk:
            return None
        data += chunk
    head, _, rest = data.partition(b"\r\n\r\n")
    return head, rest


def _header(head: bytes, name: bytes) -> bytes | None:
    for line in head.split(b"\r\n")[1:]:
        key, _, value = line.partition(b":")
        if key.strip().lower() == name:
            return value.strip()
    return None


def _with_connection_close(head: bytes) -> bytes:
    lines = [line for line in head.split(b"\r\n") if not line.lower().startswith(b"connection:")]
    return b"\r\n".join(lines + [b"Connection: close"])


class FaultProxy:
    """Forwards each request (one per connection) to `upstream`, or injects a fault instead:
    chosen per request by `choose(method, path)` (default: `rates`, a fault -> probability,
    drawn from a seeded generator). Counts requests by method and by fault."""

    def __init__(self, upstream: str, seed: int = 0):
        host, _, port = upstream.removeprefix("http://").partition(":")
        self.upstream = (host, int(port))
        self.rates: dict[str, float] = {}
        self.choose: Callable[[str, str], str | None] | None = None
        self.stall_s = 600.0
        self.requests: list[tuple[str, str]] = []
        self.injected: Counter[str] = Counter()
        self._random = random.Random(seed)
        self._lock = threading.Lock()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._stopped = threading.Event()
        self.url = f"http://127.0.0.1:{self._listener.getsockname()[1]}"
        threading.Thread(target=self._accept, name="fault-proxy", daemon=True).start()

    def count(self, method: str | None = None, pattern: str = "") -> int:
        with self._lock:
            return sum(1 for m, p in self.requests if (method is None or m == method) and re.search(pattern, p))

    def close(self) -> None:
        self._stopped.set()
        self._listener.close()

    def _accept(self) -> None:
        while not self._stopped.is_set():
            try:
                conn, _ = self._listener.accept()
            except OSError:
                return
            threading.Thread(target=self._handle, args=(conn,), daemon=True).start()

    def _pick(self, method: str, path: str) -> str | None:
        if self.choose is not None:
            return self.choose(method, path)
        with self._lock:
            draw = self._random.random()
        total = 0.0
        for fault, rate in self.rates.items():
            total += rate
            if draw < total:
                return fault
        return None

    def _handle(self, conn: socket.socket) -> None:
        conn.settimeout(60)
        try:
            got = _read_head(conn)
            if got is None:
                return
            head, body = got
            method, path = head.split(b" ", 2)[:2]
            method, path = method.decode(), path.decode()
            length = int(_header(head, b"content-length") or 0)
            fault = self._pick(method, path)
            with self._lock:
                self.requests.append((method, path))
                if fault:
                    self.injected[fault] += 1
            if fault == "continue_close":
                conn.sendall(b"HTTP/1.1 100 Continue\r\n\r\n")
                return
            if fault == "stall":
                self._stopped.wait(self.stall_s)
                return
            while len(body) < length:
                chunk = conn.recv(min(1 << 20, length - len(body)))
                if not chunk:
                    return
                body += chunk
            if fault == "drop":
                return
            if fault in ("500", "503", "slowdown"):
                code = {"500": (500, "InternalError"), "503": (503, "ServiceUnavailable"), "slowdown": (503, "SlowDown")}[fault]
                payload = _ERROR_BODY.format(code=code[1]).encode()
                conn.sendall(f"HTTP/1.1 {code[0]} Injected\r\nContent-Type: application/xml\r\nContent-Length: {len(payload)}\r\nConnection: close\r\n\r\n".encode() + payload)
                return
            response = self._forward(_with_connection_close(head) + b"\r\n\r\n" + body)
            if fault == "drop_after":
                return  # the request took effect upstream; its answer is lost
            reply_head, _, reply_body = response.partition(b"\r\n\r\n")
            out = _with_connection_close(reply_head) + b"\r\n\r\n"
            if fault == "truncate" and len(reply_body) > 1:
                conn.sendall(out + reply_body[: len(reply_body) // 2])
                return
            conn.sendall(out + reply_body)
        except OSError:
            pass
        finally:
            try:
                conn.close()
            except OSError:
                pass

    def _forward(self, request: bytes) -> bytes:
        with socket.create_connection(self.upstream, timeout=60) as upstream:
            upstream.sendall(request)
            chunks = []
            while True:
                chunk = upstream.recv(1 << 20)
                if not chunk:
                    break
                chunks.append(chunk)
        return b"".join(chunks)


@pytest.fixture
def fault_proxy(s3_endpoint):
    proxy = FaultProxy(s3_endpoint)
    yield proxy
    proxy.close()


@pytest.fixture
def via_proxy(fault_proxy, monkeypatch):
    """boto3 clients created from here on talk to the proxy; fast retries for tests."""
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", fault_proxy.url)
    monkeypatch.setenv("STEPSCOPE_S3_CONNECT_TIMEOUT_S", "2")
    monkeypatch.setenv("STEPSCOPE_S3_READ_TIMEOUT_S", "2")
    return fault_proxy


def wait_until(predicate: Callable[[], bool], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.02)
    return predicate()
