"""Access control of the app: authentication, per-user prefixes, traversal, admin-only
actions, CSRF, rate limiting, and sessions dying with their user."""

from __future__ import annotations

import pytest

from .conftest import PASSWORD, login


def test_no_credentials_is_401_on_api_and_redirect_on_pages(app):
    client = app.test_client()
    assert client.get("/api/jobs").status_code == 401
    assert client.get("/api/jobs/team-a/run-1/dashboard").status_code == 401
    page = client.get("/")
    assert page.status_code == 302 and page.headers["Location"].endswith("/login")


def test_wrong_password_is_refused_and_rate_limited(app):
    client = app.test_client()
    page = client.get("/login").get_data(as_text=True)
    token = page.split('name="csrf_token" value="')[1].split('"')[0]
    statuses = [client.post("/login", data={"username": "alice", "password": "nope", "csrf_token": token}).status_code for _ in range(6)]
    assert statuses[:5] == [401] * 5 and statuses[5] == 429
    # even the right password is refused while the limit holds
    assert client.post("/login", data={"username": "alice", "password": PASSWORD, "csrf_token": token}).status_code == 429


def test_login_without_csrf_token_is_403(app):
    client = app.test_client()
    client.get("/login")
    assert client.post("/login", data={"username": "alice", "password": PASSWORD}).status_code == 403


def test_session_cookie_is_httponly_and_samesite(app):
    client = app.test_client()
    page = client.get("/login").get_data(as_text=True)
    token = page.split('name="csrf_token" value="')[1].split('"')[0]
    resp = client.post("/login", data={"username": "alice", "password": PASSWORD, "csrf_token": token})
    cookie = [h for h in resp.headers.getlist("Set-Cookie") if h.startswith("stepscope_session=")][0]
    assert "HttpOnly" in cookie and "SameSite=Strict" in cookie


def test_user_sees_only_jobs_under_granted_prefixes(app):
    client = app.test_client()
    login(client, "alice")
    ids = [j["id"] for j in client.get("/api/jobs").get_json()["jobs"]]
    assert sorted(ids) == ["team-a/run-1", "team-a/run-2"]
    # searching does not reveal it either
    assert client.get("/api/jobs?q=secret").get_json()["jobs"] == []


def test_errors_are_html_for_a_browser_and_json_for_the_api(app):
    client = app.test_client()
    login(client, "alice")
    browser = {"Accept": "text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8"}
    for url in ("/jobs/team-b/secret-run", "/jobs/team-a/no-such-run", "/no/such/page"):
        page = client.get(url, headers=browser)
        assert page.status_code == 404 and page.mimetype == "text/html", url
        body = page.get_data(as_text=True)
        assert "<h1>404:" in body and 'href="/"' in body and "secret" not in body
    api = client.get("/api/jobs/team-b/secret-run/summary", headers=browser)  # the API answers JSON whatever it is asked
    assert api.status_code == 404 and api.get_json() == {"error": "no such job"}
    script = client.get("/jobs/team-b/secret-run")  # no Accept: a script, JSON
    assert script.get_json() == {"error": "no such job"}


def test_other_users_job_is_404_like_a_missing_one(app):
    client = app.test_client()
    login(client, "alice")
    for url in ("/api/jobs/team-b/secret-run/summary", "/api/jobs/team-b/secret-run/dashboard", "/api/jobs/team-b/secret-run/timeline",
                "/api/jobs/team-b/secret-run/perfetto", "/api/jobs/team-b/secret-run/stats/steps.csv", "/jobs/team-b/secret-run"):
        resp = client.get(url)
        assert resp.status_code == 404, url
        assert "secret" not in resp.get_data(as_text=True)
    missing = client.get("/api/jobs/team-a/no-such-run/summary")
    assert missing.status_code == 404 and missing.get_json() == client.get("/api/jobs/team-b/secret-run/summary").get_json()


def test_admin_sees_every_job(app):
    client = app.test_client()
    login(client, "root")
    ids = [j["id"] for j in client.get("/api/jobs").get_json()["jobs"]]
    assert sorted(ids) == ["team-a/run-1", "team-a/run-2", "team-b/secret-run"]


@pytest.mark.parametrize("url", [
    "/api/jobs/team-a/../team-b/secret-run/summary",
    "/api/jobs/team-a/%2e%2e/team-b/secret-run/summary",
    "/api/jobs/team-a/%2E%2E%2Fteam-b/secret-run/summary",
    "/api/jobs/team-a/run-1/../../../outside.txt/summary",
    "/api/jobs//etc/passwd/summary",
    "/api/jobs/%2Fetc%2Fpasswd/summary",
    "/api/jobs/team-a/..%5C..%5Cteam-b/summary",
    "/jobs/team-a/%2e%2e/team-b/secret-run",
])
def test_traversal_urls_are_refused(app, url):
    client = app.test_client()
    login(client, "alice")
    resp = client.get(url)
    assert resp.status_code in (400, 404), (url, resp.status_code)
    body = resp.get_data(as_text=True)
    assert "secret" not in body and "outside" not in body and "/tmp" not in body and "store" not in body


def test_traversal_refused_for_admin_too(app):
    client = app.test_client()
    login(client, "root")
    assert client.get("/api/jobs/team-a/%2e%2e/%2e%2e/outside.txt/summary").status_code == 404
    assert client.get("/api/jobs/..%2Foutside.txt/summary").status_code == 404


def test_symlink_out_of_the_store_is_not_a_job(app, store_root, tmp_path):
    from .conftest import write_profiler_job

    write_profiler_job(tmp_path / "elsewhere" / "job")
    (store_root / "team-a" / "link").symlink_to(tmp_path / "elsewhere" / "job")
    client = app.test_client()
    login(client, "alice")
    assert client.get("/api/jobs/team-a/link/summary").status_code == 404
    assert "team-a/link" not in [j["id"] for j in client.get("/api/jobs").get_json()["jobs"]]


def test_admin_actions_are_refused_to_users(app):
    client = app.test_client()
    csrf = login(client, "alice")
    headers = {"X-CSRF-Token": csrf}
    assert client.get("/api/users").status_code == 403
    assert client.post("/api/users", json={"name": "mallory", "password": "x" * 12, "admin": True}, headers=headers).status_code == 403
    assert client.delete("/api/users/bob", headers=headers).status_code == 403
    assert client.post("/api/users/alice/grant", json={"prefixes": ["team-b"]}, headers=headers).status_code == 403
    assert client.get("/admin").status_code == 404


def test_state_change_without_csrf_token_is_403(app, user_db):
    client = app.test_client()
    csrf = login(client, "root")
    assert client.post("/api/users", json={"name": "carol", "password": "y" * 12}).status_code == 403
    assert client.post("/api/users", json={"name": "carol", "password": "y" * 12}, headers={"X-CSRF-Token": "wrong"}).status_code == 403
    assert "carol" not in [u.name for u in user_db.users()]
    created = client.post("/api/users", json={"name": "carol", "password": "y" * 12, "prefixes": ["team-b"]}, headers={"X-CSRF-Token": csrf})
    assert created.status_code == 201 and user_db.user("carol").prefixes == ("team-b",)
    assert client.post("/logout").status_code == 403  # logging out is a state change too


def test_removed_users_session_and_token_stop_working(app, user_db):
    admin, victim = app.test_client(), app.test_client()
    csrf = login(admin, "root")
    login(victim, "alice")
    token = user_db.new_token("alice")
    scripted = app.test_client()
    auth = {"Authorization": f"Bearer {token}"}
    assert victim.get("/api/jobs").status_code == 200 and scripted.get("/api/jobs", headers=auth).status_code == 200
    assert admin.delete("/api/users/alice", headers={"X-CSRF-Token": csrf}).status_code == 200
    assert victim.get("/api/jobs").status_code == 401
    assert scripted.get("/api/jobs", headers=auth).status_code == 401


def test_password_reset_closes_sessions(app, user_db):
    client = app.test_client()
    login(client, "alice")
    user_db.set_password("alice", "another password")
    assert client.get("/api/jobs").status_code == 401


def test_bearer_token_needs_no_csrf_and_bad_tokens_fail(app, user_db):
    client = app.test_client()
    token = user_db.new_token("root")
    assert client.get("/api/jobs", headers={"Authorization": "Bearer nope"}).status_code == 401
    assert client.get("/api/jobs", headers={"Authorization": f"Basic {token}"}).status_code == 401
    resp = client.post("/api/users", json={"name": "dave", "prefixes": ["team-a"]}, headers={"Authorization": f"Bearer {token}"})
    assert resp.status_code == 201 and len(resp.get_json()["password"]) >= 12


def test_logout_ends_the_session(app):
    client = app.test_client()
    csrf = login(client, "alice")
    assert client.post("/logout", headers={"X-CSRF-Token": csrf}).status_code == 302
    assert client.get("/api/jobs").status_code == 401


def test_errors_do_not_leak_paths(app, store_root):
    # a corrupt job: its timeline file is not JSON; the reader skips it, and anything that
    # still fails answers without naming files
    client = app.test_client()
    login(client, "root")
    for url in ("/api/jobs/team-a/run-1/timeline?start=abc", "/api/jobs/team-a/run-1/timeline/event?lane=zzz&i=3", "/api/nothing"):
        resp = client.get(url)
        assert resp.status_code in (400, 404)
        assert str(store_root) not in resp.get_data(as_text=True)


def test_security_headers(app):
    resp = app.test_client().get("/login")
    assert "default-src 'self'" in resp.headers["Content-Security-Policy"]
    assert resp.headers["X-Content-Type-Options"] == "nosniff"


def test_malformed_requests_are_4xx_not_500(app):
    client = app.test_client()
    csrf = login(client, "root")
    resp = client.post("/api/users", data=b"\xff\xfe not json", headers={"X-CSRF-Token": csrf, "Content-Type": "application/json"})
    assert resp.status_code == 400
    assert client.put("/api/users", headers={"X-CSRF-Token": csrf}).status_code == 405
    big = client.post("/api/users", data=b"x" * 100_000, headers={"X-CSRF-Token": csrf, "Content-Type": "application/json"})
    assert big.status_code == 413
