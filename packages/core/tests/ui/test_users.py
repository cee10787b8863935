"""The user database (schema migrations, hashing, prefixes) and `stepscope ui users`."""

from __future__ import annotations

import sqlite3

import pytest

from stepscope.cli import main
from stepscope.exceptions import ConfigError
from stepscope.ui.users import UserDB, normalize_prefix


def _db(path):
    return UserDB(path, argon2_memory_kib=256, argon2_time_cost=1)


def test_created_on_first_open_at_latest_schema(tmp_path):
    db = _db(tmp_path / "sub" / "users.db")
    assert (tmp_path / "sub" / "users.db").exists()
    assert db.schema_version == 2
    tables = {r[0] for r in db._conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    assert {"users", "prefixes", "sessions", "tokens"} <= tables


def test_version_1_file_is_migrated_keeping_its_users(tmp_path):
    from stepscope.ui import users as users_module

    path = tmp_path / "old.db"
    conn = sqlite3.connect(path)
    conn.executescript(users_module._MIGRATIONS[0] + "PRAGMA user_version = 1;")
    conn.execute("INSERT INTO users (name, password_hash, is_admin, created) VALUES ('old', 'x', 1, 0)")
    conn.commit()
    conn.close()
    db = _db(path)
    assert db.schema_version == 2
    assert db.user("old").is_admin
    db.new_token("old")  # the table migration 2 added works


def test_newer_schema_is_refused(tmp_path):
    path = tmp_path / "new.db"
    conn = sqlite3.connect(path)
    conn.execute("PRAGMA user_version = 99")
    conn.close()
    with pytest.raises(ConfigError, match="schema version 99"):
        _db(path)


def test_passwords_are_argon2_hashes_and_verify(tmp_path):
    db = _db(tmp_path / "u.db")
    db.add_user("ann", "s3cret-password")
    stored = db._conn.execute("SELECT password_hash FROM users").fetchone()[0]
    assert stored.startswith("$argon2id$") and "s3cret" not in stored
    assert db.verify_password("ann", "s3cret-password").name == "ann"
    assert db.verify_password("ann", "wrong-password") is None
    assert db.verify_password("nobody", "s3cret-password") is None


def test_tokens_and_sessions_are_stored_as_digests(tmp_path):
    db = _db(tmp_path / "u.db")
    user = db.add_user("ann", "s3cret-password")
    token = db.new_token("ann")
    session_id, _ = db.open_session(user)
    dump = "\n".join(db._conn.iterdump())
    assert token not in dump and session_id not in dump
    assert db.user_for_token(token).name == "ann" and db.session(session_id).user.name == "ann"


@pytest.mark.parametrize("bad", ["", "/", "..", "a/../b", "a//b", "./a", "a\\b"])
def test_bad_prefixes_are_refused(bad):
    with pytest.raises(ConfigError):
        normalize_prefix(bad)


def test_prefix_matching_is_by_path_component(tmp_path):
    db = _db(tmp_path / "u.db")
    user = db.add_user("ann", "s3cret-password", prefixes=["team-a/"])
    assert user.prefixes == ("team-a",)
    assert user.can_see("team-a/run") and user.can_see("team-a")
    assert not user.can_see("team-ab/run") and not user.can_see("team-b/run")


def test_bad_names_and_short_passwords(tmp_path):
    db = _db(tmp_path / "u.db")
    with pytest.raises(ConfigError, match="user name"):
        db.add_user("../x", "long enough pw")
    with pytest.raises(ConfigError, match="too short"):
        db.add_user("ann", "short")
    db.add_user("ann", "long enough pw")
    with pytest.raises(ConfigError, match="already exists"):
        db.add_user("ann", "long enough pw")


def test_cli_users_commands(tmp_path, capsys):
    path = str(tmp_path / "cli.db")
    assert main(["ui", "users", "--db", path, "add", "ann", "--prefix", "team-a", "--prefix", "team-c"]) == 0
    password = capsys.readouterr().out.split("password: ")[1].strip()
    db = UserDB(path)
    assert db.verify_password("ann", password).prefixes == ("team-a", "team-c")
    assert main(["ui", "users", "--db", path, "grant", "ann", "team-b"]) == 0
    assert main(["ui", "users", "--db", path, "revoke", "ann", "team-c"]) == 0
    assert main(["ui", "users", "--db", path, "add", "boss", "--admin"]) == 0
    capsys.readouterr()
    assert main(["ui", "users", "--db", path, "list"]) == 0
    listing = capsys.readouterr().out.splitlines()
    assert listing == ["ann\tuser\tteam-a, team-b", "boss\tadmin\t-"]
    assert main(["ui", "users", "--db", path, "new-token", "ann"]) == 0
    token = capsys.readouterr().out.strip()
    assert db.user_for_token(token).name == "ann"
    assert main(["ui", "users", "--db", path, "reset-password", "ann"]) == 0
    new_password = capsys.readouterr().out.split("password: ")[1].strip()
    assert db.verify_password("ann", new_password) and not db.verify_password("ann", password)
    assert main(["ui", "users", "--db", path, "remove", "ann"]) == 0
    assert db.user_for_token(token) is None
    assert main(["ui", "users", "--db", path, "remove", "ann"]) == 2
    assert "no user named 'ann'" in capsys.readouterr().err
