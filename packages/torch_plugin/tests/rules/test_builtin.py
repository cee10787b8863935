"""Every built-in rule on real training runs: it fires on the run that plants its condition,
stays silent on a healthy control, and its parameters change the outcome as documented."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest

from stepscope.exceptions import ConfigError
from stepscope.rules import BUILTIN_RULES, run_rules

pytestmark = pytest.mark.heavy


@dataclass
class Case:
    rule: str
    planted: str
    control: str
    params: dict[str, Any] = field(default_factory=dict)
    # A parameter change, the run it is applied to, and whether the rule then fires.
    changed: dict[str, Any] = field(default_factory=dict)
    changed_run: str = ""
    changed_fires: bool = False
    start_step: int = 0


CASES = [
    Case("VanishingGradient", "vanishing", "healthy", changed={"threshold": "10"}, changed_run="healthy", changed_fires=True),
    Case("ExplodingTensor", "exploding", "healthy", changed={"tensor_regex": "no_such_tensor"}, changed_run="exploding"),
    Case("DeadRelu", "dead_relu", "healthy", changed={"threshold_layer": "100"}, changed_run="dead_relu"),
    Case("SaturatedActivation", "saturated", "tanh_healthy", changed={"threshold_tanh": "(-1e9, 1e9)"}, changed_run="saturated"),
    Case(
        "PoorWeightInitialization", "poor_init", "healthy",
        changed={"threshold": "1e30", "distribution_range": "0", "patience": "100"}, changed_run="poor_init",
    ),
    Case("WeightUpdateRatio", "frozen", "healthy", changed={"small_threshold": "0"}, changed_run="frozen"),
    Case("AllZero", "dead_relu", "healthy", params={"tensor_regex": "relu_output"}, changed={"tensor_regex": "relu_output", "threshold": "20"}, changed_run="healthy", changed_fires=True),
    Case("UnchangedTensor", "frozen", "healthy", params={"collection_names": "weights"}, changed={"collection_names": "weights", "num_steps": "100"}, changed_run="frozen"),
    Case("LossNotDecreasing", "frozen", "healthy", changed={"diff_percent": "99"}, changed_run="healthy", changed_fires=True),
    Case("Overfit", "overfit", "healthy", changed={"ratio_threshold": "1e6"}, changed_run="overfit"),
    Case("Overtraining", "frozen", "healthy", changed={"patience_train": "1000", "patience_validation": "1000"}, changed_run="frozen"),
    Case("StalledTrainingRule", "stalled", "healthy", params={"threshold": "1"}, changed={}, changed_run="stalled"),
    Case("TensorVariance", "poor_init", "healthy", params={"max_threshold": "1e3", "tensor_regex": "relu_input"}, changed={"max_threshold": "1e30", "tensor_regex": "relu_input"}, changed_run="poor_init"),
    Case("ClassImbalance", "imbalanced", "balanced", changed={"threshold_imbalance": "100", "threshold_misprediction": "1"}, changed_run="imbalanced"),
    Case("Confusion", "confused", "balanced", changed={"min_diag": "0.05", "max_off_diag": "0.95"}, changed_run="confused", start_step=20),
    Case("CheckInputImages", "images_raw", "images_normalized", params={"regex": "model_input_0"}, changed={"regex": "model_input_0", "threshold_mean": "0.6"}, changed_run="images_raw"),
    Case("NLPSequenceRatio", "tokens_padded", "tokens_dense", changed={"token_thresholds_percent": "90"}, changed_run="tokens_padded"),
]


def _run(trial_of, rule: str, run: str, params: dict[str, Any], start_step: int = 0):
    report = run_rules([BUILTIN_RULES[rule](trial_of(run), **params)], start_step=start_step)[0]
    assert not report.errors, report.errors
    return report


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.rule)
def test_fires_on_planted_run(trial_of, case: Case):
    report = _run(trial_of, case.rule, case.planted, case.params, case.start_step)
    assert report.fired, report.summary()
    assert report.details and report.details[0]["message"]
    assert report.fired_steps[0] >= case.start_step


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.rule)
def test_silent_on_control_run(trial_of, case: Case):
    report = _run(trial_of, case.rule, case.control, case.params, case.start_step)
    assert not report.fired, report.details[:3]
    assert report.steps_evaluated > 0
    if case.rule != "SaturatedActivation" or case.control == "tanh_healthy":
        assert report.tensors_inspected > 0, "the control must give the rule something to look at"


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.rule)
def test_parameters_change_the_outcome(trial_of, case: Case):
    report = _run(trial_of, case.rule, case.changed_run, case.changed, case.start_step)
    assert report.fired == case.changed_fires, report.summary()


def test_similar_across_runs(trial_of, runs):
    differs = _run(trial_of, "SimilarAcrossRuns", "healthy", {"other_trial": str(runs("healthy_other_seed"))})
    assert differs.fired and differs.fired_steps[0] == 0
    same = _run(trial_of, "SimilarAcrossRuns", "healthy", {"other_trial": str(runs("healthy_same_seed"))})
    assert not same.fired and same.tensors_inspected > 0
    tolerant = _run(trial_of, "SimilarAcrossRuns", "healthy", {"other_trial": str(runs("healthy_other_seed")), "atol": "1e9"})
    assert not tolerant.fired


def test_vanishing_gradient_reports_the_layer(trial_of):
    report = _run(trial_of, "VanishingGradient", "vanishing", {})
    # The first layers of a deep sigmoid stack vanish first, the last one does not.
    tensors = {d["tensor"] for d in report.details}
    assert "gradient/layers.0.weight" in tensors
    assert "gradient/layers.12.weight" not in tensors


def test_exploding_tensor_only_nan(trial_of):
    both = _run(trial_of, "ExplodingTensor", "exploding", {})
    only_nan = _run(trial_of, "ExplodingTensor", "exploding", {"only_nan": "true"})
    assert all(d["inf"] == 0 for d in only_nan.details)
    assert only_nan.violations <= both.violations


def test_exploding_tensor_fires_at_the_planted_step(trial_of):
    report = _run(trial_of, "ExplodingTensor", "nan_gradient", {})
    assert report.fired_steps[0] == 5
    assert report.details[0]["tensor"] == "gradient/layers.0.weight"


def test_defaults_match_the_reference():
    from stepscope.rules.registry import describe_rules

    defaults = {r["name"]: r["parameters"] for r in describe_rules() if r["kind"] == "tensor"}
    assert defaults["VanishingGradient"]["threshold"] == 1e-7
    assert defaults["ExplodingTensor"]["only_nan"] is False
    assert (defaults["DeadRelu"]["threshold_inactivity"], defaults["DeadRelu"]["threshold_layer"]) == (1.0, 50.0)
    assert defaults["SaturatedActivation"]["threshold_tanh"] == [-9.4999, 9.4999]
    assert defaults["SaturatedActivation"]["threshold_sigmoid"] == [-23.0, 16.99999]
    assert {k: defaults["PoorWeightInitialization"][k] for k in ("threshold", "distribution_range", "patience", "steps")} == {
        "threshold": 10.0, "distribution_range": 0.001, "patience": 5, "steps": 10,
    }
    assert {k: defaults["WeightUpdateRatio"][k] for k in ("large_threshold", "small_threshold", "epsilon")} == {"large_threshold": 10.0, "small_threshold": 1e-8, "epsilon": 1e-9}
    assert defaults["AllZero"]["threshold"] == 100.0
    assert {k: defaults["UnchangedTensor"][k] for k in ("num_steps", "rtol", "atol")} == {"num_steps": 3, "rtol": 1e-5, "atol": 1e-8}
    assert {k: defaults["LossNotDecreasing"][k] for k in ("num_steps", "diff_percent", "use_losses_collection")} == {"num_steps": 10, "diff_percent": 0.0, "use_losses_collection": True}
    assert (defaults["Overfit"]["patience"], defaults["Overfit"]["ratio_threshold"]) == (1, 0.1)
    assert {k: defaults["Overtraining"][k] for k in ("patience_train", "patience_validation", "delta")} == {"patience_train": 5, "patience_validation": 10, "delta": 0.1}
    assert defaults["StalledTrainingRule"]["threshold"] == 1800.0
    assert {k: defaults["ClassImbalance"][k] for k in ("threshold_imbalance", "threshold_misprediction", "samples")} == {"threshold_imbalance": 10.0, "threshold_misprediction": 0.7, "samples": 500}
    assert (defaults["Confusion"]["min_diag"], defaults["Confusion"]["max_off_diag"]) == (0.9, 0.1)
    assert (defaults["CheckInputImages"]["threshold_mean"], defaults["CheckInputImages"]["threshold_samples"]) == (0.2, 500)
    assert defaults["NLPSequenceRatio"]["token_thresholds_percent"] == [50.0, 50.0]


def test_tensor_variance_needs_a_threshold(trial_of):
    with pytest.raises(ConfigError, match="max_threshold or min_threshold"):
        BUILTIN_RULES["TensorVariance"](trial_of("healthy"))
