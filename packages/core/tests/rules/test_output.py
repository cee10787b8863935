"""The one rule-output module: what `save_reports` writes, `load_reports` reads back as the
same RuleReport (status, summary, evidence, explanation); files of the wrong shape are
named in `problems` and the others still load."""

from __future__ import annotations

import json

import numpy as np

from stepscope import create_trial
from stepscope.rules import ExplodingTensor, RuleReport, TensorVariance, run_rules
from stepscope.rules.output import SUMMARY_KEY, load_report, load_reports, load_summary, report_key, save_reports
from stepscope.store import LocalStore


def test_saved_reports_load_back_as_the_same_reports(tmp_path, write_job):
    written, _ = write_job(tmp_path / "job", steps=16, eval_steps=2, seed=5)
    trial = create_trial(str(tmp_path / "job"))
    rules = [TensorVariance(trial, name="var: fc/weight", tensor_regex=r"fc\.weight", max_threshold="1.0"), ExplodingTensor(trial)]
    reports = run_rules(rules)
    store = LocalStore(tmp_path / "job")
    save_reports(store, reports, "job")

    loaded = load_reports(store)
    assert [r.to_json() for r in loaded] == sorted((json.loads(json.dumps(r.to_json())) for r in reports), key=lambda r: report_key(r["rule"]))
    variance = load_report(store, "var: fc/weight")
    expected = sorted(s for s, t in written.items() if float(np.var(t["fc.weight"].astype(np.float64))) > 1.0)
    assert variance.status == "fired" and variance.fired_steps == expected and variance.evidence[0].where == reports[0].evidence[0].where
    assert [row["rule"] for row in load_summary(store)] == ["var: fc/weight", "ExplodingTensor"]


def test_older_shapes_and_hostile_files(tmp_path):
    store = LocalStore(tmp_path)
    store.write(report_key("Old"), json.dumps({"rule": "Old", "fired": True, "violations": 2, "details": [{"step": 7, "message": "m"}]}).encode())
    store.write(report_key("Bad"), json.dumps({"rule": "Bad", "violations": "many"}).encode())
    store.write(report_key("Deep"), b"[" * 5000 + b"]" * 5000)
    store.write(SUMMARY_KEY, b"[1, 2]")
    problems: list[str] = []
    (old,) = load_reports(store, problems)
    assert old.status == "fired" and old.summary() == "2 violation(s): m" and old.evidence[0].where == "step 7"
    assert sorted(p.split(":")[0] for p in problems) == ["rule-output/Bad.json", "rule-output/Deep.json"]
    assert "violations must be a non-negative integer" in " ".join(problems)
    assert load_summary(store, problems) == [] and problems[-1] == f"{SUMMARY_KEY}: no list of rules"
    assert load_report(store, "Missing") is None and load_reports(LocalStore(tmp_path / "empty")) is None


def test_a_live_report_and_its_loaded_copy_agree():
    live = RuleReport("A", "A", "job", {"x": 1}, datapoints=3)
    live.need(5, 3, "samples", "more samples")
    copy = RuleReport.from_json(json.loads(json.dumps(live.to_json())))
    assert copy.status == live.status == "not enough data" and copy.summary() == live.summary() == "not enough data (needs 5 samples, has 3)"
    assert copy.judged is live.judged is False and copy.to_save == "more samples" and copy.row() == live.row()
