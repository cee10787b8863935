"""A fault-injecting HTTP proxy in front of an S3-protocol server (real sockets on 127.0.0.1:
boto3 talks to it as to any S3 endpoint). For tests and bench/bench_probe_s3.py.

Faults, chosen per request: "503" / "500" / "slowdown" (an S3 error answer), "reset" (the
connection is reset before an answer), "drop" (closed after the request is read),
"drop_after" (the request reaches the server, its answer is lost), "truncate" (half the
answer's body), "stall" (accepted, never answered: a silent endpoint), "trickle" (the
request and the answer pass, a few bytes at a time), "continue_close" (`100 Continue`,
then closed). `outage = "503"` (or any fault) applies one fault to every request until it
is set back to None: an outage that a test switches on and off while a job runs."""

from __future__ import annotations

import random
import re
import socket
import struct
import threading
import time
from collections import Counter
from collections.abc import Callable

FAULTS = ("drop", "drop_after", "500", "503", "slowdown", "reset", "truncate", "stall", "trickle", "continue_close")

_ERROR_BODY = '<?xml version="1.0" encoding="UTF-8"?><Error><Code>{code}</Code><Message>injected</Message><RequestId>fault</RequestId></Error>'
_ERRORS = {"500": (500, "InternalError"), "503": (503, "ServiceUnavailable"), "slowdown": (503, "SlowDown")}


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


def _reset(conn: socket.socket) -> None:
    """Close with a TCP reset (SO_LINGER 0) rather than an orderly FIN."""
    try:
        conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    except OSError:
        pass


class FaultProxy:
    """Forwards each request (one per connection) to `upstream`, or injects a fault instead:
    `outage` when set, else `choose(method, path)` when set, else `rates` (a fault ->
    probability, drawn from a seeded generator). Counts requests by method and by fault."""

    def __init__(self, upstream: str, seed: int = 0):
        host, _, port = upstream.removeprefix("http://").partition(":")
        self.upstream = (host, int(port))
        self.rates: dict[str, float] = {}
        self.choose: Callable[[str, str], str | None] | None = None
        self.outage: str | None = None
        self.stall_s = 600.0
        self.trickle_bytes_per_s = 2048.0
        self.requests: list[tuple[str, str]] = []
        self.request_times: list[float] = []  # time.monotonic() of each request's arrival
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
        outage = self.outage
        if outage is not None:
            return outage
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
            raw_method, raw_path = head.split(b" ", 2)[:2]
            method, path = raw_method.decode(), raw_path.decode()
            length = int(_header(head, b"content-length") or 0)
            fault = self._pick(method, path)
            with self._lock:
                self.requests.append((method, path))
                self.request_times.append(time.monotonic())
                if fault:
                    self.injected[fault] += 1
            if fault == "continue_close":
                conn.sendall(b"HTTP/1.1 100 Continue\r\n\r\n")
                return
            if fault == "stall":
                self._stopped.wait(self.stall_s)
                return
            if fault == "reset":
                _reset(conn)
                return
            while len(body) < length:
                chunk = conn.recv(min(1 << 20 if fault != "trickle" else 512, length - len(body)))
                if not chunk:
                    return
                body += chunk
                if fault == "trickle":
                    time.sleep(len(chunk) / self.trickle_bytes_per_s)
            if fault == "drop":
                return
            if fault in _ERRORS:
                status, code = _ERRORS[fault]
                payload = _ERROR_BODY.format(code=code).encode()
                conn.sendall(f"HTTP/1.1 {status} Injected\r\nContent-Type: application/xml\r\nContent-Length: {len(payload)}\r\nConnection: close\r\n\r\n".encode() + payload)
                return
            response = self._forward(_with_connection_close(head) + b"\r\n\r\n" + body)
            if fault == "drop_after":
                return  # the request took effect upstream; its answer is lost
            reply_head, _, reply_body = response.partition(b"\r\n\r\n")
            out = _with_connection_close(reply_head) + b"\r\n\r\n"
            if fault == "truncate" and len(reply_body) > 1:
                conn.sendall(out + reply_body[: len(reply_body) // 2])
                return
            if fault == "trickle":
                self._send_slowly(conn, out + reply_body)
                return
            conn.sendall(out + reply_body)
        except OSError:
            pass
        finally:
            try:
                conn.close()
            except OSError:
                pass

    def _send_slowly(self, conn: socket.socket, data: bytes) -> None:
        step = 64
        for start in range(0, len(data), step):
            if self._stopped.is_set():
                return
            conn.sendall(data[start : start + step])
            time.sleep(step / self.trickle_bytes_per_s)

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


def start_s3_server() -> tuple[str, Callable[[], None]]:
    """moto's S3 server in a thread on 127.0.0.1 (an ephemeral port): (endpoint, stop)."""
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    return f"http://{host}:{port}", server.stop
