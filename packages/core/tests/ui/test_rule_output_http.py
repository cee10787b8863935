"""The rule-output format end to end: `stepscope check` saves a report under a rule name
that needs escaping (rules.output.save_reports), and the app, served over HTTP as
`stepscope ui` serves it, reads it back under the same name (rules.output.load_report)."""

from __future__ import annotations

import http.cookiejar
import json
import re
import urllib.parse
import urllib.request

import numpy as np

from stepscope import layout
from stepscope.cli import main
from stepscope.ui.app import create_app
from stepscope.ui.jobs import JobStore

from .browser import LiveServer
from .conftest import PASSWORD


def _logged_in(url: str, name: str) -> urllib.request.OpenerDirector:
    """A client holding a session cookie, logged in through the form as a browser is."""
    opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(http.cookiejar.CookieJar()))
    page = opener.open(f"{url}/login", timeout=30).read().decode()
    token = re.search(r'name="csrf_token" value="([^"]+)"', page).group(1)
    form = urllib.parse.urlencode({"username": name, "password": PASSWORD, "csrf_token": token}).encode()
    opener.open(f"{url}/login", data=form, timeout=60).read()
    return opener


def test_a_rule_name_that_needs_escaping_is_read_back_by_the_app_over_http(tmp_path, user_db, write_job):
    root = tmp_path / "store"
    job = root / "team-a" / "run-1"
    written, _ = write_job(job, steps=24, eval_steps=0, seed=3)
    name = "Weights: var/step ../../x"
    config = tmp_path / "rules.json"
    config.write_text(json.dumps([{"RuleConfigurationName": name, "RuleParameters": {
        "rule_to_invoke": "TensorVariance", "tensor_regex": r"fc\.weight", "max_threshold": "1.0"}}]))
    main(["check", str(job), "--rules-config", str(config), "--quiet"])

    # The steps at which the weight's variance is above 1, computed here with numpy.
    expected = sorted(step for step, tensors in written.items() if float(np.var(tensors["fc.weight"].astype(np.float64))) > 1.0)
    assert 0 < len(expected) < len(written)
    key = layout.rule_output_key(name)
    assert key.count("/") == 1 and (job / key).is_file()  # escaped: one file inside rule-output/
    assert not (root / "team-a" / "x.json").exists()

    server = LiveServer(create_app(JobStore(str(root)), user_db))
    try:
        client = _logged_in(server.url, "alice")
        answer = json.loads(client.open(f"{server.url}/api/jobs/team-a/run-1/rules", timeout=60).read())
    finally:
        server.stop()
    rows = {row["rule"]: row for row in answer["rules"]}
    assert answer["problems"] == []
    row = rows[name]
    assert row["source"] == "stepscope check" and row["status"] == "fired" and row["kind"] == "tensor"
    assert row["steps"] == expected and row["violations"] == len(expected)
    assert row["evidence"][0]["tensor"] == "fc.weight" and row["evidence"][0]["step"] == expected[0]
    assert row["definition"] and row["advice"]  # the rule's explanation came back with its report
