"""The capture defaults that feed the rules: a hook given no save_config saves losses and
metrics every step and tensors dense at first then sparse (config.default_save_config);
an explicit SaveConfig and smdebug's JSON keep their meaning; at close a job with less than
the default rules need is told so in one line and in its evidence status file."""

import json

import pytest

from stepscope import create_trial
from stepscope.capture.evidence import MIN_TRAIN_LOSSES
from stepscope.capture.hook import HookBase
from stepscope.capture.hook_options import HookOptions
from stepscope.config import DENSE_START_STEPS, ProfilerConfig, SaveConfig, default_save_config
from stepscope.modes import ModeKeys


class BareHook(HookBase):
    framework = "test"
    builtin_regexes = {"weights": [r"^(?!gradient).*weight"], "gradients": ["^gradient"], "losses": ["loss"]}


def _train(out, steps, **options):
    hook = BareHook(str(out), profiler_config=ProfilerConfig.disabled(), include_collections=["weights", "gradients"], **options)
    for step in range(steps):
        if hook.begin_step(ModeKeys.TRAIN):
            hook.save_tensor("fc.weight", [1.0, 2.0], "weights")
            hook.save_tensor("gradient/fc.weight", [0.1, 0.2], "gradients")
        hook.save_loss(2.0 * 0.97**step)
        hook.end_step()
    hook.close()
    return create_trial(str(out))


def test_default_schedule_is_dense_then_sparse():
    mode = default_save_config().for_mode(ModeKeys.TRAIN)
    saved = [s for s in range(3000) if mode.should_save(s)]
    expected = list(range(10)) + list(range(10, 100, 10)) + list(range(100, 1000, 100)) + list(range(1000, 3000, 500))
    assert saved == expected and len(DENSE_START_STEPS) == 28
    assert [mode.next_save_step(s) for s in (9, 11, 101, 999, 1001)] == [9, 20, 200, 1000, 1500]


def test_no_save_config_saves_losses_every_step_and_tensors_on_the_schedule(tmp_path):
    trial = _train(tmp_path, 150)
    assert trial.tensor("loss").steps() == list(range(150))
    assert trial.tensor("gradient/fc.weight").steps() == [*range(10), *range(10, 100, 10), 100]
    saved = json.loads((tmp_path / "collections/000000000/worker_0_collections.json").read_text())["collections"]
    assert saved["losses"]["save_config"]["TRAIN"]["save_interval"] == 1
    assert saved["weights"]["save_config"]["TRAIN"]["save_steps"] == list(DENSE_START_STEPS)


def test_an_explicit_save_config_and_smdebug_json_keep_their_meaning(tmp_path):
    trial = _train(tmp_path / "explicit", 150, save_config=SaveConfig(save_interval=100))
    assert trial.tensor("loss").steps() == [0, 100] and trial.tensor("fc.weight").steps() == [0, 100]
    config = tmp_path / "hook.json"
    config.write_text(json.dumps({"LocalPath": str(tmp_path / "json"), "HookParameters": {"include_regex": "fc"}}))
    options = HookOptions.from_json(str(config))
    assert options.save_config == SaveConfig()  # smdebug's default: every 500 steps
    assert options.save_config.for_mode(ModeKeys.TRAIN).save_interval == 500 and not options.save_config.for_mode(ModeKeys.TRAIN).save_steps


def test_a_short_job_is_told_at_close_and_its_status_records_it(tmp_path, caplog):
    trial = _train(tmp_path / "short", 12)
    lines = [r.getMessage() for r in caplog.records if "this job saved" in r.getMessage()]
    assert len(lines) == 1 and f"12 TRAIN steps with a loss (the loss rules need {MIN_TRAIN_LOSSES})" in lines[0]
    assert "save the loss every step" in lines[0] and "gradients" not in lines[0]  # 11 gradient steps: enough
    status = trial.status()["worker_0_evidence"]
    assert status["state"] == "too little data" and status["train_loss_steps"] == 12 and status["train_gradient_steps"] == 11
    assert trial.failed_workers() == {}  # too little data is not a failure
    caplog.clear()
    long_enough = _train(tmp_path / "long", 60)
    assert not [r for r in caplog.records if "this job saved" in r.getMessage()]
    assert "worker_0_evidence" not in long_enough.status()


def test_the_close_line_advises_only_what_is_short():
    from stepscope.capture.evidence import SavedEvidence

    # keras-io's bidirectional LSTM with the README's quick start: its loss every step (240),
    # gradients every 100 steps (2): told about gradients only.
    evidence = SavedEvidence({"loss"}, {"gradient/w"})
    evidence.train_losses, evidence.train_gradients = 240, 2
    line = evidence.shortfall(gradients=True)
    assert line is not None and line.startswith("this job saved 2 TRAIN steps with gradients (VanishingGradient needs 3)")
    assert "save gradients more often with a smaller save_interval, or train longer)" in line and "loss" not in line
    evidence.train_losses = 12
    both = evidence.shortfall(gradients=True)
    assert both is not None and "save the loss every step with hook.save_loss or register_loss, save gradients more often" in both
    evidence.train_gradients = 3
    assert evidence.shortfall(gradients=False) is not None and evidence.shortfall(gradients=True).count("save ") == 1


@pytest.mark.parametrize("steps", [1, 40])
def test_the_schedule_leaves_every_default_rule_evidence(tmp_path, steps):
    from stepscope.rules import run_rules
    from stepscope.rules.losses import LossNotDecreasing

    trial = _train(tmp_path, steps)
    report = run_rules([LossNotDecreasing(trial, **LossNotDecreasing.preset)])[0]
    assert report.status == ("not enough data" if steps < MIN_TRAIN_LOSSES else "ok"), report.summary()
