"""The app's user database: users, the job prefixes each may see, API tokens and login
sessions, in one SQLite file that is created (and migrated) on first open.

Passwords are hashed with argon2id (memory-hard); tokens and session ids are random and
stored only as SHA-256 digests, so a copy of the file gives no way in."""

from __future__ import annotations

import hashlib
import re
import secrets
import sqlite3
import threading
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from ..exceptions import ConfigError, StepscopeError

NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.@-]{0,63}$")
SESSION_TTL_S = 12 * 3600

# Each entry upgrades the schema by one version; PRAGMA user_version records how far a file
# has come, so an older file is brought up to date on open and a new one is built from zero.
_MIGRATIONS: tuple[str, ...] = (
    """
    CREATE TABLE users (
        id INTEGER PRIMARY KEY,
        name TEXT NOT NULL UNIQUE,
        password_hash TEXT NOT NULL,
        is_admin INTEGER NOT NULL DEFAULT 0,
        created REAL NOT NULL
    );
    CREATE TABLE prefixes (
        user_id INTEGER NOT NULL REFERENCES users(id) ON DELETE CASCADE,
        prefix TEXT NOT NULL,
        PRIMARY KEY (user_id, prefix)
    );
    CREATE TABLE sessions (
        id_hash TEXT PRIMARY KEY,
        user_id INTEGER NOT NULL REFERENCES users(id) ON DELETE CASCADE,
        csrf TEXT NOT NULL,
        expires REAL NOT NULL
    );
    """,
    """
    CREATE TABLE tokens (
        token_hash TEXT PRIMARY KEY,
        user_id INTEGER NOT NULL REFERENCES users(id) ON DELETE CASCADE,
        created REAL NOT NULL
    );
    """,
)


class Busy(StepscopeError):  # not a ValueError: nothing may take it for a wrong password
    """Every password-hashing slot stayed taken for the whole wait: the server is flooded
    with sign-ins. The app answers 503; nothing was verified."""


@dataclass(frozen=True)
class User:
    """One account: its name, whether it administers the app, and the job prefixes it sees."""

    id: int
    name: str
    is_admin: bool
    prefixes: tuple[str, ...]

    def can_see(self, job: str) -> bool:
        """Whether the job at store-relative path `job` lies under one of this user's prefixes."""
        if self.is_admin:
            return True
        return any(job == p or job.startswith(p + "/") for p in self.prefixes)

    def to_json(self) -> dict[str, object]:
        return {"name": self.name, "admin": self.is_admin, "prefixes": list(self.prefixes)}


@dataclass(frozen=True)
class Session:
    user: User
    csrf: str


def normalize_prefix(prefix: str) -> str:
    """A store-relative prefix with no leading/trailing slash; `..`, `.`, empty parts and
    backslashes are refused so a grant can never reach outside the store."""
    cleaned = prefix.strip().strip("/")
    parts = cleaned.split("/")
    if not cleaned or any(p in ("", ".", "..") or "\\" in p or "\x00" in p for p in parts):
        raise ConfigError(f"prefix {prefix!r} is not a relative path inside the store")
    return cleaned


def _digest(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def _hasher(memory_kib: int, time_cost: int):
    from argon2 import PasswordHasher

    # argon2id; the defaults (64 MiB, 3 passes) are RFC 9106's low-memory profile.
    return PasswordHasher(time_cost=time_cost, memory_cost=memory_kib, parallelism=4)


class UserDB:
    """Thread-safe access to the user database at `path` (created with its folder if absent)."""

    def __init__(self, path: str | Path, *, argon2_memory_kib: int = 65536, argon2_time_cost: int = 3,
                 max_concurrent_hashes: int = 4, hash_wait_s: float = 10.0):
        if isinstance(max_concurrent_hashes, bool) or not isinstance(max_concurrent_hashes, int) or max_concurrent_hashes < 1:
            raise ConfigError(f"max_concurrent_hashes must be a positive integer, got {max_concurrent_hashes!r}")
        self.path = Path(path)
        # Each argon2 hash or verification holds `argon2_memory_kib` (64 MiB by default): at
        # most this many at once bounds the memory a flood of sign-ins can take.
        self._hash_slots = threading.BoundedSemaphore(max_concurrent_hashes)
        self._hash_wait_s = hash_wait_s
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._conn = sqlite3.connect(str(self.path), check_same_thread=False, isolation_level=None)
        self._conn.execute("PRAGMA foreign_keys = ON")
        self._conn.execute("PRAGMA journal_mode = WAL")
        self._hasher = _hasher(argon2_memory_kib, argon2_time_cost)
        self._dummy: str | None = None
        self._migrate()

    @property
    def schema_version(self) -> int:
        return int(self._conn.execute("PRAGMA user_version").fetchone()[0])

    def _migrate(self) -> None:
        with self._lock:
            version = self.schema_version
            if version > len(_MIGRATIONS):
                raise ConfigError(f"user database {self.path.name} has schema version {version}, newer than this stepscope ({len(_MIGRATIONS)})")
            for number, script in enumerate(_MIGRATIONS[version:], start=version + 1):
                self._conn.executescript(f"BEGIN; {script} PRAGMA user_version = {number}; COMMIT;")

    def close(self) -> None:
        self._conn.close()

    # --- users ----------------------------------------------------------------------------

    def add_user(self, name: str, password: str, *, admin: bool = False, prefixes: Iterable[str] = ()) -> User:
        if not NAME_RE.match(name):
            raise ConfigError(f"user name {name!r}: use 1-64 letters, digits, '_', '.', '@' or '-'")
        if len(password) < 8:
            raise ConfigError(f"password for {name!r} is too short (at least 8 characters)")
        cleaned = sorted({normalize_prefix(p) for p in prefixes})
        hashed = self._hash(password)
        with self._lock:
            try:
                self._conn.execute("BEGIN")
                cur = self._conn.execute(
                    "INSERT INTO users (name, password_hash, is_admin, created) VALUES (?, ?, ?, ?)", (name, hashed, int(admin), time.time())
                )
                self._conn.executemany("INSERT INTO prefixes VALUES (?, ?)", [(cur.lastrowid, p) for p in cleaned])
                self._conn.execute("COMMIT")
            except sqlite3.IntegrityError:
                self._conn.execute("ROLLBACK")
                raise ConfigError(f"user {name!r} already exists") from None
        return self.user(name)

    def remove_user(self, name: str) -> None:
        """Delete the user; its sessions and tokens go with it (cascade), so they stop working at once."""
        with self._lock:
            if self._conn.execute("DELETE FROM users WHERE name = ?", (name,)).rowcount == 0:
                raise ConfigError(f"no user named {name!r}")

    def user(self, name: str) -> User:
        found = self._find("name = ?", name)
        if found is None:
            raise ConfigError(f"no user named {name!r}")
        return found

    def _find(self, where: str, value: object) -> User | None:
        with self._lock:
            row = self._conn.execute(f"SELECT id, name, is_admin FROM users WHERE {where}", (value,)).fetchone()
            if row is None:
                return None
            prefixes = [r[0] for r in self._conn.execute("SELECT prefix FROM prefixes WHERE user_id = ? ORDER BY prefix", (row[0],))]
        return User(row[0], row[1], bool(row[2]), tuple(prefixes))

    def users(self) -> list[User]:
        with self._lock:
            names = [r[0] for r in self._conn.execute("SELECT name FROM users ORDER BY name")]
        return [self.user(n) for n in names]

    def has_admin(self) -> bool:
        with self._lock:
            return self._conn.execute("SELECT 1 FROM users WHERE is_admin = 1 LIMIT 1").fetchone() is not None

    def grant(self, name: str, prefixes: Iterable[str]) -> User:
        return self._edit_prefixes(name, prefixes, "INSERT OR IGNORE INTO prefixes VALUES (?, ?)")

    def revoke(self, name: str, prefixes: Iterable[str]) -> User:
        return self._edit_prefixes(name, prefixes, "DELETE FROM prefixes WHERE user_id = ? AND prefix = ?")

    def _edit_prefixes(self, name: str, prefixes: Iterable[str], statement: str) -> User:
        """Runs `statement` once per (user id, normalised prefix); returns the updated user."""
        user = self.user(name)
        cleaned = {normalize_prefix(p) for p in prefixes}
        with self._lock:
            self._conn.executemany(statement, [(user.id, p) for p in sorted(cleaned)])
        return self.user(name)

    def set_password(self, name: str, password: str) -> None:
        """New password; every open session and API token of the user stops working (a reset
        follows a leak: whatever was leaked with the password must die with it)."""
        if len(password) < 8:
            raise ConfigError(f"password for {name!r} is too short (at least 8 characters)")
        user = self.user(name)
        hashed = self._hash(password)
        with self._lock:
            self._conn.execute("BEGIN")
            try:
                self._conn.execute("UPDATE users SET password_hash = ? WHERE id = ?", (hashed, user.id))
                self._conn.execute("DELETE FROM sessions WHERE user_id = ?", (user.id,))
                self._conn.execute("DELETE FROM tokens WHERE user_id = ?", (user.id,))
            except BaseException:
                self._conn.execute("ROLLBACK")
                raise
            self._conn.execute("COMMIT")

    def verify_password(self, name: str, password: str) -> User | None:
        """The user when the password matches; None otherwise (unknown names cost a hash too,
        so timing does not tell which names exist)."""
        from argon2.exceptions import VerificationError

        with self._lock:
            row = self._conn.execute("SELECT password_hash FROM users WHERE name = ?", (name,)).fetchone()
        stored = row[0] if row else self._dummy_hash()
        try:
            with self._hash_slot():
                self._hasher.verify(stored, password)
        except (VerificationError, ValueError):
            return None
        return self._find("name = ?", name) if row else None

    def _dummy_hash(self) -> str:
        if self._dummy is None:
            self._dummy = self._hash(secrets.token_hex(16))
        return self._dummy

    def _hash(self, password: str) -> str:
        with self._hash_slot():
            return str(self._hasher.hash(password))

    @contextmanager
    def _hash_slot(self) -> Iterator[None]:
        if not self._hash_slots.acquire(timeout=self._hash_wait_s):
            raise Busy("too many password checks at once")
        try:
            yield
        finally:
            self._hash_slots.release()

    # --- tokens and sessions ----------------------------------------------------------------

    def new_token(self, name: str) -> str:
        """A new API token for `name` (shown once; only its digest is kept)."""
        user = self.user(name)
        token = "ssk_" + secrets.token_urlsafe(32)
        with self._lock:
            self._conn.execute("INSERT INTO tokens VALUES (?, ?, ?)", (_digest(token), user.id, time.time()))
        return token

    def revoke_tokens(self, name: str) -> int:
        user = self.user(name)
        with self._lock:
            return self._conn.execute("DELETE FROM tokens WHERE user_id = ?", (user.id,)).rowcount

    def user_for_token(self, token: str) -> User | None:
        with self._lock:
            row = self._conn.execute("SELECT user_id FROM tokens WHERE token_hash = ?", (_digest(token),)).fetchone()
        return self._find("id = ?", row[0]) if row else None

    def open_session(self, user: User, ttl_s: float = SESSION_TTL_S) -> tuple[str, str]:
        """(session id for the cookie, CSRF token for the pages)."""
        session_id, csrf = secrets.token_urlsafe(32), secrets.token_urlsafe(32)
        with self._lock:
            self._conn.execute("DELETE FROM sessions WHERE expires < ?", (time.time(),))
            self._conn.execute("INSERT INTO sessions VALUES (?, ?, ?, ?)", (_digest(session_id), user.id, csrf, time.time() + ttl_s))
        return session_id, csrf

    def session(self, session_id: str) -> Session | None:
        with self._lock:
            row = self._conn.execute(
                "SELECT user_id, csrf FROM sessions WHERE id_hash = ? AND expires >= ?", (_digest(session_id), time.time())
            ).fetchone()
        if row is None:
            return None
        user = self._find("id = ?", row[0])
        return Session(user, row[1]) if user else None

    def close_session(self, session_id: str) -> None:
        with self._lock:
            self._conn.execute("DELETE FROM sessions WHERE id_hash = ?", (_digest(session_id),))
