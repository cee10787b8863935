"""Serve the web app (jobs, dashboard, training health, statistics, timeline) over STORE, a folder
or s3:// prefix holding jobs. `stepscope ui users add|remove|list|grant|revoke|reset-password|new-token`
manages the users (see `stepscope ui users --help`). On first start an `admin` user is created and its
password printed once.
"""
# The docstring above is `stepscope ui --help`'s description.

from __future__ import annotations

import argparse
import getpass
import ipaddress
import os
import secrets
import sys
from pathlib import Path

from ..cli_common import EXIT_OK, add_command
from ..exceptions import ConfigError

DEFAULT_PORT = 8080


def default_db_path() -> Path:
    """STEPSCOPE_UI_DB, else ~/.stepscope/ui.sqlite3."""
    return Path(os.environ.get("STEPSCOPE_UI_DB") or Path.home() / ".stepscope" / "ui.sqlite3")


def add_ui(sub: argparse._SubParsersAction) -> None:
    parser = add_command(sub, "ui", run_ui, summary="serve the web app over a store of jobs; `ui users ...` manages its users", description=__doc__)
    parser.add_argument("store", help="a folder or s3:// prefix of jobs, or `users`")
    # Everything after STORE is parsed by run_ui: the serving options, or `users`' own.
    parser.add_argument("rest", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    _serve_options(parser)


def _serve_options(parser: argparse.ArgumentParser, defaults: bool = True) -> None:
    suppress = argparse.SUPPRESS
    parser.add_argument("--host", default="127.0.0.1" if defaults else suppress, help="address to bind (default 127.0.0.1: this machine only)")
    parser.add_argument("--port", type=int, default=DEFAULT_PORT if defaults else suppress, help=f"port, 1-65535 (default {DEFAULT_PORT}; 0 picks a free one)")
    parser.add_argument("--db", default=None if defaults else suppress, help="user database file (default $STEPSCOPE_UI_DB or ~/.stepscope/ui.sqlite3)")
    parser.add_argument("--cert", default=None if defaults else suppress, help="TLS certificate (PEM); with --key, serve HTTPS")
    parser.add_argument("--key", default=None if defaults else suppress, help="TLS private key (PEM)")
    parser.add_argument("--allow-host", action="append", default=[] if defaults else suppress, metavar="NAME",
                        help="a host name clients may use in the Host header besides the bound address and localhost (repeatable; "
                             "refuses DNS rebinding)")
    parser.add_argument("--threads", type=int, default=8 if defaults else suppress, help="requests computed at once (default 8)")
    parser.add_argument("--connections", type=int, default=200 if defaults else suppress, help="open connections at most (default 200)")
    parser.add_argument("--idle-timeout", type=float, default=30.0 if defaults else suppress,
                        help="seconds a connection may stay without a complete request (default 30)")


def _users_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="stepscope ui users", description="Manage the app's users.")
    parser.add_argument("--db", default=None, help="user database file (default $STEPSCOPE_UI_DB or ~/.stepscope/ui.sqlite3)")
    sub = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    add = sub.add_parser("add", help="create a user (a password is generated and printed unless --password-stdin)")
    add.add_argument("name")
    add.add_argument("--prefix", action="append", default=[], help="a job prefix the user may see (repeatable)")
    add.add_argument("--admin", action="store_true", help="administrator: sees every job and manages users")
    add.add_argument("--password-stdin", action="store_true", help="read the password from stdin")
    sub.add_parser("remove", help="delete a user; its sessions and tokens stop working").add_argument("name")
    sub.add_parser("list", help="list users and their prefixes")
    grant = sub.add_parser("grant", help="let a user see more job prefixes")
    grant.add_argument("name")
    grant.add_argument("prefix", nargs="+")
    revoke = sub.add_parser("revoke", help="take job prefixes away from a user")
    revoke.add_argument("name")
    revoke.add_argument("prefix", nargs="+")
    reset = sub.add_parser("reset-password", help="set a new password (generated unless --password-stdin); closes the user's sessions and revokes its API tokens")
    reset.add_argument("name")
    reset.add_argument("--password-stdin", action="store_true")
    sub.add_parser("new-token", help="print a new API token for scripts (Authorization: Bearer ...)").add_argument("name")
    return parser


def _password(from_stdin: bool) -> tuple[str, bool]:
    """(password, generated)"""
    if from_stdin:
        return (sys.stdin.readline().rstrip("\n") if not sys.stdin.isatty() else getpass.getpass("password: ")), False
    return secrets.token_urlsafe(12), True


def run_users(argv: list[str], db_default: str | None) -> int:
    from .users import UserDB

    args = _users_parser().parse_args(argv)
    db = UserDB(args.db or db_default or default_db_path())
    if args.action == "add":
        password, generated = _password(args.password_stdin)
        user = db.add_user(args.name, password, admin=args.admin, prefixes=args.prefix)
        print(f"added {user.name}{' (admin)' if user.is_admin else ''}; prefixes: {', '.join(user.prefixes) or '(none)'}")
        if generated:
            print(f"password: {password}")
    elif args.action == "remove":
        db.remove_user(args.name)
        print(f"removed {args.name}")
    elif args.action == "list":
        for user in db.users():
            print(f"{user.name}\t{'admin' if user.is_admin else 'user'}\t{', '.join(user.prefixes) or '-'}")
    elif args.action in ("grant", "revoke"):
        user = (db.grant if args.action == "grant" else db.revoke)(args.name, args.prefix)
        print(f"{user.name}: {', '.join(user.prefixes) or '(no prefixes)'}")
    elif args.action == "reset-password":
        password, generated = _password(args.password_stdin)
        db.set_password(args.name, password)
        print(f"password of {args.name} changed; its sessions are closed and its API tokens revoked")
        if generated:
            print(f"password: {password}")
    elif args.action == "new-token":
        print(db.new_token(args.name))
    return EXIT_OK


def run_ui(args: argparse.Namespace) -> int:
    if args.store == "users":
        try:
            return run_users(list(args.rest), args.db)
        except SystemExit as exc:
            return int(exc.code or 0)
    if args.rest:
        after = argparse.ArgumentParser(prog="stepscope ui STORE", add_help=False)
        _serve_options(after, defaults=False)
        try:
            after.parse_args(args.rest, namespace=args)
        except SystemExit:
            raise ConfigError(f"bad arguments after the store: {' '.join(args.rest)}") from None
    from .bundle import missing_message

    if (problem := missing_message()) is not None:  # refuse rather than serve a blank page
        raise ConfigError(problem)
    from .app import create_app
    from .jobs import JobStore
    from .server import ServerLimits, WebServer, check_port
    from .users import UserDB

    check_port(args.port)
    if bool(args.cert) != bool(args.key):
        raise ConfigError("--cert and --key go together")
    limits = ServerLimits(threads=args.threads, connections=args.connections, idle_timeout_s=args.idle_timeout)
    # Everything that can be mistyped is checked before the user database is touched: a
    # wrong store path or a busy port creates no admin and prints no password.
    jobs = JobStore(args.store)
    jobs.check()
    db = UserDB(args.db or default_db_path())
    app = create_app(jobs, db, secure_cookies=bool(args.cert), allowed_hosts=allowed_hosts(args.host, args.allow_host))
    server = WebServer(app, args.host, args.port, cert=args.cert, key=args.key, limits=limits)
    if not db.has_admin():
        password = secrets.token_urlsafe(12)
        db.add_user("admin", password, admin=True)
        print(f"stepscope ui: created user 'admin' with password {password} (shown once; change it with "
              "`stepscope ui users reset-password admin`)", file=sys.stderr)
    if not _is_loopback(args.host) and not args.cert:
        print("stepscope ui: warning: serving plain HTTP beyond this machine; use --cert/--key or a TLS reverse proxy (docs/ui.md)", file=sys.stderr)
    scheme = "https" if args.cert else "http"
    shown = f"[{args.host}]" if ":" in args.host else args.host
    print(f"stepscope ui: serving {args.store} on {scheme}://{shown}:{server.port}/", file=sys.stderr, flush=True)
    try:
        server.run()
    except KeyboardInterrupt:
        pass
    finally:
        server.stop()
    return EXIT_OK


def allowed_hosts(bound: str, extra: list[str]) -> tuple[str, ...]:
    """The Host header values the app answers: the bound address, localhost and `extra`;
    bound to every address (0.0.0.0, ::), also this machine's names. A name of another site
    pointing here (DNS rebinding) is refused."""
    import socket

    names = {"localhost", "127.0.0.1", "::1", bound.strip("[]").lower(), *(h.strip().lower() for h in extra if h.strip())}
    if bound in ("0.0.0.0", "::", ""):
        names |= {socket.gethostname().lower(), socket.getfqdn().lower(), "*ip"}  # "*ip": any address literal
    return tuple(sorted(names))


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
