"""Sections built from jobs that lack data say what to save; the cost section shows what
the hooks measured; a failing section does not lose the report."""

from __future__ import annotations

import time

import numpy as np
import pytest

from stepscope import create_trial
from stepscope.capture.cost import CostMeter, cost_key
from stepscope.exceptions import ConfigError
from stepscope.job_files import read_costs
from stepscope.report import build_report
from stepscope.report.build import _guarded
from stepscope.report.html import format_value


def test_a_tensor_only_job(tmp_path, write_job):
    write_job(str(tmp_path / "job"), steps=6, eval_steps=2)
    report = build_report(str(tmp_path / "job"), rules="none")
    assert [s.key for s in report.sections] == ["summary", "rules", "health", "system", "steps", "gpu", "distributed", "memory", "cost"]
    for key, needle in (("system", "system_monitor"), ("steps", "step_timeline"), ("gpu", "traces"), ("cost", "hook"), ("rules", "stepscope check")):
        assert any(needle in text for text in report.section(key).missing), key
    trial = create_trial(str(tmp_path / "job"))
    curves = report.section("health").table("curves")
    assert [r[:3] for r in curves.rows] == [("loss", "TRAIN", 6), ("loss", "EVAL", 2)]
    train = trial.tensor("loss").values(mode="train")
    assert curves.rows[0][4] == pytest.approx(float(train[0])) and curves.rows[0][6] == pytest.approx(float(train[5]))
    saved = report.section("summary").table("saved")
    assert ("weights", 1) == saved.rows[[r[0] for r in saved.rows].index("weights")][:2]


def test_a_loss_that_blew_up_is_captioned_with_its_values_not_drawn(tmp_path):
    from stepscope.capture.collection_manager import CollectionManager
    from stepscope.capture.writer import Writer
    from stepscope.modes import ModeKeys
    from stepscope.report.model import Figure

    with Writer(str(tmp_path / "job")) as writer:
        writer.write_collections(CollectionManager(builtin_regexes={"losses": ["loss"], "metrics": ["trainer/"]}).dumps(1))
        for step, loss in enumerate([1.5, 2.0e6, float("inf"), float("nan"), 3.0]):
            writer.write_step(step, ModeKeys.TRAIN, step, {"loss": np.float32(loss), "trainer/global_step": np.float32(step)})
    report = build_report(str(tmp_path / "job"), rules="none")
    health = report.section("health")
    assert [b.key for b in health.blocks if isinstance(b, Figure) and b.key.startswith("curve-")] == ["curve-loss"]  # no step counter
    figure = next(b for b in health.blocks if isinstance(b, Figure) and b.key == "curve-loss")
    assert figure.caption.endswith("; 2 NaN or infinite value(s) not drawn, the first at global step 2"), figure.caption


def test_cost_section_shows_what_the_hooks_measured(tmp_path, write_job):
    _, writer = write_job(str(tmp_path / "job"), steps=3, eval_steps=0)
    meter = CostMeter("worker_0", {"torch": "2.x"})
    inner = meter.timed(lambda: time.sleep(0.001))
    outer = meter.timed(lambda: inner())  # nested entry points count once
    for step in range(3):
        meter.step_begins(step, 10.0 + 0.5 * step)
        outer()
    meter.step_ends(11.5)
    writer.store.write(cost_key("worker_0"), meter.to_bytes(writer_s=0.3, bytes_written=1234))
    cost = read_costs(writer.store)["worker_0"]
    assert cost.steps == 3 and cost.step_s == 1.5 and 0.003 <= cost.hook_s < 0.1 and len(cost.samples) == 3
    assert [s for s, _, _ in cost.samples] == [0, 1, 2] and all(0.001 <= h < 0.05 for _, _, h in cost.samples)
    report = build_report(str(tmp_path / "job"), rules="none")
    (row,) = report.section("cost").table("cost").rows
    assert row[0] == "worker_0" and row[1] == 3 and row[7] == 1234
    assert row[4] == f"{100 * cost.hook_s / cost.step_s:.2f} %" and row[6] == pytest.approx(100.0)
    versions = dict(report.section("summary").table("job").rows)
    assert versions["torch version"] == "2.x"
    assert format_value(row[5]) == format_value(round(1000 * cost.hook_s / 3, 4))


def test_samples_are_thinned_beyond_the_cap(monkeypatch):
    import stepscope.capture.cost as cost_module

    monkeypatch.setattr(cost_module, "MAX_SAMPLES", 8)
    meter = CostMeter("w")
    for step in range(100):
        meter.step_done(step, 0.01)
    steps = [s for s, _, _ in meter.cost.samples]
    assert meter.cost.steps == 100 and len(steps) <= 8 and steps == sorted(steps) and steps[0] == 0
    assert len(set(np.diff(steps))) == 1  # evenly spaced


def test_a_failing_section_is_reported_not_raised(tmp_path, write_job):
    def broken(ctx):
        raise RuntimeError("boom")

    section = _guarded(broken, None)
    assert "RuntimeError: boom" in section.missing[0]
    with pytest.raises(ConfigError, match="rules"):
        build_report(str(tmp_path), rules="sometimes")


def test_activation_rules_run_when_their_tensors_were_saved(tmp_path):
    from stepscope.capture.collection_manager import CollectionManager
    from stepscope.capture.writer import Writer
    from stepscope.modes import ModeKeys

    with Writer(str(tmp_path / "job")) as writer:
        writer.write_collections(CollectionManager().dumps())
        for step in range(3):
            dead = np.zeros((8, 4), dtype=np.float32)  # every unit inactive: DeadRelu fires
            writer.write_step(step, ModeKeys.TRAIN, step, {"layer1.relu_output": dead})
    report = build_report(str(tmp_path / "job"), rules="run")
    health = report.section("health")
    callouts = [b for b in health.blocks if getattr(b, "title", "").startswith("DeadRelu")]
    assert callouts and callouts[0].level == "bad"
    assert not any("Activation saturation" in m for m in health.missing)
    rules = {row[0]: row for row in report.section("rules").table("rules").rows}
    assert rules["DeadRelu"][2] == "fired" and "SaturatedActivation" not in rules
