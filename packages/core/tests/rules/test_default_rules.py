"""The default set's statistics on jobs written with the core Writer: loss trends against
noise, overfitting as diverging trends, gradients judged by parameter kind, saturation read
from activation outputs. Each case has a control that must stay silent; SageMaker's
semantics stay for rules built without the preset."""

from __future__ import annotations

import numpy as np
import pytest

from stepscope import create_trial
from stepscope.capture.collection_manager import CollectionManager
from stepscope.capture.writer import Writer
from stepscope.modes import ModeKeys
from stepscope.rules import LossNotDecreasing, Overfit, SaturatedActivation, VanishingGradient, run_rules
from stepscope.rules.losses import theil_sen_slope
from stepscope.rules.tensors import parameter_kind

BUILTIN = {"weights": [r"^(?!gradient).*weight"], "biases": [r"^(?!gradient).*bias"], "gradients": ["^gradient"], "losses": ["[Ll]oss"]}


def write(out_dir, train_losses, eval_losses=None, eval_every: int = 50, tensors=None, classes=None) -> str:
    """A job with one loss per TRAIN step (`train_losses`), `eval_losses[k]` as the k-th
    EVAL phase (a list of values) after every `eval_every` TRAIN steps, and `tensors(step)`
    saved at each TRAIN step."""
    manager = CollectionManager(builtin_regexes=BUILTIN)
    for name, cls in (classes or {}).items():
        manager.note_module_class(name, cls)
    g = e = t = 0
    phases = iter(eval_losses or [])
    with Writer(str(out_dir)) as writer:
        writer.write_collections(manager.dumps())
        for i, loss in enumerate(train_losses):
            body = {"Loss_output_0": np.float32(loss)}
            body.update(tensors(i) if tensors else {})
            writer.write_step(g, ModeKeys.TRAIN, t, body)
            g, t = g + 1, t + 1
            if eval_losses is not None and t % eval_every == 0:
                for value in next(phases, []):
                    writer.write_step(g, ModeKeys.EVAL, e, {"Loss_output_0": np.float32(value)})
                    g, e = g + 1, e + 1
    return str(out_dir)


def _run(rule_class, path, **params):
    trial = create_trial(path)
    return run_rules([rule_class(trial, **{**rule_class.preset, **params})])[0]


rng = np.random.default_rng(0)
NOISY_DECAY = 0.3 + 2.0 * np.exp(-np.arange(400) / 60) + rng.normal(0, 0.15, 400)
CONVERGED = np.concatenate([2.0 * np.exp(-np.arange(100) / 15), np.zeros(300)]) + 0.3 + rng.normal(0, 0.15, 400)
FLAT = 1.39 + rng.normal(0, 0.15, 400)
DIVERGING = np.concatenate([1.5 - np.arange(150) / 150, 0.5 + np.arange(250) / 50]) + rng.normal(0, 0.1, 400)


@pytest.mark.parametrize(
    "losses, fires",
    [(NOISY_DECAY, False), (CONVERGED, False), (FLAT, True), (DIVERGING, True)],
    ids=["noisy-decay", "converged-plateau", "flat-noise", "diverging"],
)
def test_loss_trend(tmp_path, losses, fires):
    report = _run(LossNotDecreasing, write(tmp_path, losses))
    assert report.fired == fires, report.summary()
    if fires:
        evidence = report.evidence[0]
        assert evidence.mode == "TRAIN" and evidence.tensor == "Loss_output_0" and evidence.threshold is not None
        assert "over TRAIN steps" in evidence.message


def test_sagemaker_loss_not_decreasing_keeps_its_pairwise_meaning(tmp_path):
    # The noisy but decreasing loss: SageMaker's rule compares two single points 10 steps
    # apart, so the noise makes it fire; the trend test does not.
    path = write(tmp_path, NOISY_DECAY)
    assert run_rules([LossNotDecreasing(create_trial(path))])[0].fired
    assert not _run(LossNotDecreasing, path).fired


def _eval_phases(values, noise, count=6):
    return [[v + n] for v, n in zip(values, rng.normal(0, noise, count))]


def test_overfit_trend(tmp_path):
    train = np.linspace(1.0, 0.1, 300) + rng.normal(0, 0.02, 300)
    rising = write(tmp_path / "rising", train, _eval_phases(np.linspace(0.9, 1.6, 6), 0.02))
    report = _run(Overfit, rising)
    assert report.fired and report.evidence[0].mode == "EVAL", report.summary()
    # One noisy validation point above the training loss: SageMaker's ratio fires, the trend does not.
    noisy = write(tmp_path / "noisy", train, _eval_phases([0.8, 0.6, 0.5, 0.75, 0.45, 0.42], 0.0))
    assert not _run(Overfit, noisy).fired
    assert run_rules([Overfit(create_trial(noisy))])[0].fired


def test_gradients_are_judged_by_kind(tmp_path):
    def tensors(step):
        return {
            "gradient/conv.weight": np.full((4, 4), 1e-2, np.float32),
            "gradient/conv.bias": np.zeros(4, np.float32),  # a conv bias before BatchNorm: zero by design
            "gradient/bn.weight": np.full(4, 1e-9, np.float32),
            "gradient/embed.weight": np.pad(np.full((2, 4), 1e-2, np.float32), ((0, 998), (0, 0))),  # sparse rows
            "gradient/first.weight": np.full((4, 4), 1e-6 if step >= 5 else 1e-2, np.float32),  # vanishes from step 5
        }

    path = write(tmp_path, np.linspace(1, 0.5, 10), tensors=tensors, classes={"gradient/bn.weight": "BatchNorm2d"})
    report = _run(VanishingGradient, path)
    # Below from step 5; persistent (patience 3) from step 7.
    assert {e.tensor for e in report.evidence} == {"gradient/first.weight"} and report.fired_steps[0] == 7, report.details[:3]
    assert report.evidence[0].value == pytest.approx(1e-4, rel=1e-3)  # ratio to the largest layer (above the absolute 1e-7)
    sagemaker = run_rules([VanishingGradient(create_trial(path))])[0]
    assert {"gradient/conv.bias", "gradient/bn.weight"} <= {e.tensor for e in sagemaker.evidence}


@pytest.mark.parametrize(
    "name, module_class, ndim, kind",
    [("emb.weight", "Embedding", 2, "embedding"), ("0.weight", "EmbeddingBag", 2, "embedding"), ("layers.1.norm1.weight", None, 1, "norm"),
     ("1.weight", "BatchNorm2d", 1, "norm"), ("fc.bias", "Linear", 1, "bias"), ("rnn.weight_hh_l0", "LSTM", 2, "matrix"), ("scale", None, 1, "vector")],
)
def test_parameter_kind(name, module_class, ndim, kind):
    assert parameter_kind(name, module_class, ndim) == kind


def test_saturation_is_read_from_activation_outputs(tmp_path):
    def tensors(step):
        x = rng.normal(0, 1, (64, 16))
        return {"net.1_output_0": np.tanh(x * 100).astype(np.float32), "net.3_output_0": np.tanh(x).astype(np.float32)}

    path = write(tmp_path, np.linspace(1, 0.5, 4), tensors=tensors, classes={"net.1_output_0": "Tanh", "net.3_output_0": "Tanh"})
    report = _run(SaturatedActivation, path)
    assert {e.tensor for e in report.evidence} == {"net.1_output_0"} and report.tensors_inspected == 2


def test_theil_sen_slope_ignores_one_outlier():
    assert theil_sen_slope([1.0, 2.0, 3.0, 40.0, 5.0]) == pytest.approx(1.0)


def test_saved_legacy_norms_are_read_as_saved_and_missing_ones_are_vector_norms(tmp_path):
    """smdebug reduced numpy arrays with np.linalg.norm: for a 2-D weight that is a matrix
    norm, far from sum |x|. A legacy job's saved value is what reading gives (the trial and
    the rules alike); where none was saved, the vector norm is computed."""
    from stepscope.rules import TensorReader

    weight = np.random.default_rng(1).standard_normal((40, 30)).astype(np.float32)
    matrix_l1, vector_l1 = float(np.linalg.norm(weight, 1)), float(np.abs(weight).astype(np.float64).sum())
    assert vector_l1 > 5 * matrix_l1
    with Writer(str(tmp_path)) as writer:
        writer.write_collections(CollectionManager(builtin_regexes=BUILTIN).dumps())
        writer.write_step(0, ModeKeys.TRAIN, 0, {"fc.weight": weight, "smdebug/reductions/l1_norm/fc.weight": np.float32(matrix_l1)})
        writer.write_step(1, ModeKeys.TRAIN, 1, {"fc.weight": weight})
    trial = create_trial(str(tmp_path))
    assert trial.tensor("fc.weight").reduction_value(0, "l1") == pytest.approx(matrix_l1, rel=1e-6)
    assert trial.tensor("fc.weight").reduction_value(1, "l1") == pytest.approx(vector_l1, rel=1e-6)
    reader = TensorReader()
    assert reader.reduction(trial, "fc.weight", 0, "l1") == pytest.approx(matrix_l1, rel=1e-6)
    assert reader.reduction(trial, "fc.weight", 1, "l2") == pytest.approx(float(np.sqrt((weight.astype(np.float64) ** 2).sum())), rel=1e-6)


def test_frozen_weights_are_not_judged_by_the_default_weight_update_ratio(tmp_path):
    from stepscope.rules import WeightUpdateRatio

    backbone = np.ones((4, 4), np.float32)

    def tensors(step):  # a frozen backbone (no gradient saved) and a head that trains
        head = np.full((2, 4), 1.0 + 0.01 * step, np.float32)
        return {"backbone.weight": backbone, "head.weight": head, "gradient/head.weight": head * 0.1}

    path = write(tmp_path, np.linspace(1, 0.5, 6), tensors=tensors)
    sagemaker = run_rules([WeightUpdateRatio(create_trial(path))])[0]
    assert {e.tensor for e in sagemaker.evidence} == {"backbone.weight"}  # ratio 0 < 1e-8
    default = _run(WeightUpdateRatio, path)
    assert not default.fired and default.tensors_inspected == 1


@pytest.mark.parametrize("rule_set", ["sagemaker", "default"])
def test_weight_update_ratio_leaves_gradient_accumulation_gaps_alone(tmp_path, rule_set):
    # A torch loop that accumulates gradients over 4 forwards without a registered
    # optimizer: each forward is a step (smdebug's counting), the weights move every 4th.
    # Those unmoved steps are no finding (it fired 600 violations on such a real loop);
    # weights that never move (a learning rate of 0), that stop moving for good, or one
    # layer that never moves while the others do, still are.
    from stepscope.rules import WeightUpdateRatio

    def job(name, moves):
        def tensors(step):
            updates = sum(moves(s) for s in range(1, step + 1))
            head = np.full((2, 4), 1.0 + 0.01 * updates, np.float32)
            return {"a.weight": head, "b.weight": head * 2, "gradient/a.weight": head, "gradient/b.weight": head}

        return write(tmp_path / name, np.linspace(1, 0.5, 60), tensors=tensors)

    def run(path):
        return run_rules([WeightUpdateRatio(create_trial(path))])[0] if rule_set == "sagemaker" else _run(WeightUpdateRatio, path)

    accumulating = run(job("accumulating", lambda s: s % 4 == 0))
    assert not accumulating.fired and accumulating.status == "ok", accumulating.evidence[:3]
    never = run(job("never", lambda s: False))
    assert never.fired and min(e.step for e in never.evidence) == 1  # (every pair from the first)
    stops = run(job("stops", lambda s: s % 4 == 0 and s < 20))
    assert stops.fired and min(e.step for e in stops.evidence) == 17  # (the last update at step 16)
    short = write(tmp_path / "short", np.linspace(1, 0.5, 4), tensors=lambda s: {"a.weight": np.ones((2, 2), np.float32), "gradient/a.weight": np.ones((2, 2), np.float32)})
    assert run(short).fired  # (3 pairs, never moved: judged at the end)

    def one_layer_still(step):
        head = np.full((2, 4), 1.0 + 0.01 * step, np.float32)
        return {"a.weight": head, "b.weight": np.ones((2, 4), np.float32), "gradient/a.weight": head, "gradient/b.weight": head}

    layer = run(write(tmp_path / "layer", np.linspace(1, 0.5, 20), tensors=one_layer_still))
    assert layer.fired and {e.tensor for e in layer.evidence} == {"b.weight"}
