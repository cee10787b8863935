"""The one rule model, on jobs written with the core Writer (no framework): one report type
for tensor and whole-job rules, fired derived from violations, steps labelled with their
mode, actions on both kinds, the default set chosen from what the job saved, --explain."""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass

import numpy as np
import pytest

from stepscope import create_trial, modes
from stepscope.capture.collection_manager import CollectionManager
from stepscope.capture.control import read_stop
from stepscope.capture.writer import Writer
from stepscope.cli import main
from stepscope.exceptions import ConfigError
from stepscope.modes import ModeKeys
from stepscope.rules import (
    ExplodingTensor,
    JobRule,
    Log,
    Rule,
    RuleParams,
    StopTraining,
    default_rules,
    jsonable,
    ranged,
    run_rules,
)

BUILTIN = {"weights": [r"^(?!gradient).*weight"], "biases": [r"^(?!gradient).*bias"], "gradients": ["^gradient"], "losses": ["[Ll]oss"]}


def write_job(out_dir, *, nan_at: int | None = None, eval_every: int = 4, relu_class: bool = False) -> str:
    """TRAIN steps with an EVAL step after every `eval_every`, a weight, its gradient, a loss,
    and (with `relu_class`) a ReLU output named like a torch module output."""
    rng = np.random.default_rng(0)
    manager = CollectionManager(builtin_regexes=BUILTIN)
    if relu_class:
        manager.note_module_class("net.1_output_0", "ReLU")
    global_step = train_step = eval_step = 0
    with Writer(str(out_dir)) as writer:
        writer.write_collections(manager.dumps())
        for _ in range(12):
            weight = rng.standard_normal((4, 4)).astype(np.float32)
            tensors = {"fc.weight": weight, "gradient/fc.weight": weight * 0.01, "MSELoss_output_0": np.float32(1.0 / (train_step + 1))}
            if relu_class:
                tensors["net.1_output_0"] = np.maximum(rng.standard_normal((8, 16)), 0).astype(np.float32)
            if nan_at == global_step:
                tensors["gradient/fc.weight"] = tensors["gradient/fc.weight"].copy()
                tensors["gradient/fc.weight"][0, 0] = np.nan
            writer.write_step(global_step, ModeKeys.TRAIN, train_step, tensors)
            global_step, train_step = global_step + 1, train_step + 1
            if train_step % eval_every == 0:
                writer.write_step(global_step, ModeKeys.EVAL, eval_step, {"MSELoss_output_0": np.float32(1.2)})
                global_step, eval_step = global_step + 1, eval_step + 1
    return str(out_dir)


@dataclass(frozen=True)
class _MemoryParams(RuleParams):
    limit: float = ranged(50.0, "percent")
    mode: str | None = ranged(None, "mode")


class MemoryHog(JobRule):
    """A whole-job rule over the system metrics: fires when any MemoryUsedPercent sample is above `limit`."""

    Params = _MemoryParams
    params: _MemoryParams

    def evaluate(self) -> None:
        frame = self.profiler.system_metrics(names=["MemoryUsedPercent"])
        if frame.empty:
            self.no_data("no MemoryUsedPercent samples")
            return
        self.report.datapoints = len(frame)
        peak = float(frame["value"].max())
        self.report.statistics["peak"] = peak
        if peak > self.params.limit:
            self.violation(None, f"memory reached {peak:.0f}%", value=peak, threshold=self.params.limit)


def _system_metrics(out_dir, memory: float, samples: int = 20) -> None:
    """CPU-only system metrics in SageMaker's layout (no GPU dimensions), memory at `memory` %."""
    t0 = 1_700_000_000.0
    lines = []
    for i in range(samples):
        ts = t0 + i * 0.5
        for name, dimension, value in (("cpu0", "CPUUtilization", 40.0), ("system", "MemoryUsedPercent", memory)):
            lines.append(json.dumps({"Type": "cpu", "Name": name, "Dimension": dimension, "Value": value, "NodeId": "algo-1", "Timestamp": ts}))
    folder = out_dir / "profiler-output/system/incremental" / time.strftime("%Y%m%d%H", time.gmtime(t0))
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{int(t0 // 60) * 60}.algo-1.json").write_text("\n".join(lines) + "\n")


def test_fired_follows_from_violations_and_steps_say_their_mode(tmp_path):
    trial = create_trial(write_job(tmp_path, nan_at=6))
    report = run_rules([ExplodingTensor(trial)])[0]
    # global 6 is TRAIN step 5: one EVAL step (global 4) came before it
    assert trial.mode_of(6) == (ModeKeys.TRAIN, 5)
    assert report.fired and report.status == "fired" and report.violations == 1 and report.fired_steps == [6]
    evidence = report.evidence[0]
    assert (evidence.step, evidence.mode, evidence.mode_step, evidence.tensor) == (6, "TRAIN", 5, "gradient/fc.weight")
    assert evidence.where == "TRAIN step 5 (global 6)"
    assert "TRAIN step 5 (global 6)" in report.summary()
    body = report.to_json()
    json.dumps(body, allow_nan=False)
    assert body["kind"] == "tensor" and body["explanation"]["advice"], body["explanation"]
    clean = run_rules([ExplodingTensor(create_trial(write_job(tmp_path / "clean")))])[0]
    assert not clean.fired and clean.status == "ok" and clean.violations == 0


def test_a_custom_smdebug_style_rule_that_returns_true_still_fires(tmp_path):
    class Always(Rule):
        def invoke_at_step(self, step):
            return step == 3

    report = run_rules([Always(create_trial(write_job(tmp_path)))])[0]
    assert report.fired and report.fired_steps == [3] and "condition met" in report.evidence[0].message


def test_job_rules_run_in_the_same_engine_with_actions(tmp_path, caplog):
    path = write_job(tmp_path)
    _system_metrics(tmp_path, memory=93.0)
    trial = create_trial(path)
    hog = MemoryHog(actions=[StopTraining(), Log()])  # unbound: judges the run's trial
    tensor = ExplodingTensor(trial)
    with caplog.at_level(logging.WARNING, logger="stepscope"):
        reports = run_rules([tensor, hog])
    assert [r.kind for r in reports] == ["tensor", "job"]
    job = reports[1]
    assert job.fired and job.status == "fired" and job.statistics["peak"] == 93.0
    assert job.evidence[0].where == "the whole job" and job.evidence[0].value == 93.0 and job.evidence[0].threshold == 50.0
    stop = read_stop(trial.store)
    assert stop["rule"] == "MemoryHog" and "93" in stop["reason"]
    assert "rule MemoryHog fired at the whole job" in caplog.text
    quiet = MemoryHog(trial, limit="95").run()
    assert not quiet.fired and quiet.status == "ok" and quiet.datapoints > 0


def test_no_data_and_error_statuses(tmp_path):
    trial = create_trial(write_job(tmp_path))
    report = MemoryHog(trial).run()
    assert report.status == "no data" and report.summary() == "no MemoryUsedPercent samples"

    class Broken(JobRule):
        def evaluate(self):
            raise RuntimeError("kaput")

    broken = Broken(trial).run()
    assert broken.status == "error" and "kaput" in broken.errors[0] and not broken.fired


def test_one_parameter_mechanism_for_both_kinds():
    with pytest.raises(ConfigError, match=r"MemoryHog.limit must be a percentage in \[0, 100\], got 150"):
        MemoryHog(limit="150")
    with pytest.raises(ConfigError, match="MemoryHog: unknown parameter"):
        MemoryHog(limt=1)
    assert MemoryHog(mode="ModeKeys.eval").params.mode == "EVAL"
    with pytest.raises(ConfigError, match="VanishingGradient.threshold must be float"):
        from stepscope.rules import VanishingGradient

        VanishingGradient(None, threshold="small")


def test_json_sanitizer_keeps_non_finite_values_visible():
    body = jsonable({"a": np.float32(np.nan), "b": [np.inf, -np.inf], "c": np.int64(3), "d": (1, 2), "e": np.array([1.5])})
    assert body == {"a": "NaN", "b": ["Infinity", "-Infinity"], "c": 3, "d": [1, 2], "e": [1.5]}
    json.dumps(body, allow_nan=False)


def test_default_set_is_chosen_from_what_the_job_saved(tmp_path):
    plain = default_rules(create_trial(write_job(tmp_path / "plain")))
    names = [r.name for r in plain]
    assert "DeadRelu" not in names and "SaturatedActivation" not in names and "ClassImbalance" not in names
    assert {"ExplodingTensor", "VanishingGradient", "LossNotDecreasing", "Overfit", "WeightUpdateRatio"} <= set(names)
    with_relu = create_trial(write_job(tmp_path / "relu", relu_class=True))
    assert with_relu.module_class("net.1_output_0") == "ReLU"
    dead = [r for r in default_rules(with_relu) if r.name == "DeadRelu"]
    assert dead and dead[0].has_inputs()  # recognised by its class, not by a name regex
    _system_metrics(tmp_path / "plain", memory=10.0)
    kinds = {r.kind for r in default_rules(create_trial(str(tmp_path / "plain")))}
    assert kinds == {"tensor", "job"}


def test_modes_aliases_as_smdebug_spelled_them():
    assert (modes.TRAIN, modes.EVAL, modes.PREDICT, modes.GLOBAL) == (ModeKeys.TRAIN, ModeKeys.EVAL, ModeKeys.PREDICT, ModeKeys.GLOBAL)


def test_check_explain_prints_definition_and_advice(capsys):
    assert main(["check", "--explain", "VanishingGradient"]) == 0
    out = capsys.readouterr().out
    assert "What to do:" in out and "Kaiming" in out and "threshold" in out
    assert main(["check", "--explain", "NoSuchRule"]) == 2
    assert "unknown rule 'NoSuchRule'" in capsys.readouterr().err


def test_check_writes_one_report_format_for_both_kinds(tmp_path, capsys):
    path = write_job(tmp_path, nan_at=2)
    _system_metrics(tmp_path, memory=10.0)
    assert main(["check", path, "--quiet"]) == 1
    out = capsys.readouterr().out
    assert "ExplodingTensor" in out and "TRAIN step 2 (global 2)" in out
    summary = json.loads((tmp_path / "rule-output" / "summary.json").read_text())
    statuses = {r["rule"]: r["status"] for r in summary["rules"]}
    assert statuses["ExplodingTensor"] == "fired"
    # No GPU on this job: the GPU rules say so instead of "ok".
    assert statuses["LowGPUUtilization"] == "no data" and statuses["GPUMemoryIncrease"] == "no data"
    report = json.loads((tmp_path / "rule-output" / "LowGPUUtilization.json").read_text())
    assert report["kind"] == "job" and report["no_data_reason"]


def test_a_rule_declares_its_parameters_once_by_annotation():
    @dataclass(frozen=True)
    class LimitParams(RuleParams):
        limit: float = ranged(5.0, "positive")

    class Annotated(Rule):
        params: LimitParams  # a local class: resolved from the class body's scope

    class Explicit(Rule):
        Params = LimitParams

    class Inherits(Annotated):
        pass

    for cls in (Annotated, Explicit, Inherits):
        assert cls.Params is LimitParams
        assert cls(None, limit="7").params.limit == 7.0
        assert cls.describe()["parameters"] == {"limit": 5.0}
    with pytest.raises(ConfigError, match="limit must be a number > 0"):
        Annotated(None, limit=0)
    # A name defined only after the class is a clear error, not a rule with no parameters.
    with pytest.raises(TypeError, match="LaterParams"):

        class Early(Rule):
            params: LaterParams  # noqa: F821

    # Built-in rules take their explanation from the one table in rules.advice.
    from stepscope.rules.advice import EXPLANATIONS
    from stepscope.rules.memory import MemoryGrowth
    from stepscope.rules.traces import RankStraggler

    assert MemoryGrowth.explanation is EXPLANATIONS["MemoryGrowth"] and RankStraggler.explain() is EXPLANATIONS["RankStraggler"]
