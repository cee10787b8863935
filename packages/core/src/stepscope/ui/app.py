"""The web app: a Flask application over one store of jobs and one user database.

Every request but the login page and the static assets is authenticated (session cookie
or bearer token); every job id in a URL is checked against the store and the user's
prefixes before anything is read; a job the user may not see answers exactly as a job
that does not exist (404), and no error message carries a file path."""

from __future__ import annotations

import csv
import importlib
import io
import logging
import secrets
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from flask import Flask, Response, g, jsonify, redirect, request
from flask.json.provider import DefaultJSONProvider
from flask.typing import ResponseReturnValue
from markupsafe import escape
from werkzeug.exceptions import HTTPException

from ..exceptions import ConfigError, StepscopeError
from ..modes import ModeKeys
from . import auth, bundle
from . import users as users_module
from .jobs import JobNotFound, JobStore, job_id
from .users import UserDB

logger = logging.getLogger(__name__)
STATIC_DIR = bundle.STATIC_DIR
LOOPBACK_HOSTS = ("localhost", "127.0.0.1", "::1")
_PUBLIC_PATHS = ("/login", "/static/", "/healthz", "/favicon.ico")
_HEADERS = {
    "Content-Security-Policy": "default-src 'self'; img-src 'self' data: blob:; object-src 'none'; frame-ancestors 'none'; base-uri 'none'; form-action 'self'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
    "X-Frame-Options": "DENY",
    "Cache-Control": "no-store",
}


class _HttpError(Exception):
    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status, self.message = status, message


@contextmanager
def _refused_with(status: int) -> Iterator[None]:
    """The user database's ConfigError (no such user, a bad name or prefix) answered as an
    HTTP error with its message."""
    try:
        yield
    except ConfigError as exc:
        raise _HttpError(status, str(exc)) from None


def create_app(store: str | JobStore, db: str | Path | UserDB, *, secure_cookies: bool = False, limiter: auth.LoginLimiter | None = None,
               allowed_hosts: Iterable[str] = LOOPBACK_HOSTS) -> Flask:
    """The app for `store` (a folder or s3:// prefix of jobs) and the user database `db`.
    `secure_cookies`: served over TLS (Secure cookies, HSTS). `allowed_hosts`: the Host
    header values answered (`*ip`: any address literal); any other gets 400."""
    jobs = store if isinstance(store, JobStore) else JobStore(store)
    users = db if isinstance(db, UserDB) else UserDB(db)
    limiter = limiter or auth.LoginLimiter()
    hosts = frozenset(h.lower() for h in allowed_hosts)
    app = Flask(__name__, static_folder=str(STATIC_DIR), static_url_path="/static")
    app.json = _StrictJSON(app)
    app.url_map.merge_slashes = False  # `//etc/x` must not be redirected into something that matches
    app.url_map.strict_slashes = False
    app.config.update(MAX_CONTENT_LENGTH=64 * 1024)
    app.json.sort_keys = False  # tables and series keep the views' order
    app.extensions["stepscope"] = {"jobs": jobs, "users": users}

    def cookie(resp: Response, name: str, value: str, max_age: int | None = None) -> None:
        resp.set_cookie(name, value, max_age=max_age, httponly=True, samesite="Strict", secure=secure_cookies, path="/")

    # --- authentication, on every request ---------------------------------------------

    @app.before_request
    def _authenticate() -> Any:
        g.identity = None
        if not host_allowed(request.headers.get("Host", ""), hosts):
            return _error(400, "unknown host name (start the app with --allow-host NAME to answer it)")
        if request.path.startswith(_PUBLIC_PATHS):
            return None
        identity = auth.authenticate(users, request.cookies.get(auth.SESSION_COOKIE), request.headers.get("Authorization"))
        if identity is None:
            if request.path.startswith("/api/"):
                return _error(401, "authentication required")
            return redirect("/login")
        sent = request.headers.get(auth.CSRF_HEADER) or request.form.get("csrf_token")
        if not auth.csrf_ok(identity, request.method, sent):
            return _error(403, "missing or wrong CSRF token")
        g.identity = identity
        return None

    @app.after_request
    def _headers(resp: Response) -> Response:
        for key, value in _HEADERS.items():
            resp.headers.setdefault(key, value)
        if request.path.startswith("/static/"):
            resp.headers["Cache-Control"] = "public, max-age=300"
        if secure_cookies:  # served over TLS: browsers must not fall back to plain HTTP
            resp.headers["Strict-Transport-Security"] = "max-age=31536000"
        return _gzip(resp)

    @app.errorhandler(_HttpError)
    def _http_error(exc: _HttpError) -> Response:
        return _error(exc.status, exc.message)

    @app.errorhandler(JobNotFound)
    def _not_found(exc: JobNotFound) -> Response:
        return _error(404, "no such job")

    @app.errorhandler(404)
    def _no_route(exc: Exception) -> Response:
        return _error(404, "not found")

    @app.errorhandler(405)
    def _bad_method(exc: Exception) -> Response:
        return _error(405, "method not allowed")

    @app.errorhandler(413)
    def _too_large(exc: Exception) -> Response:
        return _error(413, "request too large")

    @app.errorhandler(users_module.Busy)
    def _busy(exc: Exception) -> Response:
        resp = _error(503, "too many sign-ins at once; try again in a few seconds")
        resp.headers["Retry-After"] = "5"
        return resp

    @app.errorhandler(Exception)
    def _internal(exc: Exception) -> Response:
        if isinstance(exc, HTTPException) and exc.code is not None and exc.code < 500:
            return _error(exc.code, (exc.name or "bad request").lower())
        # The message may name files of the store: log it here, send nothing of it.
        logger.exception("stepscope ui: %s %s failed", request.method, request.path)
        job = getattr(g, "job", None)
        if job is not None:
            # Raised while reading a job the user may see: that job's data is at fault (a
            # hostile or broken file), not the app. Say so, naming the file inside the job.
            return _error(422, job_error(exc, jobs.job_path(job)))
        if isinstance(exc, (StepscopeError, OSError)):
            return _error(500, "the job's data could not be read")
        return _error(500, "internal error")

    # --- login ------------------------------------------------------------------------

    @app.get("/favicon.ico")
    def favicon() -> Response:
        return Response(status=204)

    @app.get("/healthz")
    def healthz() -> Response:
        return jsonify(ok=True)

    @app.get("/login")
    def login_form() -> Response:
        # Reuse the browser's token: a second /login load (another tab, a redirected
        # favicon) must not invalidate a form already on screen.
        token = request.cookies.get(auth.LOGIN_CSRF_COOKIE, "")
        if not (20 <= len(token) <= 64 and token.replace("-", "").replace("_", "").isalnum()):
            token = secrets.token_urlsafe(24)
        resp = Response(_login_page(token, ""), mimetype="text/html")
        cookie(resp, auth.LOGIN_CSRF_COOKIE, token, max_age=3600)
        return resp

    @app.post("/login")
    def login() -> ResponseReturnValue:
        name = request.form.get("username", "")[:64]
        password = request.form.get("password", "")[:1024]
        token = request.cookies.get(auth.LOGIN_CSRF_COOKIE, "")
        if not token or not secrets.compare_digest(token, request.form.get("csrf_token", "")):
            return _error(403, "missing or wrong CSRF token")
        address = request.remote_addr or "?"
        if not limiter.begin(address, name):  # checks and takes a slot in one step
            resp = Response(_login_page(token, "Too many failed attempts; wait a minute."), status=429, mimetype="text/html")
            resp.headers["Retry-After"] = str(int(limiter.window_s))
            return resp
        try:
            user = users.verify_password(name, password)
        except users_module.Busy:  # nothing was verified: give the slot back, answer 503
            limiter.end(address, name, ok=True)
            raise
        limiter.end(address, name, ok=user is not None)
        if user is None:
            return Response(_login_page(token, "Wrong user name or password."), status=401, mimetype="text/html")
        session_id, _ = users.open_session(user)
        signed_in = redirect("/")
        cookie(signed_in, auth.SESSION_COOKIE, session_id)  # type: ignore[arg-type]
        signed_in.delete_cookie(auth.LOGIN_CSRF_COOKIE, path="/")
        return signed_in

    @app.post("/logout")
    def logout() -> ResponseReturnValue:
        if g.identity.session_id:
            users.close_session(g.identity.session_id)
        resp = redirect("/login")
        resp.delete_cookie(auth.SESSION_COOKIE, path="/")
        return resp

    # --- pages (one shell; the script draws the view named by the URL) ------------------

    @app.get("/")
    @app.get("/admin")
    def home() -> Response:
        if request.path == "/admin" and not g.identity.user.is_admin:
            raise _HttpError(404, "not found")
        return _shell(g.identity)

    @app.get("/compare")
    def compare_page() -> Response:
        return _shell(g.identity)  # the script asks /api/compare, which checks both grants

    @app.get("/jobs/<path:job>")
    def job_page(job: str) -> Response:
        _visible(job)  # the view (dashboard, timeline, ...) is the URL's #fragment
        return _shell(g.identity)

    # --- API: who, jobs ----------------------------------------------------------------

    @app.get("/api/me")
    def me() -> Response:
        return jsonify(user=g.identity.user.to_json(), csrf=g.identity.csrf)

    @app.get("/api/jobs")
    def list_jobs() -> Response:
        from concurrent.futures import ThreadPoolExecutor

        user = g.identity.user

        def row(job: str) -> dict[str, Any]:
            # One hostile job (a 10,000-deep JSON, NaN timestamps) is shown with its error;
            # the list itself, and every other job in it, must still answer.
            try:
                summary = jobs.summary(job).to_json()
                app.json.dumps(summary)  # a value JSON cannot carry fails here, for this row only
                return summary
            except Exception as exc:
                logger.exception("stepscope ui: cannot summarize a job")
                return {"id": job, "status": "unreadable", "start": None, "end": None, "duration": None,
                        "framework": None, "workers": 0, "steps": 0, "rules_fired": [], "skipped": [],
                        "error": job_error(exc, jobs.job_path(job))}

        visible = [job for job in jobs.job_ids() if user.can_see(job)]
        # summaries wait on the store (S3 listings): several at once
        with ThreadPoolExecutor(max_workers=min(8, max(1, len(visible)))) as pool:
            rows = list(pool.map(row, visible))
        return jsonify(jobs=_filter_sort(rows, request.args))

    @app.get("/api/compare")
    def compare_jobs() -> Response:
        """`?a=JOB&b=JOB`: stepscope.diff's comparison of B with the baseline A (both jobs
        this user may see; `top` rows of kernels/operators/tensors)."""
        from ..diff import compare

        a, b = request.args.get("a", ""), request.args.get("b", "")
        if not a or not b:
            raise _HttpError(400, "give two jobs: ?a=JOB&b=JOB")
        (trial_a, _), (trial_b, _) = _open(a), _open(b)
        diff = compare(trial_a, trial_b, top=_int_arg("top", 15, 1, 200), rules="saved", names=(job_id(a), job_id(b)))
        return jsonify(diff.to_json())

    @app.get("/api/jobs/<path:job>/summary")
    def job_summary(job: str) -> Response:
        return jsonify(jobs.summary(_visible(job)).to_json())

    @app.get("/api/jobs/<path:job>/version")
    def job_version(job: str) -> Response:
        from .views import version

        visible = _visible(job)
        trial = jobs.trial(visible)
        return jsonify(version(trial, jobs.generation(visible)))

    @app.get("/api/jobs/<path:job>/dashboard")
    def job_dashboard(job: str) -> Response:
        from .views import dashboard

        trial, stamp = _open(job)
        return jsonify(dashboard(trial, stamp, phase=request.args.get("phase"), bins=_int_arg("bins", 30, 5, 200), k=_int_arg("k", 10, 1, 100)))

    def plain_view(module: str, function: str) -> Any:
        """A job view that takes nothing but the opened job: `module.function(trial, stamp)`
        as JSON, its module (and what it imports) loaded on the first request."""

        def view(job: str) -> Response:
            return jsonify(getattr(importlib.import_module(module, __package__), function)(*_open(job)))

        return view

    # /api/jobs/<job>/<name> -> (module, function); the endpoint is job_<name>.
    plain_views = {"rules": (".views", "rules_status"), "health": (".views", "training_health"), "memory": (".memory", "memory"), "ranks": (".ranks", "ranks")}
    for name, (module, function) in plain_views.items():
        app.add_url_rule(f"/api/jobs/<path:job>/{name}", f"job_{name}", plain_view(module, function), methods=["GET"])

    @app.get("/api/jobs/<path:job>/tensor-histograms")
    def job_tensor_histograms(job: str) -> Response:
        from .views import tensor_histograms

        name = request.args.get("tensor", "")
        mode = request.args.get("mode", "").upper()  # one mode per ridge; unknown: the default one
        return jsonify(tensor_histograms(*_open(job), name, bins=_int_arg("bins", 30, 5, 200), mode=mode if mode in ModeKeys.__members__ else None))

    @app.get("/api/jobs/<path:job>/stats")
    def job_stats(job: str) -> Response:
        """Every table's title, columns and row count, with its first `limit` rows."""
        from .views import statistics, table_page

        tables = statistics(*_open(job))["tables"]
        limit = _int_arg("limit", 200, 0, 5000)
        return jsonify(tables={name: {"title": t["title"], **table_page(t, limit=limit)} for name, t in tables.items()})

    @app.get("/api/jobs/<path:job>/stats/<table>")
    def job_stats_table(job: str, table: str) -> Response:
        """One table filtered (`q`: text in any cell), sorted (`sort`: a column, `desc=1`) and cut
        to `limit` rows from `offset`, on the server: a 200,000-step table never goes whole to the page."""
        from .views import statistics, table_page

        tables = statistics(*_open(job))["tables"]
        if table not in tables:
            raise _HttpError(404, "no such table")
        sort = request.args.get("sort")
        if sort is not None and sort not in tables[table]["columns"]:
            raise _HttpError(400, "sort must name a column")
        return jsonify(table_page(tables[table], query=request.args.get("q", ""), sort=sort, descending=request.args.get("desc") == "1",
                                  offset=_int_arg("offset", 0, 0, 2**31), limit=_int_arg("limit", 1000, 0, 5000)))

    @app.get("/api/jobs/<path:job>/stats/<table>.csv", endpoint="job_stats_csv")
    def job_stats_csv(job: str, table: str) -> Response:
        from .views import statistics

        tables = statistics(*_open(job))["tables"]
        if table not in tables:
            raise _HttpError(404, "no such table")
        out = io.StringIO()
        writer = csv.writer(out)
        writer.writerow(tables[table]["columns"])
        writer.writerows(tables[table]["rows"])
        resp = Response(out.getvalue(), mimetype="text/csv")
        resp.headers["Content-Disposition"] = f'attachment; filename="{_filename(table)}.csv"'
        return resp

    @app.get("/api/jobs/<path:job>/timeline")
    def job_timeline(job: str) -> Response:
        from .timeline import timeline_view

        view = timeline_view(jobs, _visible(job), _float_arg("start"), _float_arg("end"), _int_arg("width", 1200, 100, 4000))
        return app.response_class(view, mimetype="application/json")

    @app.get("/api/jobs/<path:job>/timeline/event")
    def job_timeline_event(job: str) -> Response:
        from .timeline import event_details, job_index

        index = job_index(jobs, _visible(job))
        try:
            return jsonify(event_details(index, request.args.get("lane", ""), _int_arg("i", -1, -1, 2**62)))
        except KeyError:
            raise _HttpError(404, "no such event") from None

    @app.get("/api/jobs/<path:job>/perfetto")
    def job_perfetto(job: str) -> Response:
        from .timeline import TooManyEvents, perfetto_trace

        visible = _visible(job)
        try:
            data = perfetto_trace(jobs, visible, _float_arg("start"), _float_arg("end"))
        except TooManyEvents as exc:
            raise _HttpError(400, str(exc)) from None
        resp = Response(data, mimetype="application/json")
        resp.headers["Content-Disposition"] = f'attachment; filename="{_filename(visible)}.trace.json"'
        return resp

    # --- API: users (admins only) -------------------------------------------------------

    def admin() -> None:
        if not g.identity.user.is_admin:
            raise _HttpError(403, "administrators only")

    @app.get("/api/users")
    def list_users() -> Response:
        admin()
        return jsonify(users=[u.to_json() for u in users.users()])

    @app.post("/api/users")
    def add_user() -> ResponseReturnValue:
        admin()
        body = _json_body(_NEW_USER, required=("name",))
        password = body.get("password") or secrets.token_urlsafe(12)
        with _refused_with(400):
            user = users.add_user(body["name"], password, admin=body.get("admin", False), prefixes=body.get("prefixes", []))
        return jsonify(user=user.to_json(), password=None if body.get("password") else password), 201

    @app.delete("/api/users/<name>")
    def remove_user(name: str) -> Response:
        admin()
        if name == g.identity.user.name:
            raise _HttpError(400, "you cannot remove yourself")
        with _refused_with(404):
            users.remove_user(name)
        return jsonify(removed=name)

    @app.post("/api/users/<name>/grant")
    def grant(name: str) -> Response:
        admin()
        body = _json_body(_GRANT)
        with _refused_with(400):
            user = users.grant(name, body.get("prefixes", []))
            if body.get("revoke"):
                user = users.revoke(name, body["revoke"])
        return jsonify(user=user.to_json())

    @app.post("/api/users/<name>/password")
    def reset_password(name: str) -> Response:
        admin()
        password = secrets.token_urlsafe(12)
        with _refused_with(404):
            users.set_password(name, password)  # closes the user's sessions and revokes its API tokens
        return jsonify(password=password)

    @app.post("/api/users/<name>/token")
    def new_token(name: str) -> Response:
        admin()
        with _refused_with(404):
            return jsonify(token=users.new_token(name))

    # --- helpers ------------------------------------------------------------------------

    def _visible(job: str) -> str:
        """The id of the job folder `job` really names, when this user may see it. The grant
        is checked on the resolved folder, never on the requested text, so no link
        (`team-a/x -> ../team-b/job`) can lend a grant to another job."""
        job = job_id(job)
        real = jobs.resolve(job)  # JobNotFound: unsafe, no job, or through a symlink
        if real != job or not g.identity.user.can_see(real):
            raise JobNotFound(job)
        g.job = real
        return real

    def _open(job: str) -> tuple[Any, int]:
        """(trial, generation) of a job this user may see."""
        visible = _visible(job)
        trial = jobs.trial(visible)
        return trial, jobs.generation(visible)

    return app


# Admin request bodies: each field's JSON type. `list[str]` is a JSON array of strings.
_NEW_USER: dict[str, type] = {"name": str, "password": str, "admin": bool, "prefixes": list}
_GRANT: dict[str, type] = {"prefixes": list, "revoke": list}


def _json_body(fields: dict[str, type], required: tuple[str, ...] = ()) -> dict[str, Any]:
    """The request's JSON object, each field of the JSON type `fields` names (booleans are
    true/false, never "false"; lists are arrays of strings); 400 naming the field otherwise."""
    body = request.get_json(silent=True)
    if not isinstance(body, dict):
        raise _HttpError(400, "the request body must be a JSON object (Content-Type: application/json)")
    for key in body:
        if key not in fields:
            raise _HttpError(400, f"unknown field {str(key)[:40]!r} (expected: {', '.join(fields)})")
    for key, kind in fields.items():
        if key not in body:
            if key in required:
                raise _HttpError(400, f"{key} is required")
            continue
        value = body[key]
        if kind is list:
            if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
                raise _HttpError(400, f"{key} must be a list of strings")
        elif kind is bool:
            if not isinstance(value, bool):
                raise _HttpError(400, f"{key} must be true or false (a JSON boolean)")
        elif not isinstance(value, kind):
            raise _HttpError(400, f"{key} must be a {kind.__name__}")
    return body


def host_allowed(header: str, allowed: frozenset[str]) -> bool:
    """Whether the Host header names this server: its name (port left out) is in `allowed`,
    or `*ip` is and it is an address literal (a rebound DNS name never is)."""
    import ipaddress

    host = header.strip().lower()
    if host.startswith("["):
        host = host[1 : host.find("]")] if "]" in host else ""
    elif host.count(":") == 1:
        host = host.split(":")[0]
    if not host:
        return False
    if host in allowed:
        return True
    if "*ip" in allowed:
        try:
            ipaddress.ip_address(host)
            return True
        except ValueError:
            return False
    return False


def job_error(exc: BaseException, job_folder: str) -> str:
    """What went wrong reading a job, for its viewer: the file inside the job (never a path
    of the machine) and the kind of fault."""
    import re

    text = str(exc)
    if job_folder:
        text = text.replace(job_folder.rstrip("/") + "/", "").replace(job_folder, ".")
    text = re.sub(r"(?<![\w.])/[^\s'\"]+", "<path>", text)  # any other absolute path
    kinds: dict[type, str] = {RecursionError: "nested too deeply", MemoryError: "too large"}
    kind = kinds.get(type(exc), exc.__class__.__name__)
    return f"the job's data could not be read ({kind}): {text[:300]}" if text and not isinstance(exc, RecursionError) else f"the job's data could not be read ({kind})"


class _StrictJSON(DefaultJSONProvider):
    """Flask's JSON with NaN and infinities sent as null (JSON has no NaN; a browser's
    JSON.parse rejects the whole answer) and nothing deeper than the views make."""

    def dumps(self, obj: Any, **kwargs: Any) -> str:
        kwargs.setdefault("allow_nan", False)
        try:
            return super().dumps(obj, **kwargs)
        except ValueError:
            return super().dumps(_finite(obj), **kwargs)


def _finite(value: Any, depth: int = 0) -> Any:
    if depth > 64:
        raise ValueError("a value nested more than 64 levels")
    if isinstance(value, float):
        return value if value == value and value not in (float("inf"), float("-inf")) else None
    if isinstance(value, dict):
        return {k: _finite(v, depth + 1) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v, depth + 1) for v in value]
    return value


def _int_arg(name: str, default: int, low: int, high: int) -> int:
    raw = request.args.get(name)
    if raw is None:
        return default
    try:
        return min(high, max(low, int(raw)))
    except ValueError:
        raise _HttpError(400, f"{name} must be an integer") from None


def _float_arg(name: str) -> float | None:
    raw = request.args.get(name)
    if raw in (None, ""):
        return None
    try:
        value = float(raw)
    except ValueError:
        raise _HttpError(400, f"{name} must be a number") from None
    if not abs(value) <= 2.0**62:  # NaN, infinities, and times no int64 of nanoseconds holds
        raise _HttpError(400, f"{name} must be a finite time in nanoseconds, within ±2**62")
    return value


_SORT_KEYS = ("id", "status", "start", "duration", "framework", "workers", "steps", "saved_steps")


def _filter_sort(rows: list[dict[str, Any]], args: Any) -> list[dict[str, Any]]:
    """Filter by `q` (text in the id or framework) and `status`; sort by `sort` (`-` for descending)."""
    query = (args.get("q") or "").lower()
    status = args.get("status")
    if query:
        rows = [r for r in rows if query in r["id"].lower() or query in (r["framework"] or "").lower()]
    if status:
        rows = [r for r in rows if r["status"] == status]
    sort = args.get("sort") or "-start"
    key = sort.lstrip("-")
    if key in _SORT_KEYS:
        present = [r for r in rows if r[key] is not None]
        missing = [r for r in rows if r[key] is None]
        rows = sorted(present, key=lambda r: r[key], reverse=sort.startswith("-")) + missing
    return rows


def _filename(text: str) -> str:
    """A download name: letters, digits, `.`, `_` and `-` only (no quotes in the header)."""
    return "".join(c if c.isalnum() or c in "._-" else "_" for c in text)[:120] or "download"


def _gzip(resp: Response) -> Response:
    """Compress JSON, CSV and scripts for clients that accept it (the timeline's payloads are
    mostly digits and compress ~5x)."""
    import gzip

    if (resp.direct_passthrough or resp.status_code != 200 or "gzip" not in request.headers.get("Accept-Encoding", "")
            or resp.mimetype not in ("application/json", "text/csv", "text/javascript", "text/css") or "Content-Encoding" in resp.headers):
        return resp
    data = resp.get_data()
    if len(data) < 1400:
        return resp
    resp.set_data(gzip.compress(data, compresslevel=5))
    resp.headers["Content-Encoding"] = "gzip"
    resp.headers["Vary"] = "Accept-Encoding"
    return resp


def _error(status: int, message: str) -> Response:
    """JSON `{"error": message}` for the API and scripts; a small HTML page for a browser
    that navigated to a page (a shared link to a job it may not see, a mistyped URL)."""
    if request.path.startswith("/api/") or not _wants_html():
        resp = jsonify(error=message)
    else:
        resp = Response(
            "<!doctype html><html lang=en><head><meta charset=utf-8><title>stepscope: "
            f"{status}</title></head><body><h1>{status}: {escape(message)}</h1>"
            "<p><a href=\"/\">Back to the jobs list</a></p></body></html>", mimetype="text/html")
    resp.status_code = status
    return resp


def _wants_html() -> bool:
    best = request.accept_mimetypes.best_match(["application/json", "text/html"])
    return best == "text/html"


def _shell(identity: auth.Identity) -> Response:
    problem = bundle.missing_message()
    if problem:  # `stepscope ui` refuses to start without it; this guards an app embedded elsewhere
        return Response(f"<!doctype html><title>stepscope</title><p>{escape(problem)}</p>", status=503, mimetype="text/html")
    user = identity.user
    page = (
        "<!doctype html><html lang=en><head><meta charset=utf-8><title>stepscope</title>"
        f'<meta name="csrf-token" content="{escape(identity.csrf or "")}">'
        '<link rel="stylesheet" href="/static/app.css"></head>'
        f'<body data-user="{escape(user.name)}" data-admin="{int(user.is_admin)}"><div id="app"></div>'
        '<script src="/static/app.js"></script></body></html>'
    )
    return Response(page, mimetype="text/html")


def _login_page(token: str, message: str) -> str:
    note = f'<p class="error" role="alert">{escape(message)}</p>' if message else ""
    return (
        "<!doctype html><html lang=en><head><meta charset=utf-8><title>stepscope: sign in</title>"
        '<link rel="stylesheet" href="/static/app.css"></head><body class="login">'
        '<form method="post" action="/login" class="login-form"><h1>stepscope</h1>' + note +
        f'<input type="hidden" name="csrf_token" value="{escape(token)}">'
        '<label>User <input name="username" id="username" autocomplete="username" required></label>'
        '<label>Password <input name="password" id="password" type="password" autocomplete="current-password" required></label>'
        '<button type="submit" id="login">Sign in</button></form></body></html>'
    )
