"""The webhook action against real HTTP servers on loopback that misbehave: one trickling
its answer, one redirecting; the whole call is bounded and a failure is reported."""

from __future__ import annotations

import http.server
import socket
import threading
import time

import pytest

from stepscope.exceptions import ConfigError
from stepscope.rules import Webhook
from stepscope.rules.actions import action_from_json


def _serve(handler_class):
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler_class)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}"


class _Quiet(http.server.BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass


def test_a_server_trickling_headers_cannot_hold_the_call():
    class Trickle(_Quiet):
        def do_POST(self):
            self.rfile.read(int(self.headers["Content-Length"]))
            self.wfile.write(b"HTTP/1.1 200 OK\r\n")
            for i in range(100):  # one header line every 0.2 s: each read is quick
                self.wfile.write(f"X-Slow-{i}: 1\r\n".encode())
                self.wfile.flush()
                time.sleep(0.2)

    server, url = _serve(Trickle)
    try:
        started = time.monotonic()
        with pytest.raises(RuntimeError, match="within its 1 s"):
            Webhook(url + "/hook", timeout=1.0, retries=3, backoff=0.05).post(b"{}")
        assert time.monotonic() - started < 3.0  # (per read, the 100 lines would take 20 s)
    finally:
        server.shutdown()


def test_a_redirect_is_a_failure_and_is_not_followed():
    hits = []

    class Elsewhere(_Quiet):
        def do_GET(self):
            hits.append("GET")
            self.send_response(200)
            self.end_headers()

        do_POST = do_GET

    class Redirect(_Quiet):
        def do_POST(self):
            self.rfile.read(int(self.headers["Content-Length"]))
            self.send_response(302)
            self.send_header("Location", target + "/stolen")
            self.send_header("Content-Length", "0")
            self.end_headers()

    other, target = _serve(Elsewhere)
    server, url = _serve(Redirect)
    try:
        with pytest.raises(RuntimeError, match="302.*do not follow redirects"):
            Webhook(url + "/hook", timeout=2.0, retries=2, backoff=0.01).post(b"{}")
        assert hits == []
    finally:
        server.shutdown()
        other.shutdown()


def test_a_silent_server_is_bounded_too():
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)  # accepts (the kernel does) and never answers
    try:
        started = time.monotonic()
        with pytest.raises(RuntimeError, match="webhook"):
            Webhook(f"http://127.0.0.1:{listener.getsockname()[1]}/", timeout=0.5, retries=5, backoff=0.01).post(b"{}")
        assert time.monotonic() - started < 2.0  # (bounded per attempt only, the retries would take 2.5 s or more)
    finally:
        listener.close()


@pytest.mark.parametrize(
    "params, message",
    [
        ({"timeout": 0}, "timeout"),
        ({"timeout": 10**9}, "timeout"),
        ({"timeout": float("nan")}, "timeout"),
        ({"retries": 10**6}, "retries"),
        ({"retries": -1}, "retries"),
        ({"backoff": -1}, "backoff"),
    ],
)
def test_webhook_settings_are_bounded(params, message):
    with pytest.raises(ConfigError, match=message):
        Webhook("http://127.0.0.1:9/", **params)
    with pytest.raises(ConfigError, match=message):
        action_from_json({"name": "webhook", "url": "http://127.0.0.1:9/", **params})
