"""The HTTP(S) server of `stepscope ui`: waitress (a maintained production WSGI server) with
bounded connections, idle timeouts and TLS handshakes driven by its event loop.

Why waitress: one event-loop thread reads every request whole before a worker thread sees
it, so a client that connects and sends nothing, or trickles its headers, costs a socket,
never a worker; it bounds open connections, closes idle ones, and caps header and body
sizes. It does not speak TLS itself, so `_TLSServer` wraps each accepted socket without a
handshake (`do_handshake_on_connect=False`) and the channel advances the handshake only
when the socket is readable: a client that never sends a TLS hello holds one socket until
the idle timeout and blocks nobody (the accept loop never waits on a client)."""

from __future__ import annotations

import logging
import ssl
import threading
import time
from dataclasses import dataclass
from typing import Any

from ..exceptions import ConfigError

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class ServerLimits:
    """What one server holds at most. `connections` is also kept below the process's
    descriptor limit (RLIMIT_NOFILE) so that accepting never fails for want of one."""

    threads: int = 8  # requests computed at once (a first look at a big job takes seconds)
    connections: int = 200
    idle_timeout_s: float = 30.0  # a connection with no complete request for this long is closed
    header_bytes: int = 64 * 1024
    body_bytes: int = 64 * 1024

    def __post_init__(self) -> None:
        for name in ("threads", "connections", "header_bytes", "body_bytes"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"{_OPTION.get(name, name)} must be a positive integer, got {value!r}")
        if not isinstance(self.idle_timeout_s, (int, float)) or not 0.1 <= self.idle_timeout_s <= 3600:
            raise ConfigError(f"--idle-timeout (idle_timeout_s) must be within [0.1, 3600] seconds, got {self.idle_timeout_s!r}")


_OPTION = {"threads": "--threads", "connections": "--connections"}  # the CLI's names, for its users


def check_port(port: Any) -> int:
    """A TCP port to bind: 0 (any free one) to 65535; anything else is an error, never
    silently another port (the kernel would take 99999 modulo 65536)."""
    if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535:
        raise ConfigError(f"--port must be an integer from 0 to 65535, got {port!r}")
    return port


def _descriptor_room(wanted: int) -> int:
    """`wanted`, lowered to leave 32 descriptors (store files, the user database, logs)
    below the soft RLIMIT_NOFILE."""
    try:
        import resource

        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    except (ImportError, OSError, ValueError):
        return wanted
    if soft == getattr(resource, "RLIM_INFINITY", -1) or soft <= 0:
        return wanted
    return max(4, min(wanted, soft - 32))


class WebServer:
    """One listening server; `run()` serves until `stop()` (from any thread)."""

    def __init__(self, app: Any, host: str, port: int, *, cert: str | None = None, key: str | None = None,
                 limits: ServerLimits | None = None):
        from waitress.adjustments import Adjustments

        limits = limits or ServerLimits()
        check_port(port)
        if bool(cert) != bool(key):
            raise ConfigError("--cert and --key go together")
        context = None
        if cert:
            context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
            context.minimum_version = ssl.TLSVersion.TLSv1_2
            try:
                context.load_cert_chain(cert, key)
            except (OSError, ssl.SSLError) as exc:
                raise ConfigError(f"--cert/--key: cannot load the certificate and key ({exc.__class__.__name__}: {exc})") from None
        self.limits = limits
        self.connection_limit = _descriptor_room(limits.connections)
        adjustments = Adjustments(
            host=host, port=port, threads=limits.threads, connection_limit=self.connection_limit,
            channel_timeout=limits.idle_timeout_s, cleanup_interval=max(0.2, min(5.0, limits.idle_timeout_s / 4)),
            max_request_header_size=limits.header_bytes, max_request_body_size=limits.body_bytes,
            asyncore_use_poll=True,  # select() fails past descriptor 1024
            url_scheme="https" if context else "http", ident="stepscope", expose_tracebacks=False,
            clear_untrusted_proxy_headers=True, log_socket_errors=False,
        )
        try:
            self._server = _server_class()(app, map={}, adj=adjustments, tls=context)
        except OSError as exc:
            raise ConfigError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
        self.host, self.port = host, int(self._server.effective_port)
        self.tls = context is not None
        self._stopped = threading.Event()

    def run(self) -> None:
        try:
            self._server.run()
        finally:
            self._stopped.set()

    def stop(self, timeout: float = 5.0) -> None:
        """Close every connection and the listening socket; `run()` returns."""
        from waitress import wasyncore

        server = self._server
        if not self._stopped.is_set():
            try:
                server.trigger.pull_trigger(lambda: wasyncore.close_all(server._map))
            except OSError:
                # The loop's wake-up pipe is closed already (CI saw EBADF here): nothing can
                # wake the loop, so its channels are closed from this thread; with its map
                # empty, the loop returns at its next poll.
                wasyncore.close_all(server._map)
        self._stopped.wait(timeout)
        server.task_dispatcher.shutdown(timeout=timeout)

    def open_connections(self) -> int:
        return len(self._server.active_channels)


_CLASS: Any = None


def _server_class() -> Any:
    """The waitress server and channel classes with TLS and eviction (built on first use: the
    `ui` extra may be absent where this module is imported)."""
    global _CLASS
    if _CLASS is not None:
        return _CLASS
    from waitress.channel import HTTPChannel
    from waitress.server import TcpWSGIServer

    class _Channel(HTTPChannel):
        """Notes when the request being received began: waitress's idle timeout counts from
        the last byte, so a client trickling one byte at a time would never reach it."""

        partial_since: float | None = None

        def received(self, data: bytes) -> bool:
            if self.request is None and self.partial_since is None:
                self.partial_since = time.time()
            result = bool(super().received(data))
            if self.request is None:  # nothing half-received left: the request is whole
                self.partial_since = None
            return result

    class _TLSChannel(_Channel):
        """A channel over an SSLSocket in non-blocking mode: the handshake and every read
        advance only as far as the bytes at hand; 'want read/write' means 'later'."""

        handshaken = False

        def handle_read(self) -> None:
            try:
                if not self.handshaken:
                    self.socket.do_handshake()
                    self.handshaken = True
                    self.last_activity = time.time()
                data = self.socket.recv(self.adj.recv_bytes)
                # Decrypted bytes left inside the TLS layer do not wake poll(): drain them now.
                while data and self.socket.pending():
                    data += self.socket.recv(self.socket.pending())
            except (ssl.SSLWantReadError, ssl.SSLWantWriteError):
                return
            except OSError:  # a failed handshake, a reset: this connection only
                self.handle_close()
                return
            if data:
                self.last_activity = time.time()
                self.received(data)
            else:
                self.handle_close()

        def send(self, data: bytes, do_close: bool = True) -> int:
            if not self.handshaken:
                return 0
            try:
                return int(self.socket.send(data))
            except (ssl.SSLWantReadError, ssl.SSLWantWriteError, BlockingIOError):
                return 0
            except OSError:
                if do_close:
                    self.handle_close()
                return 0

    class _Server(TcpWSGIServer):
        def __init__(self, app: Any, *, map: dict[Any, Any], adj: Any, tls: ssl.SSLContext | None):
            self.tls = tls
            self.channel_class = _TLSChannel if tls is not None else _Channel
            super().__init__(app, map=map, adj=adj)

        def accept(self) -> Any:
            accepted = super().accept()
            if accepted is None or self.tls is None:
                return accepted
            conn, addr = accepted
            try:
                # No I/O here: the handshake waits for the client's bytes in the channel.
                return self.tls.wrap_socket(conn, server_side=True, do_handshake_on_connect=False), addr
            except (OSError, ValueError):
                conn.close()
                return None

        def maintenance(self, now: float) -> None:
            super().maintenance(now)
            # A request must arrive whole within the idle timeout of its first byte.
            cutoff = now - self.adj.channel_timeout
            for channel in list(self.active_channels.values()):
                since = getattr(channel, "partial_since", None)
                if since is not None and since < cutoff and not channel.requests:
                    channel.will_close = True

        def readable(self) -> bool:
            # At the limit, close the longest-idle connections (no request in progress)
            # rather than stop accepting: idle sockets then cannot lock clients out.
            if self.accepting and len(self._map) >= self.adj.connection_limit:
                self._evict_idle(now=time.time())
            return bool(super().readable())

        def _evict_idle(self, now: float) -> None:
            idle = sorted((c for c in list(self.active_channels.values()) if not c.requests and not c.will_close),
                          key=lambda c: c.last_activity)
            for channel in idle[: max(1, len(idle) // 10)]:
                channel.will_close = True
                channel.handle_close()

    _CLASS = _Server
    return _CLASS
