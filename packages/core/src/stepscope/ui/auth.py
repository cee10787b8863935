"""Who is asking: the session cookie or a bearer token, CSRF checks on state-changing
requests, and the login rate limit. Used by the app's request hook; no Flask routes here."""

from __future__ import annotations

import hmac
import threading
import time
from collections import deque
from dataclasses import dataclass

from .users import User, UserDB

SESSION_COOKIE = "stepscope_session"
LOGIN_CSRF_COOKIE = "stepscope_login_csrf"
CSRF_HEADER = "X-CSRF-Token"
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})


@dataclass(frozen=True)
class Identity:
    """The authenticated user of one request, and how they came (cookie sessions need CSRF tokens)."""

    user: User
    via: str  # "session" | "token"
    csrf: str | None = None
    session_id: str | None = None


def authenticate(db: UserDB, cookie: str | None, authorization: str | None) -> Identity | None:
    """A bearer token wins over the cookie; None when neither names a live session or token."""
    if authorization:
        scheme, _, token = authorization.partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            return None
        user = db.user_for_token(token.strip())
        return Identity(user, "token") if user else None
    if cookie:
        session = db.session(cookie)
        if session:
            return Identity(session.user, "session", session.csrf, cookie)
    return None


def csrf_ok(identity: Identity, method: str, sent: str | None) -> bool:
    """State-changing requests from a cookie session must echo the session's CSRF token.
    Token requests carry no ambient credential, so a forged cross-site request cannot use them."""
    if method in SAFE_METHODS or identity.via == "token":
        return True
    return sent is not None and identity.csrf is not None and hmac.compare_digest(sent.encode(), identity.csrf.encode())


class LoginLimiter:
    """At most `attempts` failed logins per `window_s` per client address and per user name;
    beyond that, logins are refused (HTTP 429) until the window has passed.

    Checking and counting are one step (`begin`): an attempt takes a slot before its
    password is verified and gives it back only if the password was right. So N parallel
    wrong passwords for one user get at most `attempts` verifications, not N."""

    def __init__(self, attempts: int = 5, window_s: float = 60.0):
        self.attempts, self.window_s = attempts, window_s
        self._failures: dict[str, deque[float]] = {}
        self._pending: dict[str, int] = {}  # attempts being verified now, per key
        self._lock = threading.Lock()

    def _recent(self, key: str, now: float) -> deque[float]:
        times = self._failures.setdefault(key, deque())
        while times and now - times[0] > self.window_s:
            times.popleft()
        return times

    @staticmethod
    def _keys(address: str, name: str) -> tuple[str, str]:
        return f"addr:{address}", f"user:{name}"

    def begin(self, address: str, name: str) -> bool:
        """Take a slot for one attempt; False (refuse with 429) when the address or the name
        has no slot left in the window. Every True must be followed by `end`."""
        now = time.monotonic()
        with self._lock:
            keys = self._keys(address, name)
            if any(len(self._recent(k, now)) + self._pending.get(k, 0) >= self.attempts for k in keys):
                return False
            for key in keys:
                self._pending[key] = self._pending.get(key, 0) + 1
            return True

    def end(self, address: str, name: str, ok: bool) -> None:
        """The attempt's outcome: a failure keeps its slot for the window, a success frees it."""
        now = time.monotonic()
        with self._lock:
            for key in self._keys(address, name):
                left = self._pending.get(key, 0) - 1
                if left > 0:
                    self._pending[key] = left
                else:
                    self._pending.pop(key, None)
                if not ok:
                    self._recent(key, now).append(now)
            if len(self._failures) > 10000:  # bound memory under a spray of names
                self._failures = {k: v for k, v in self._failures.items() if v and now - v[-1] <= self.window_s}

    def blocked(self, address: str, name: str) -> bool:
        now = time.monotonic()
        with self._lock:
            return any(len(self._recent(k, now)) + self._pending.get(k, 0) >= self.attempts for k in self._keys(address, name))

    def failed(self, address: str, name: str) -> None:
        """Count one failure outside `begin`/`end`."""
        if self.begin(address, name):
            self.end(address, name, ok=False)
