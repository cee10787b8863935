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
    beyond that, logins are refused (HTTP 429) until the window has passed."""

    def __init__(self, attempts: int = 5, window_s: float = 60.0):
        self.attempts, self.window_s = attempts, window_s
        self._failures: dict[str, deque[float]] = {}
        self._lock = threading.Lock()

    def _recent(self, key: str, now: float) -> deque[float]:
        times = self._failures.setdefault(key, deque())
        while times and now - times[0] > self.window_s:
            times.popleft()
        return times

    def blocked(self, address: str, name: str) -> bool:
        now = time.monotonic()
        with self._lock:
            return any(len(self._recent(k, now)) >= self.attempts for k in (f"addr:{address}", f"user:{name}"))

    def failed(self, address: str, name: str) -> None:
        now = time.monotonic()
        with self._lock:
            for key in (f"addr:{address}", f"user:{name}"):
                self._recent(key, now).append(now)
            if len(self._failures) > 10000:  # bound memory under a spray of names
                self._failures = {k: v for k, v in self._failures.items() if v and now - v[-1] <= self.window_s}
