"""The app's defences by mechanism: grants checked on the resolved job (no symlink lends
one), typed admin bodies, tokens dying with a password reset, the Host allow-list and HSTS,
one hostile job never breaking the list or answering 500, and the fast part of the app
probe (`stepscope.testing.app_probe`; the full one is bench/bench_probe_app.py)."""

from __future__ import annotations

import json

import pytest

from stepscope import layout
from stepscope.testing.app_probe import ENDPOINTS, HOSTILE_FILES, Tally, build_hostile_store, plant_links, verdict_hostile, verdict_link
from stepscope.ui.app import create_app, host_allowed
from stepscope.ui.jobs import JobNotFound, JobStore
from stepscope.ui.users import UserDB

from .conftest import PASSWORD, login


@pytest.fixture(scope="module")
def probe_store(tmp_path_factory):
    """A store with every hostile-file case under team-a, a valid job, team-b's secret job,
    and symlinks at every level pointing at team-b (built once: writing it takes seconds)."""
    root = tmp_path_factory.mktemp("probe") / "store"
    hostile = build_hostile_store(root)
    links = plant_links(root)
    return root, hostile, links


@pytest.fixture
def probe_client(probe_store, tmp_path):
    root, _, _ = probe_store
    db = UserDB(tmp_path / "users.sqlite3", argon2_memory_kib=256, argon2_time_cost=1)
    db.add_user("alice", PASSWORD, prefixes=["team-a", "team-a-mirror"])
    db.add_user("root", PASSWORD, admin=True)
    app = create_app(JobStore(str(root)), db)
    yield app.test_client(), {"Authorization": f"Bearer {db.new_token('alice')}"}, {"Authorization": f"Bearer {db.new_token('root')}"}
    db.close()


# --- grants on the resolved job ---------------------------------------------------------


def test_every_symlink_case_answers_as_a_missing_job_on_every_endpoint(probe_store, probe_client):
    _, _, links = probe_store
    client, alice, root = probe_client
    tally = Tally()
    for case, job in links.items():
        for who in (alice, root):  # not even an administrator is served a link as a job
            for endpoint in ENDPOINTS:
                url = endpoint.format(job=job)
                resp = client.get(url, headers=who)
                tally.add(case, url, verdict_link(resp.status_code, resp.data))
    assert tally.tried == len(links) * len(ENDPOINTS) * 2 and len(links) >= 8
    assert (tally.escapes, tally.tracebacks, tally.hangs) == (0, 0, 0), tally.problems[:10]
    listed = [j["id"] for j in client.get("/api/jobs", headers=alice).get_json()["jobs"]]
    assert not set(listed) & set(links.values())
    assert not any("secret" in job for job in listed)


def test_the_link_targets_are_readable_by_their_own_team(probe_store, probe_client):
    """The refusals above are about the links, not a broken job: team-b's job itself reads."""
    client, _, root = probe_client
    resp = client.get("/api/jobs/team-b/secret/summary", headers=root)
    assert resp.status_code == 200 and resp.get_json()["steps"] == 12


def test_resolve_walks_without_following_links(probe_store):
    root, _, links = probe_store
    store = JobStore(str(root))
    assert store.resolve("team-b/secret") == "team-b/secret"
    for job in links.values():
        with pytest.raises(JobNotFound):
            store.resolve(job)
    with pytest.raises(JobNotFound):
        store.resolve("TEAM-B/secret")  # a name must match the folder's own spelling


def test_a_link_made_after_the_job_was_opened_is_refused_on_the_next_request(tmp_path):
    from stepscope.testing.app_probe import write_job

    root = tmp_path / "store"
    write_job(root / "team-a" / "run")
    write_job(root / "team-b" / "secret")
    db = UserDB(tmp_path / "u.sqlite3", argon2_memory_kib=256, argon2_time_cost=1)
    db.add_user("alice", PASSWORD, prefixes=["team-a"])
    headers = {"Authorization": f"Bearer {db.new_token('alice')}"}
    client = create_app(JobStore(str(root)), db).test_client()
    assert client.get("/api/jobs/team-a/run/summary", headers=headers).status_code == 200  # opened and cached
    (root / "team-a" / "run").rename(tmp_path / "moved")
    (root / "team-a" / "run").symlink_to(root / "team-b" / "secret")
    for endpoint in ENDPOINTS:
        resp = client.get(endpoint.format(job="team-a/run"), headers=headers)
        assert resp.status_code == 404, endpoint


def test_s3_job_ids_are_checked_keys():
    """An S3 store has no links: the id it authorises is the checked key itself, and any
    key that could name another prefix is refused before a request is sent."""
    store = JobStore("s3://bucket/jobs")
    assert store.resolve("team-a/run-1") == "team-a/run-1"
    for bad in ("team-a/../team-b/x", "team-a//x", "/team-b/x", "team-a/./x", "team-a\\..\\team-b", "team-a/x\x00"):
        with pytest.raises(JobNotFound):
            store.resolve(bad)


def test_parallel_requests_on_hostile_and_good_jobs(probe_store, probe_client):
    """32 requests at once (threads sharing one app, as the server's workers do): the good
    job answers 200 every time and no hostile job answers 500."""
    from concurrent.futures import ThreadPoolExecutor

    _, hostile, _ = probe_store
    client_app = probe_client[0].application
    _, _, root = probe_client  # the administrator sees the good job and every hostile one
    urls = [f"/api/jobs/good/job/{view}" for view in ("summary", "dashboard", "rules", "stats", "timeline")] * 3
    urls += [f"/api/jobs/{job}/dashboard" for job in list(hostile.values())[:12]] + ["/api/jobs"] * 5

    def fetch(url: str) -> tuple[str, int]:
        return url, client_app.test_client().get(url, headers=root).status_code

    with ThreadPoolExecutor(32) as pool:
        answers = list(pool.map(fetch, urls))
    assert all(status == 200 for url, status in answers if "/good/" in url or url == "/api/jobs"), answers
    assert not [a for a in answers if a[1] >= 500]


# --- hostile jobs --------------------------------------------------------------------------


def test_hostile_jobs_never_answer_500_on_any_endpoint(probe_store, probe_client):
    """The fast part of the probe: every hostile-file case x every job endpoint."""
    _, hostile, _ = probe_store
    client, alice, _ = probe_client
    tally = Tally()
    for case, job in hostile.items():
        for endpoint in ENDPOINTS:
            url = endpoint.format(job=job)
            resp = client.get(url, headers=alice)
            tally.add(case, url, verdict_hostile(resp.status_code, resp.data))
            if resp.status_code == 422:  # the job's fault: said so, with no path of the machine
                message = resp.get_json()["error"]
                assert message.startswith("the job's data could not be read") and "/tmp" not in message and str(tmp_root(probe_store)) not in message
    print(tally.line())
    assert tally.tried == len(HOSTILE_FILES) * len(ENDPOINTS)
    assert (tally.escapes, tally.tracebacks, tally.hangs) == (0, 0, 0), tally.problems[:10]


def tmp_root(probe_store):
    return probe_store[0]


def test_jobs_list_answers_with_hostile_jobs_and_names_them(probe_store, probe_client):
    _, hostile, _ = probe_store
    client, alice, root = probe_client
    resp = client.get("/api/jobs", headers=root)
    assert resp.status_code == 200
    rows = {row["id"]: row for row in resp.get_json()["jobs"]}
    assert rows["good/job"]["status"] == "finished" and rows["good/job"]["steps"] == 12
    assert set(hostile.values()) <= set(rows)
    unreadable = {job for job, row in rows.items() if row["status"] == "unreadable"}
    assert all(rows[job]["error"].startswith("the job's data could not be read") for job in unreadable)
    # NaN or huge timestamps give no invalid JSON (NaN is not JSON): the answer parses strictly
    json.loads(resp.get_data(as_text=True), parse_constant=lambda c: pytest.fail(f"{c} in the answer"))


def test_a_job_whose_summary_fails_is_shown_unreadable_and_the_others_read(app, monkeypatch):
    """Isolation, whatever the fault: a reader raising on one job (simulated here: the real
    hostile files are all skipped by the readers now) leaves the list answering."""
    real = JobStore.summary

    def summary(self, job):
        if job == "team-a/run-2":
            raise RecursionError("maximum recursion depth exceeded while decoding a JSON array")
        return real(self, job)

    monkeypatch.setattr(JobStore, "summary", summary)
    client = app.test_client()
    login(client, "alice")
    rows = {r["id"]: r for r in client.get("/api/jobs").get_json()["jobs"]}
    assert rows["team-a/run-2"]["status"] == "unreadable" and rows["team-a/run-2"]["error"] == "the job's data could not be read (nested too deeply)"
    assert rows["team-a/run-1"]["status"] == "finished" and rows["team-a/run-1"]["steps"] == 40


def test_rule_report_is_read_under_the_name_check_gives_it(tmp_path, user_db):
    """`check` saves a rule's report as layout.rule_output_key(name) (unsafe characters
    escaped); the app reads it back under the same name."""
    from stepscope.testing.app_probe import write_job

    root = tmp_path / "store"
    job = write_job(root / "team-a" / "run-1")
    name = "My rule: step/time"
    (job / layout.RULE_OUTPUT_DIR).mkdir()
    (job / layout.RULE_OUTPUT_DIR / "summary.json").write_text(json.dumps({"rules": [{"rule": name, "fired": True, "kind": "profiler"}]}))
    (job / layout.rule_output_key(name)).write_text(json.dumps({"rule": name, "fired": True, "violations": 3, "details": [{"step": 4}],
                                                              "explanation": {"advice": ["look at step 4"]}}))
    client = create_app(JobStore(str(root)), user_db).test_client()
    login(client, "alice")
    rows = {r["rule"]: r for r in client.get("/api/jobs/team-a/run-1/rules").get_json()["rules"]}
    assert rows[name]["violations"] == 3 and rows[name]["steps"] == [4] and rows[name]["advice"] == ["look at step 4"]


@pytest.mark.parametrize(("case", "named"), [
    ("rule_output_deeply_nested", "rule-output/StepOutlier.json"),
    ("rule_summary_deeply_nested", "rule-output/summary.json"),
    ("rule_summary_not_json", "rule-output/summary.json"),
])
def test_an_unreadable_rule_report_is_named_and_the_rest_still_show(probe_store, probe_client, case, named):
    _, hostile, _ = probe_store
    client, alice, _ = probe_client
    resp = client.get(f"/api/jobs/{hostile[case]}/rules", headers=alice)
    assert resp.status_code == 200
    answer = resp.get_json()
    assert [p for p in answer["problems"] if p.startswith(named)], answer["problems"]
    assert answer["rules"]  # the live whole-job rules still ran on the rest of the job
    assert all("/tmp" not in p for p in answer["problems"])


def test_files_the_reader_skipped_are_named_relative_to_the_job(tmp_path, user_db):
    import shutil

    from stepscope.testing import hostile_jobs

    root = tmp_path / "store"
    made = hostile_jobs.build("index_not_json", tmp_path / "case")
    (root / "team-a").mkdir(parents=True)
    shutil.move(str(made.job), str(root / "team-a" / "broken-index"))
    client = create_app(JobStore(str(root)), user_db).test_client()
    login(client, "alice")
    [row] = client.get("/api/jobs").get_json()["jobs"]
    assert row["status"] != "unreadable" and row["steps"] == hostile_jobs.STEPS - 1  # the rest of the job reads
    assert len(row["skipped"]) == 1 and row["skipped"][0].startswith("index/") and "not valid JSON" in row["skipped"][0]
    assert str(tmp_path) not in json.dumps(row)


def test_time_arguments_out_of_range_are_400(app):
    client = app.test_client()
    login(client, "alice")
    for query in ("start=0&end=1e30", "start=nan", "end=inf", "start=-1e19"):
        resp = client.get(f"/api/jobs/team-a/run-1/timeline?{query}")
        assert resp.status_code == 400 and "nanoseconds" in resp.get_json()["error"], query


# --- admin request bodies -----------------------------------------------------------------


@pytest.mark.parametrize(("body", "field"), [
    ({"name": "eve", "admin": "false"}, "admin"),
    ({"name": "eve", "admin": 0}, "admin"),
    ({"name": "eve", "prefixes": "team-b"}, "prefixes"),
    ({"name": "eve", "prefixes": ["team-a", 5]}, "prefixes"),
    ({"name": "eve", "password": 12345678}, "password"),
    ({"name": ["eve"]}, "name"),
    ({"admin": True}, "name"),
    ({"name": "eve", "prefix": ["team-b"]}, "prefix"),
])
def test_new_user_fields_are_typed(app, user_db, body, field):
    client = app.test_client()
    csrf = login(client, "root")
    resp = client.post("/api/users", json=body, headers={"X-CSRF-Token": csrf})
    assert resp.status_code == 400 and field in resp.get_json()["error"]
    assert "eve" not in [u.name for u in user_db.users()]


@pytest.mark.parametrize("raw", ["[]", "null", '"admin"', "7", "{nope", ""])
def test_admin_bodies_that_are_not_objects_are_400(app, raw):
    client = app.test_client()
    csrf = login(client, "root")
    headers = {"X-CSRF-Token": csrf, "Content-Type": "application/json"}
    for url in ("/api/users", "/api/users/alice/grant"):
        resp = client.post(url, data=raw, headers=headers)
        assert resp.status_code == 400 and "JSON object" in resp.get_json()["error"], (url, raw)


def test_typed_bodies_still_do_their_job(app, user_db):
    client = app.test_client()
    csrf = login(client, "root")
    headers = {"X-CSRF-Token": csrf}
    resp = client.post("/api/users", json={"name": "eve", "admin": False, "prefixes": ["team-b"]}, headers=headers)
    assert resp.status_code == 201 and resp.get_json()["user"] == {"name": "eve", "admin": False, "prefixes": ["team-b"]}
    resp = client.post("/api/users/eve/grant", json={"prefixes": ["team-a"], "revoke": ["team-b"]}, headers=headers)
    assert resp.get_json()["user"]["prefixes"] == ["team-a"]
    assert client.post("/api/users/eve/grant", json={"revoke": "team-a"}, headers=headers).status_code == 400
    assert user_db.user("eve").prefixes == ("team-a",)


def test_password_reset_revokes_api_tokens(app, user_db):
    token = user_db.new_token("alice")
    bearer = {"Authorization": f"Bearer {token}"}
    client = app.test_client()
    assert client.get("/api/jobs", headers=bearer).status_code == 200
    admin = app.test_client()
    csrf = login(admin, "root")
    assert admin.post("/api/users/alice/password", headers={"X-CSRF-Token": csrf}).status_code == 200
    assert client.get("/api/jobs", headers=bearer).status_code == 401
    user_db.new_token("bob")
    user_db.set_password("bob", "another password")  # the CLI's reset goes through the same call
    assert user_db.user_for_token(token) is None
    assert user_db._conn.execute("SELECT COUNT(*) FROM tokens WHERE user_id = ?", (user_db.user("bob").id,)).fetchone()[0] == 0


# --- Host allow-list and HSTS ---------------------------------------------------------------


def test_unknown_host_names_are_refused_before_anything_else(app):
    client = app.test_client()
    for host in ("evil.example", "evil.example:8080", "localhost.evil.example", ""):
        resp = client.get("/login", headers={"Host": host})
        assert resp.status_code == 400 and "host" in resp.get_json()["error"], host
    for host in ("localhost", "localhost:8080", "127.0.0.1:8080", "[::1]:8080"):
        assert client.get("/login", headers={"Host": host}).status_code == 200, host


def test_host_allow_list_rules():
    named = frozenset({"localhost", "stepscope.example.org"})
    assert host_allowed("STEPSCOPE.example.org:443", named)
    assert not host_allowed("10.0.0.5", named)
    wildcard = frozenset({"localhost", "*ip"})
    assert host_allowed("10.0.0.5:8080", wildcard) and host_allowed("[fe80::1]", wildcard)
    assert not host_allowed("rebind.attacker.example", wildcard)


def test_cli_allows_the_bound_address_and_extra_names():
    from stepscope.ui.cli import allowed_hosts

    assert set(allowed_hosts("10.1.2.3", ["Stepscope.Example.org"])) >= {"localhost", "10.1.2.3", "stepscope.example.org"}
    assert "*ip" not in allowed_hosts("10.1.2.3", [])
    assert "*ip" in allowed_hosts("0.0.0.0", [])


def test_hsts_only_under_tls(store_root, user_db):
    plain = create_app(JobStore(str(store_root)), user_db).test_client()
    assert "Strict-Transport-Security" not in plain.get("/login").headers
    secure = create_app(JobStore(str(store_root)), user_db, secure_cookies=True).test_client()
    assert secure.get("/login").headers["Strict-Transport-Security"].startswith("max-age=")
