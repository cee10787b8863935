"""`stepscope check`: exit status, table and JSON output, reports under rule-output/, rule
specifications, rules configuration files, custom rules, S3."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from stepscope.cli import main, parse_rule_spec

pytestmark = pytest.mark.heavy


def test_parse_rule_spec():
    assert parse_rule_spec("VanishingGradient") == ("VanishingGradient", {})
    assert parse_rule_spec("VanishingGradient:threshold=1e-4") == ("VanishingGradient", {"threshold": "1e-4"})
    assert parse_rule_spec("NLPSequenceRatio:token_values=0,1,token_thresholds_percent=50,60") == (
        "NLPSequenceRatio", {"token_values": "0,1", "token_thresholds_percent": "50,60"},
    )
    assert parse_rule_spec("my.rules:Mine") == ("my.rules:Mine", {})
    assert parse_rule_spec("my.rules:Mine:limit=3") == ("my.rules:Mine", {"limit": "3"})


def test_healthy_run_exits_0_and_writes_reports(runs, capsys):
    path = runs("healthy")
    assert main(["check", str(path), "--quiet"]) == 0
    out = capsys.readouterr().out
    assert "VanishingGradient" in out and "LossNotDecreasing" in out and "fired" not in out
    summary = json.loads((path / "rule-output" / "summary.json").read_text())
    # The default set: every rule whose inputs the run saved (ReLU outputs: DeadRelu).
    assert {r["rule"] for r in summary["rules"]} == {
        "VanishingGradient", "ExplodingTensor", "LossNotDecreasing", "LossDivergence", "ChanceLevelLoss", "SlowConvergence", "WeightUpdateRatio", "Overfit",
        "AllZero", "DeadRelu",
    }
    statuses = {r["rule"]: r["status"] for r in summary["rules"]}
    # 40 saved losses and 4 evaluations: too few for SlowConvergence and Overfit's trend, which say so.
    assert statuses.pop("SlowConvergence") == statuses.pop("Overfit") == "not enough data"
    assert statuses.pop("ChanceLevelLoss") == "no data"  # a regression loss (MSE) has no chance level
    assert set(statuses.values()) == {"ok"}, summary
    report = json.loads((path / "rule-output" / "VanishingGradient.json").read_text())
    assert report["fired"] is False and report["steps_evaluated"] == 48


def test_a_firing_rule_exits_1(runs, capsys):
    assert main(["check", str(runs("exploding")), "--rule", "ExplodingTensor", "--quiet", "--no-write"]) == 1
    assert "ExplodingTensor  fired" in capsys.readouterr().out
    assert not (runs("exploding") / "rule-output").exists()


def test_rule_parameters_on_the_command_line(runs, capsys):
    path = str(runs("healthy"))
    assert main(["check", path, "--rule", "LossNotDecreasing:diff_percent=99", "--json", "--no-write", "--quiet"]) == 1
    (report,) = json.loads(capsys.readouterr().out)
    assert report["rule"] == "LossNotDecreasing" and report["status"] == "fired" and report["parameters"]["diff_percent"] == 99.0


def test_step_range(runs, capsys):
    path = str(runs("nan_gradient"))
    assert main(["check", path, "--rule", "ExplodingTensor", "--end-step", "5", "--no-write", "--quiet"]) == 0
    assert main(["check", path, "--rule", "ExplodingTensor", "--start-step", "5", "--no-write", "--quiet"]) == 1


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--rule", "NoSuchRule"], "unknown rule 'NoSuchRule'; valid: VanishingGradient"),
        (["--rule", "VanishingGradient:treshold=1"], "unknown parameter(s) 'treshold'"),
        (["--rule", "VanishingGradient:threshold"], "expected key=value"),
        (["--start-step", "5", "--end-step", "5"], "--end-step (5) must be greater"),
        (["--rule", "nosuchmodule.rules:Rule"], "cannot import nosuchmodule.rules"),
    ],
)
def test_usage_errors_exit_2(runs, capsys, argv, message):
    assert main(["check", str(runs("healthy")), "--no-write", *argv]) == 2
    assert message in capsys.readouterr().err


def test_unreadable_path_exits_2(tmp_path, capsys):
    assert main(["check", str(tmp_path / "nothing-here")]) == 2
    assert "no saved data" in capsys.readouterr().err
    assert main(["check"]) == 2  # argparse usage error


def test_rules_config_file(runs, tmp_path):
    config = tmp_path / "rules.json"
    config.write_text(json.dumps([
        {"DebugRuleConfiguration": {"RuleConfigurationName": "LossNotDecreasing", "RuleParameters": {"rule_to_invoke": "LossNotDecreasing"}},
         "CollectionConfigurations": [{"CollectionName": "losses", "CollectionParameters": {"save_interval": "500"}}]},
        {"DebugRuleConfiguration": {"RuleConfigurationName": "StrictLoss", "RuleParameters": {"rule_to_invoke": "LossNotDecreasing", "diff_percent": "99"}}},
    ]))
    path = runs("healthy")
    assert main(["check", str(path), "--rules-config", str(config), "--quiet"]) == 1
    summary = {r["rule"]: r["status"] for r in json.loads((path / "rule-output" / "summary.json").read_text())["rules"]}
    assert summary == {"LossNotDecreasing": "ok", "StrictLoss": "fired"}


USER_RULE = textwrap.dedent('''
    from dataclasses import dataclass

    from stepscope.rules import Rule, RuleParams, TensorRequest


    @dataclass(frozen=True)
    class LossAboveParams(RuleParams):
        limit: float = 100.0


    class LossAbove(Rule):
        """Fires when a loss in the `losses` collection is above `limit`."""

        params: LossAboveParams

        def losses(self):
            return self.select_tensors(collections=["losses"], all_when_empty=False)

        def required_tensors(self, step):
            return [TensorRequest(name, step) for name in self.losses()]

        def invoke_at_step(self, step):
            fired = False
            for name in self.losses():
                loss = self.value(name, step)
                if loss is not None and float(loss) > self.params.limit:
                    self.violation(step, f"{name} = {float(loss):.3g} > {self.params.limit:g}", tensor=name)
                    fired = True
            return fired
''')


def test_custom_rule(runs, tmp_path, monkeypatch, capsys):
    (tmp_path / "my_rules.py").write_text(USER_RULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    path = str(runs("healthy"))
    assert main(["check", path, "--rule", "my_rules:LossAbove:limit=1", "--no-write", "--quiet"]) == 1
    assert main(["check", path, "--rule", "my_rules:LossAbove", "--no-write", "--quiet"]) == 0
    assert "LossAbove" in capsys.readouterr().out


def test_the_documented_user_rule_is_this_one():
    docs = (Path(__file__).parents[4] / "docs" / "rules.md").read_text()
    assert USER_RULE.strip().split("\n", 1)[1].strip() in docs


def test_profiler_rules_by_name(runs, capsys):
    pytest.importorskip("stepscope.rules.profiler")
    code = main(["check", str(runs("healthy")), "--rule", "LowGPUUtilization", "--rule", "VanishingGradient", "--json", "--no-write", "--quiet"])
    reports = json.loads(capsys.readouterr().out)
    assert {r["kind"] for r in reports} == {"tensor", "job"}
    assert {r["rule"]: r["status"] for r in reports}["LowGPUUtilization"] == "no data"
    assert code in (0, 2)  # no system metrics were recorded by these runs


def test_console_script_in_a_subprocess(runs):
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    command = [sys.executable, "-c", "import sys; from stepscope.cli import main; sys.exit(main())"]
    done = subprocess.run([*command, "check", str(runs("frozen")), "--rule", "UnchangedTensor:collection_names=weights", "--no-write"], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 1, done.stderr
    assert "UnchangedTensor" in done.stdout
    script = Path(sys.executable).with_name("stepscope")
    if script.exists():
        done = subprocess.run([str(script), "check", str(runs("healthy")), "--quiet", "--no-write"], capture_output=True, text=True, env=env, timeout=120)
        assert done.returncode == 0, done.stdout + done.stderr


def test_check_on_s3(runs, s3_url, capsys):
    from stepscope.store import open_store

    local = runs("nan_gradient")
    store = open_store(s3_url)
    for file in sorted(p for p in local.rglob("*") if p.is_file() and "rule-output" not in p.parts):
        store.write(file.relative_to(local).as_posix(), file.read_bytes())
    assert main(["check", s3_url, "--rule", "ExplodingTensor", "--quiet"]) == 1
    report = json.loads(store.read("rule-output/ExplodingTensor.json"))
    assert report["fired_steps"][0] == 5
    assert "ExplodingTensor" in json.loads(store.read("rule-output/summary.json"))["rules"][0]["rule"]


def test_watch_follows_a_job_that_starts_writing_later(tmp_path, capsys):
    """`check --watch` on a folder that is still empty: it waits for the job, follows it as
    steps arrive, reports the NaN planted at step 7 and returns once the job has ended."""
    import threading
    import time

    import numpy as np

    from stepscope.capture.collection_manager import CollectionManager
    from stepscope.capture.writer import Writer
    from stepscope.modes import ModeKeys

    job = tmp_path / "job"

    def train():
        time.sleep(0.3)
        writer = Writer(str(job))
        writer.write_collections(CollectionManager(builtin_regexes={"gradients": ["^gradient/"]}).dumps())
        for step in range(12):
            grad = np.full((3, 3), 0.01, np.float32)
            if step == 7:
                grad[0, 0] = np.nan
            writer.write_step(step, ModeKeys.TRAIN, step, {"gradient/w": grad})
            writer.flush()
            time.sleep(0.05)
        writer.close()

    trainer = threading.Thread(target=train)
    trainer.start()
    status = main(["check", str(job), "--watch", "--rule", "ExplodingTensor", "--poll-interval", "0.05", "--timeout", "60", "--json", "--quiet"])
    trainer.join()
    (report,) = json.loads(capsys.readouterr().out)
    assert status == 1 and report["fired_steps"] == [7] and report["steps_evaluated"] == 12
