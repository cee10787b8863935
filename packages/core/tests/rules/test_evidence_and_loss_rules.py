"""Rules say when they cannot judge ("no data", "not enough data (needs N, has M)"),
never "ok" without their evidence; the whole-run loss rules (divergence, chance level,
slow convergence); gradients compared only within their own network (scopes); and
`stepscope check`'s summary line and exit status 3 when no rule could judge."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from stepscope import create_trial
from stepscope.capture.collection_manager import CollectionManager
from stepscope.capture.scopes import Scope
from stepscope.capture.writer import Writer
from stepscope.cli import EXIT_NOT_JUDGED, main
from stepscope.modes import ModeKeys
from stepscope.rules import (
    ChanceLevelLoss,
    DeadRelu,
    LossDivergence,
    LossNotDecreasing,
    Overfit,
    SlowConvergence,
    VanishingGradient,
    judged_line,
    run_rules,
)

BUILTIN = {"weights": [r"^(?!gradient).*weight"], "gradients": ["^gradient"], "losses": ["[Ll]oss"]}
rng = np.random.default_rng(3)


def write(out_dir, losses, *, eval_phases=None, eval_every=50, tensors=None, scopes=(), loss_name="CrossEntropyLoss_output_0") -> str:
    manager = CollectionManager(builtin_regexes=BUILTIN)
    manager.scopes.update((s.name, s) for s in scopes)
    g = e = 0
    phases = iter(eval_phases or [])
    with Writer(str(out_dir)) as writer:
        writer.write_collections(manager.dumps())
        for t, loss in enumerate(losses):
            body = {loss_name: np.float32(loss)}
            body.update(tensors(t) if tensors else {})
            writer.write_step(g, ModeKeys.TRAIN, t, body)
            g += 1
            if eval_phases is not None and (t + 1) % eval_every == 0:
                for value in next(phases, []):
                    writer.write_step(g, ModeKeys.EVAL, e, {loss_name: np.float32(value)})
                    g, e = g + 1, e + 1
    return str(out_dir)


def run(rule_class, path, **params):
    return run_rules([rule_class(create_trial(path), **{**rule_class.preset, **params})])[0]


def test_learning_rate_zero_over_70_losses_is_judged_not_ok(tmp_path):
    # The case: 70 saved losses are under the trend test's 6 windows of 25, so it
    # used to say "ok"; the end-of-run judgement (first 11 against the last 23) finds it.
    flat = math.log(10) + rng.normal(0, 0.05, 70)
    report = run(LossNotDecreasing, write(tmp_path, flat))
    assert report.fired and report.status == "fired", report.summary()
    assert "over the last 23 of its 70 saved losses" in report.evidence[0].message and "over the first 11" in report.evidence[0].message


# A healthy plain loop's loss saved every 5th step (demo/torch_demo.py's plain loop with the
# losses collection at save_interval=5, as it was before the demo moved to every step): 39
# noisy minibatch losses whose median falls from about 1.02 to 0.77. Windows of 6 could not
# show the fall and the old short-run test flagged the healthy job.
DEMO_EVERY_5TH = [
    1.4164, 1.1846, 0.9151, 0.8866, 0.8628, 1.1226, 1.5407, 0.8826, 0.9699, 0.734, 0.8428, 0.7984, 0.6952,
    0.8721, 0.7819, 0.8709, 0.6078, 0.6556, 0.7522, 0.922, 0.7615, 0.8675, 0.765, 1.0303, 1.0468, 0.699,
    0.9221, 0.6646, 0.6614, 0.8697, 0.7702, 0.7306, 0.9486, 0.6372, 0.9202, 0.5846, 0.7081, 0.7734, 0.6639,
]


def test_a_short_noisy_falling_loss_is_judged_ok_and_an_undecidable_one_is_not_enough_data(tmp_path):
    # First sixth against the pooled last third: the demo's fall is shown (ok, judged).
    report = run(LossNotDecreasing, write(tmp_path / "demo", DEMO_EVERY_5TH))
    assert not report.fired and report.status == "ok" and report.judged, report.summary()
    # Noise too large to tell a 5 % fall from none: not enough data, with the counts.
    noisy = 1.0 + np.random.default_rng(4).normal(0, 0.3, 40)
    undecided = run(LossNotDecreasing, write(tmp_path / "noisy", noisy))
    assert not undecided.fired and undecided.status == "not enough data", undecided.summary()
    assert undecided.summary() == "not enough data (needs 150 saved TRAIN losses, has 40)"
    # A short loss that rises is a finding whatever its noise.
    rising = np.asarray(DEMO_EVERY_5TH[::-1]) + np.linspace(0, 0.6, 39)
    assert run(LossNotDecreasing, write(tmp_path / "rising", rising)).fired


def test_overfit_without_enough_evaluations_is_not_ok(tmp_path):
    decay = 2.0 * np.exp(-np.arange(200) / 40) + 0.2
    report = run(Overfit, write(tmp_path, decay, eval_phases=[[0.9], [0.8]], eval_every=80))
    assert report.status == "not enough data" and report.needed == 5 and report.available == 2
    assert report.to_save == "EVAL losses from validation during training: at least 5 validation runs"  # (how many, not only what)


def test_divergence_far_above_the_start_fires_once_and_a_healthy_decay_does_not(tmp_path):
    # 6.7 climbing to ~15 and coming back: the imagenet run of the issue.
    climb = np.concatenate([np.full(20, 6.7), np.linspace(6.7, 15.4, 30), np.linspace(15.4, 6.0, 46)]) + rng.normal(0, 0.2, 96)
    report = run(LossDivergence, write(tmp_path / "div", climb))
    assert report.fired and report.violations == 1, report.summary()
    evidence = report.evidence[0]
    assert evidence.value > evidence.threshold > 6.7 * 1.5 - 0.5 and "diverges" in evidence.message
    healthy = 2.3 * np.exp(-np.arange(96) / 30) + 0.1 + rng.normal(0, 0.1, 96)
    quiet = run(LossDivergence, write(tmp_path / "ok", healthy))
    assert quiet.status == "ok", quiet.summary()


@pytest.mark.parametrize("classes", [2, 4, 10])
def test_chance_level_training_loss(tmp_path, classes):
    # Its own generator: the module's draws depend on which tests ran before (-k), and a
    # first loss 2.3 sigma low reads as no classifier's for 2 classes (ln 2 +- 10 %).
    rng = np.random.default_rng(classes)
    stuck = math.log(classes) + rng.normal(0, 0.03, 120)
    report = run(ChanceLevelLoss, write(tmp_path / "stuck", stuck))
    assert report.fired, report.summary()
    assert report.evidence[0].data["num_classes"] == classes
    learning = math.log(classes) * np.exp(-np.arange(120) / 40) + rng.normal(0, 0.03, 120)
    assert run(ChanceLevelLoss, write(tmp_path / "learns", learning)).status == "ok"


def test_chance_level_validation_while_training_memorises(tmp_path):
    # Shuffled labels on a small set: the training loss falls (memorised), the validation
    # loss stays at and above ln 4.
    train = math.log(4) * np.exp(-np.arange(300) / 80) + rng.normal(0, 0.03, 300)
    val = [[math.log(4) + 0.05 * k + rng.normal(0, 0.01)] for k in range(6)]
    report = run(ChanceLevelLoss, write(tmp_path, train, eval_phases=val))
    assert report.fired and "never went below chance level" in report.evidence[0].message, report.summary()


def test_chance_level_judges_each_set_evaluated_after_each_epoch(tmp_path):
    # pytorch/examples' gat/main.py evaluates the training nodes, then the validation
    # nodes, after each update. Labels shuffled (7 classes): the first falls (memorised),
    # the second stays at ln 7; the phase mean falls below chance level and hid it.
    chance = math.log(7)
    train = chance - np.linspace(0, 0.35, 300) + rng.normal(0, 0.01, 300)
    first = chance - np.linspace(0.01, 0.46, 6)
    memorised = [[first[k], chance + 0.005 * k] for k in range(6)]
    report = run(ChanceLevelLoss, write(tmp_path / "gat", train, eval_phases=memorised))
    assert report.fired and report.violations == 1, report.summary()
    evidence = report.evidence[0]
    assert evidence.data["evaluation"] == 2 and evidence.value == pytest.approx(chance, abs=1e-4)
    assert "evaluation 2 of the 2" in evidence.message and "learns nothing that generalises" in evidence.message
    # Healthy: the validation set falls too.
    healthy = [[first[k], chance - 0.15 * k] for k in range(6)]
    assert run(ChanceLevelLoss, write(tmp_path / "ok", train, eval_phases=healthy)).status == "ok"
    # A small set of hard examples the model gets confidently wrong sits far above ln 7,
    # not at it: not this finding.
    steep = chance - np.linspace(0.01, 1.2, 6)
    hard = [[steep[k], chance * (1 + 0.1 * k)] for k in range(6)]
    assert run(ChanceLevelLoss, write(tmp_path / "hard", train, eval_phases=hard)).status == "ok"
    # Phases of different sizes cannot be told apart by place: only their means are judged.
    uneven = [memorised[k][: 1 + k % 2] for k in range(6)]
    assert run(ChanceLevelLoss, write(tmp_path / "uneven", train, eval_phases=uneven)).status == "ok"


def test_chance_level_leaves_regression_and_adversarial_jobs_alone(tmp_path):
    flat = math.log(4) + rng.normal(0, 0.03, 120)
    assert run(ChanceLevelLoss, write(tmp_path / "mse", flat, loss_name="MSELoss_output_0")).status == "no data"
    gan = (Scope("opt_g", "optimizer", ("g.weight",)), Scope("opt_d", "optimizer", ("d.weight",)))
    report = run(ChanceLevelLoss, write(tmp_path / "gan", flat, scopes=gan))
    assert report.status == "no data" and "several optimizers" in report.summary()


def test_loss_not_decreasing_leaves_several_optimizer_jobs_alone(tmp_path):
    # A GAN's discriminator loss rises from 0.44 to 0.62 as the generator improves (the
    # Lightning GAN of the public-scripts suite): adversarial losses are not meant to fall.
    rising = np.linspace(0.44, 0.62, 200) + rng.normal(0, 0.02, 200)
    assert run(LossNotDecreasing, write(tmp_path / "one", rising)).fired
    gan = (Scope("opt_g", "optimizer", ("g.weight",)), Scope("opt_d", "optimizer", ("d.weight",)))
    report = run(LossNotDecreasing, write(tmp_path / "gan", rising, scopes=gan))
    assert report.status == "no data" and not report.fired and "several optimizers" in report.summary()


def test_chance_level_infers_classes_from_the_first_loss_not_a_diverged_one(tmp_path):
    # lr far too high: ln 10 at initialisation, 20 after the first update (e^20 would be
    # "489874020 classes"); K comes from the loss before training moved it.
    diverged = np.concatenate([[math.log(10)], np.full(59, 20.0) + rng.normal(0, 0.3, 59)])
    report = run(ChanceLevelLoss, write(tmp_path / "div", diverged))
    assert report.fired and report.evidence[0].data["num_classes"] == 10, report.summary()
    # A first loss no classifier has at initialisation (ln of over 10^6 classes) is not judged.
    huge = np.full(60, 20.0) + rng.normal(0, 0.3, 60)
    assert run(ChanceLevelLoss, write(tmp_path / "huge", huge)).status == "no data"


def test_slow_convergence(tmp_path):
    slow = 2.0 - 0.15 * np.arange(200) / 200 + rng.normal(0, 0.01, 200)  # -7.5 % and still falling
    report = run(SlowConvergence, write(tmp_path / "slow", slow))
    assert report.fired and 5 < report.evidence[0].value < 10, report.summary()
    fast = 2.0 * np.exp(-np.arange(200) / 40) + 0.1 + rng.normal(0, 0.01, 200)
    assert run(SlowConvergence, write(tmp_path / "fast", fast)).status == "ok"


def _gan_gradients(step):
    # The generator's gradients are 1e-5 of the discriminator's, by the scale of its own
    # loss, and uniform across its layers: nothing vanishes inside either network.
    return {
        "gradient/gen.0.weight": np.full((8, 8), 1.2e-5, np.float32), "gradient/gen.2.weight": np.full((8, 8), 2e-5, np.float32),
        "gradient/disc.0.weight": np.full((8, 8), 3e-2, np.float32), "gradient/disc.2.weight": np.full((8, 8), 2.8e-2, np.float32),
    }


def test_vanishing_gradient_compares_layers_only_within_their_network(tmp_path):
    losses = np.linspace(1.0, 0.5, 12)
    unscoped = run(VanishingGradient, write(tmp_path / "one", losses, tensors=_gan_gradients))
    assert unscoped.fired and {e.tensor for e in unscoped.evidence} == {"gradient/gen.0.weight", "gradient/gen.2.weight"}
    scopes = (Scope("generator", "model", ("gen.0.weight", "gen.2.weight")), Scope("discriminator", "model", ("disc.0.weight", "disc.2.weight")))
    scoped = run(VanishingGradient, write(tmp_path / "two", losses, tensors=_gan_gradients, scopes=scopes))
    assert scoped.status == "ok", scoped.summary()


def test_a_small_gradient_whose_weights_move_is_not_vanishing(tmp_path):
    # Layer "first" has 1e-5 of the head's gradient (Adam-like updates move it anyway).
    w0 = rng.normal(0, 1, (8, 8)).astype(np.float32)

    def tensors(step, moving):
        first = w0 + (0.01 * step if moving else 0.0)
        return {"gradient/first.weight": np.full((8, 8), 1e-6, np.float32), "gradient/last.weight": np.full((8, 8), 0.1, np.float32),
                "first.weight": first.astype(np.float32), "last.weight": w0}

    losses = np.linspace(1.0, 0.5, 10)
    moving = run(VanishingGradient, write(tmp_path / "moving", losses, tensors=lambda s: tensors(s, True)))
    assert moving.status == "ok", moving.summary()
    still = run(VanishingGradient, write(tmp_path / "still", losses, tensors=lambda s: tensors(s, False)))
    assert still.fired and still.evidence[0].data["update_ratio"] == 0.0


def test_a_gradient_below_float32_resolution_is_vanishing_even_when_adam_moves_it(tmp_path):
    # The VAE's deep sigmoid encoder under Adam: its first layer's gradient is 1e-8 of the
    # network's largest while Adam moves the weights at 3e-3 per step (motion is Adam's).
    w0 = rng.normal(0, 1, (8, 8)).astype(np.float32)

    def tensors(step):
        return {"gradient/first.weight": np.full((8, 8), 1e-9, np.float32), "gradient/last.weight": np.full((8, 8), 0.1, np.float32),
                "first.weight": (w0 + 0.01 * step).astype(np.float32), "last.weight": w0}

    report = run(VanishingGradient, write(tmp_path / "adam", np.linspace(1.0, 0.5, 10), tensors=tensors))
    assert report.fired, report.summary()
    evidence = report.evidence[0]
    assert evidence.tensor == "gradient/first.weight" and evidence.data["update_ratio"] > 1e-4
    assert "motion is an adaptive optimizer's" in evidence.message
    # floor_ratio 0 (SageMaker-like, no floor): the motion excuses it again.
    assert run(VanishingGradient, str(tmp_path / "adam"), floor_ratio=0.0).status == "ok"


def test_check_exits_3_when_no_rule_could_judge(tmp_path, capsys):
    path = write(tmp_path / "short", [2.3, 2.2, 2.1])
    # The default set: ExplodingTensor judges 3 losses (no NaN); the loss rules cannot.
    assert main(["check", path, "--quiet", "--no-write"]) == 0
    out = capsys.readouterr().out
    assert "1 of 6 rule(s) could judge; for the others save: losses every step (LossNotDecreasing, LossDivergence, ChanceLevelLoss" in out
    assert "default rule(s) not run, the job saved nothing they read; save: gradients and weights (VanishingGradient); weights (" in out
    # What the activation rules read, named so that a job that saved every layer output of
    # layers they cannot judge (pytorch/examples' GCN) is not told to save layer outputs.
    assert "outputs of ReLU layers (for F.relu: the Linear/Conv output before it and its bias gradient) (DeadRelu)" in out
    assert "outputs of tanh and sigmoid layers (SaturatedActivation)" in out
    assert "not enough data (needs 30 saved TRAIN losses, has 3)" in out
    rules = ["--rule", "LossNotDecreasing", "--rule", "Overfit"]
    assert main(["check", path, "--quiet", "--no-write", *rules]) == EXIT_NOT_JUDGED
    out = capsys.readouterr()
    assert "0 of 2 rule(s) could judge" in out.out and "no rule could judge" in out.err
    assert main(["check", path, "--quiet", "--no-write", "--json", *rules]) == EXIT_NOT_JUDGED
    reports = json.loads(capsys.readouterr().out)
    assert reports and all(r["judged"] is False for r in reports)
    assert {r["status"] for r in reports} <= {"no data", "not enough data"}


def test_judged_line_lists_what_to_save():
    from stepscope.rules.report import RuleReport

    ok = RuleReport("A", "A", "tensor", {}, steps_evaluated=5, tensors_inspected=1)
    short = RuleReport("B", "B", "tensor", {}, steps_evaluated=5, tensors_inspected=1)
    short.need(30, 4, "saved TRAIN losses", "the losses collection every step")
    assert short.status == "not enough data" and ok.status == "ok"
    assert judged_line([ok, short]) == "1 of 2 rule(s) could judge; for the others save: the losses collection every step (B)"


def test_report_and_app_summaries_say_how_many_rules_could_judge():
    from stepscope.report.findings import Finding
    from stepscope.report.sections.summary import judged_text
    from stepscope.rules.report import RuleReport
    from stepscope.ui.views import _rule_row

    ok = RuleReport("ExplodingTensor", "ExplodingTensor", "tensor", {}, steps_evaluated=5, tensors_inspected=1)
    short = RuleReport("Overfit", "Overfit", "tensor", {}, steps_evaluated=5, tensors_inspected=1)
    short.need(5, 2, "evaluations after training steps", "EVAL losses from validation during training")
    findings = [Finding.from_json(r.to_json()) for r in (ok, short)]
    assert [f.judged for f in findings] == [True, False] and findings[1].status == "not enough data"
    assert judged_text(findings) == "1 of 2 rule(s) could judge; for the others save: EVAL losses from validation during training (Overfit)"
    row = _rule_row(short.to_json(), "stepscope check")
    assert row["judged"] is False and row["to_save"] == "EVAL losses from validation during training"
    assert row["status"] == "not enough data" and row["summary"] == "not enough data (needs 5 evaluations after training steps, has 2)"


def test_dead_relu_needs_units_off_at_three_saved_steps_in_a_row(tmp_path):
    # 64 ReLU units, batch 32. Units off on one batch only: most units are off on each batch
    # (62 %), a different set each time. Dead: 61 % of units off on every batch.
    def layer(off_units):
        def tensors(t):
            value = np.abs(rng.normal(1.0, 0.5, (32, 64))).astype(np.float32)
            value[:, off_units(t)] = 0.0
            return {"fc1_relu_output": value}
        return tensors

    losses = np.linspace(2.0, 0.5, 6)
    shifting = layer(lambda t: np.roll(np.arange(64) < 40, 24 * t))
    report = run(DeadRelu, write(tmp_path / "healthy", losses, tensors=shifting))
    assert report.status == "ok", report.summary()
    # SageMaker's one-batch judgement calls the same layer dead at every step.
    assert run(DeadRelu, write(tmp_path / "healthy1", losses, tensors=shifting), persistence=1).violations == 6
    dead = layer(lambda t: np.arange(64) < 39)
    report = run(DeadRelu, write(tmp_path / "dead", losses, tensors=dead))
    assert report.fired and report.violations == 4, report.summary()  # from the third saved step on
    assert report.evidence[0].value == pytest.approx(100 * 39 / 64) and "last 3 saved steps" in report.evidence[0].message
    short = run(DeadRelu, write(tmp_path / "short", losses[:2], tensors=dead))
    assert short.status == "not enough data", short.summary()


def test_slow_convergence_needs_a_material_fall(tmp_path):
    # A loss stuck at ln 2 that drifts by 2e-4 over the run, with even smaller noise (the
    # keras-io time-series defect): flat, not converging slowly.
    flat = math.log(2) - np.linspace(0, 2e-4, 240) + rng.normal(0, 1e-6, 240)
    assert not run(SlowConvergence, write(tmp_path / "flat", flat)).fired
    creeping = 3.9 - np.linspace(0, 0.03, 240) + rng.normal(0, 1e-3, 240)  # 0.8 % over the run
    assert run(SlowConvergence, write(tmp_path / "creep", creeping)).fired


def test_losses_that_turned_nan_are_named_not_asked_for_again(tmp_path):
    # A run that saved 30 losses, 26 of them after the loss blew up (the demo's exploding
    # job): the rules lack finite losses, not saved ones, and must say so instead of asking
    # the user to save losses more often.
    losses = [2.3, 2.2, 2.25, 2.1] + [float("nan")] * 20 + [float("inf")] * 6
    path = write(tmp_path, losses)
    for rule_class, needed in ((LossDivergence, 20), (ChanceLevelLoss, 30)):
        report = run(rule_class, path)
        assert report.status == "not enough data", report.summary()
        assert report.summary() == f"not enough data (needs {needed} saved TRAIN losses, has 4; 26 more were NaN or infinite)"
        assert report.to_save == "finite losses, not NaN/inf ones"
        assert report.to_json()["evidence_needed"]["non_finite"] == 26
    # With fewer saved than even the finite ones would need, saving more often is still the advice.
    slow = run(SlowConvergence, path)
    assert slow.status == "not enough data" and "26 more were NaN or infinite" in slow.summary()
    assert slow.to_save == SlowConvergence.to_save
    trend = run(LossNotDecreasing, path)
    assert trend.status == "not enough data" and trend.to_save == "finite losses, not NaN/inf ones", trend.summary()
    assert "has 4; 26 more were NaN or infinite" in trend.summary()


def test_gradients_that_turned_nan_are_named_and_the_report_round_trips(tmp_path):
    from stepscope.rules.report import RuleReport

    def tensors(t):
        scale = np.float32(1.0 if t < 2 else np.nan)
        return {"gradient/fc1.weight": np.full((4, 4), scale, np.float32), "gradient/fc2.weight": np.full((4,), scale, np.float32)}

    report = run(VanishingGradient, write(tmp_path, [1.0] * 8, tensors=tensors))
    assert report.status == "not enough data" and report.available == 2 and report.non_finite == 6, report.summary()
    assert report.summary().endswith("has 2; 6 more were NaN or infinite)")
    assert report.to_save == "finite gradients, not NaN/inf ones"
    assert judged_line([report]) == "0 of 1 rule(s) could judge; for the others save: finite gradients, not NaN/inf ones (VanishingGradient)"
    back = RuleReport.from_json(json.loads(json.dumps(report.to_json())))
    assert back.non_finite == 6 and back.summary() == report.summary() and back.to_save == report.to_save


# pytorch/examples' time_sequence_prediction (LSTM, LBFGS, one saved loss per optimizer
# step) as it ran here on torch 2.13: 16 saved losses, the loss 6.9e-05 at step 4 and
# 8.1e+22 at step 5. Too short for LossDivergence's windows (20), it said "not enough data".
LBFGS_BLEW_UP = [1.54e-03, 3.23e-04, 1.69e-04, 1.08e-04, 6.91e-05, 8.14e22, 3.25e25, 1.57e25, 9.36e23, 8.39e27,
                 3.08e26, 4.39e26, 3.64e27, 2.42e28, 1.87e26, 5.97e25]


def test_a_short_run_whose_loss_blows_up_is_judged_diverging(tmp_path):
    report = run(LossDivergence, write(tmp_path / "lbfgs", LBFGS_BLEW_UP, loss_name="MSELoss_output_0"))
    assert report.status == "fired" and report.violations == 1, report.summary()
    evidence = report.evidence[0]
    head, tail = LBFGS_BLEW_UP[:5], LBFGS_BLEW_UP[-5:]
    assert evidence.step == 15 and evidence.value == pytest.approx(float(np.median(np.float32(tail))), rel=1e-6)
    assert evidence.data["start"] == pytest.approx(float(np.median(np.float32(head))), rel=1e-6)
    assert "its last 5 saved" in evidence.message and "the loss diverges" in evidence.message


@pytest.mark.parametrize(
    "losses",
    [
        [2.3, 2.1, 2.2, 1.9, 1.7, 1.8, 1.5, 1.6, 1.4, 1.2, 1.3, 1.1],  # healthy, falling
        [0.5, 0.6, 0.4, 1.5, 2.0, 2.2, 2.1, 2.4, 1.9],  # rose 4x: short of 10x, left to the windows
        [1e-3, 2e-3, 1e-3, 5e-2, 3e-2, 4e-2, 8e-2, 1.5e-3, 6e-2],  # 40x, but one late loss sits among the early ones
        [1.0, 1e6, 1e7, 1e8, 1e9],  # five: under the six a short run needs
    ],
)
def test_a_short_run_without_an_unmistakable_rise_is_not_enough_data(tmp_path, losses):
    report = run(LossDivergence, write(tmp_path / "short", losses))
    assert report.status == "not enough data" and not report.violations, report.summary()


def test_a_short_adversarial_run_is_not_judged(tmp_path):
    scopes = (Scope("opt_g", "optimizer", ("g.weight",)), Scope("opt_d", "optimizer", ("d.weight",)))
    report = run(LossDivergence, write(tmp_path / "gan", LBFGS_BLEW_UP, scopes=scopes))
    assert report.status == "no data" and "several optimizers" in report.summary()
