"""smdebug_rulesconfig configurations run unchanged; actions from ActionList JSON; the
collection configurations they carry reach a hook."""

from __future__ import annotations

import copy
import http.server
import json
import logging
import threading

import pytest

from stepscope.config import SaveConfig
from stepscope.exceptions import ConfigError
from stepscope.rules import Log, StopTraining, VanishingGradient, Webhook, collection_configurations, from_config, parse_actions, run_rules

# Written out literally as smdebug_rulesconfig 1.0.1 returns them (see REFERENCE.md), with
# RuleParameters overrides given as strings the way the SageMaker SDK passes them.
VANISHING_GRADIENT = {
    "DebugRuleConfiguration": {"RuleConfigurationName": "VanishingGradient", "RuleParameters": {"rule_to_invoke": "VanishingGradient"}},
    "CollectionConfigurations": [{"CollectionName": "gradients", "CollectionParameters": {"save_interval": "500"}}],
}
LOSS_NOT_DECREASING = {
    "DebugRuleConfiguration": {"RuleConfigurationName": "LossNotDecreasing", "RuleParameters": {"rule_to_invoke": "LossNotDecreasing"}},
    "CollectionConfigurations": [{"CollectionName": "losses", "CollectionParameters": {"save_interval": "500"}}],
}
DEAD_RELU = {
    "DebugRuleConfiguration": {"RuleConfigurationName": "DeadRelu", "RuleParameters": {"rule_to_invoke": "DeadRelu"}},
    "CollectionConfigurations": [{"CollectionName": "relu_output", "CollectionParameters": {"include_regex": ".*relu_output", "save_interval": "500"}}],
}
EXPLODING_TENSOR = {"DebugRuleConfiguration": {"RuleConfigurationName": "ExplodingTensor", "RuleParameters": {"rule_to_invoke": "ExplodingTensor"}}}


def with_params(config, **params):
    config = copy.deepcopy(config)
    config["DebugRuleConfiguration"]["RuleParameters"].update(params)
    return config


@pytest.mark.heavy
@pytest.mark.parametrize(
    ("config", "planted", "control"),
    [(VANISHING_GRADIENT, "vanishing", "healthy"), (LOSS_NOT_DECREASING, "frozen", "healthy"), (DEAD_RELU, "dead_relu", "healthy"), (EXPLODING_TENSOR, "exploding", "healthy")],
    ids=lambda v: v["DebugRuleConfiguration"]["RuleConfigurationName"] if isinstance(v, dict) else v,
)
def test_rulesconfig_dicts_run_unchanged(trial_of, config, planted, control):
    original = copy.deepcopy(config)
    fired = run_rules([from_config(config, trial_of(planted))])[0]
    silent = run_rules([from_config(config, trial_of(control))])[0]
    assert fired.fired and not silent.fired
    assert config == original  # not modified


@pytest.mark.heavy
def test_string_overrides_are_converted(trial_of):
    rule = from_config(with_params(VANISHING_GRADIENT, threshold="10"), trial_of("healthy"))
    assert rule.params.threshold == 10.0 and rule.name == "VanishingGradient"
    assert run_rules([rule])[0].fired


@pytest.mark.heavy
def test_the_smdebug_rulesconfig_package_when_installed(trial_of):
    rulesconfig = pytest.importorskip("smdebug_rulesconfig")
    config = rulesconfig.vanishing_gradient()
    assert config == VANISHING_GRADIENT
    assert run_rules([from_config(rulesconfig.vanishing_gradient(), trial_of("vanishing"))])[0].fired
    for factory in (rulesconfig.loss_not_decreasing, rulesconfig.dead_relu, rulesconfig.weight_update_ratio, rulesconfig.overfit, rulesconfig.all_zero):
        from_config(factory(), trial_of("healthy"))
    actions = rulesconfig.ActionList(rulesconfig.StopTraining())
    rule = from_config(with_params(config, action_json=actions.serialize()), trial_of("healthy"))
    assert [type(a) for a in rule.actions] == [StopTraining]
    with pytest.raises(ConfigError, match="not supported.*webhook"):
        parse_actions(rulesconfig.ActionList(rulesconfig.Email("someone@example.com")))
    profiler_rule = from_config(rulesconfig.CPUBottleneck(threshold=20), trial_of("healthy"))
    assert type(profiler_rule).__name__ == "CPUBottleneck"


def test_unknown_rule_lists_the_valid_ones(tmp_path):
    from stepscope import create_trial

    trial = create_trial(str(tmp_path))
    bad = {"DebugRuleConfiguration": {"RuleConfigurationName": "VanishingGradients", "RuleParameters": {"rule_to_invoke": "VanishingGradients"}}}
    with pytest.raises(ConfigError, match=r"unknown rule 'VanishingGradients'; valid: VanishingGradient, ExplodingTensor"):
        from_config(bad, trial)
    with pytest.raises(ConfigError, match=r"VanishingGradient: unknown parameter\(s\) 'treshold'; valid: threshold"):
        from_config(with_params(VANISHING_GRADIENT, treshold="1"), trial)
    with pytest.raises(ConfigError, match="VanishingGradient.threshold must be float, got 'small'"):
        from_config(with_params(VANISHING_GRADIENT, threshold="small"), trial)


def test_sagemaker_flat_entry_and_profiler_objects(tmp_path):
    from stepscope import create_trial

    trial = create_trial(str(tmp_path))
    rule = from_config({"RuleConfigurationName": "my-vg", "RuleParameters": {"rule_to_invoke": "VanishingGradient", "threshold": "0.01"}}, trial)
    assert isinstance(rule, VanishingGradient) and rule.name == "my-vg" and rule.params.threshold == 0.01

    class ProfilerRuleObject:  # what smdebug_rulesconfig's profiler rules expose
        rule_name = "LowGPUUtilization"
        rule_parameters = {"threshold_p95": "50", "rule_to_invoke": "LowGPUUtilization"}

    built = from_config(ProfilerRuleObject(), trial)
    assert type(built).__name__ == "LowGPUUtilization"


def test_collection_configurations_reach_the_hook(tmp_path, training):
    collections = collection_configurations(VANISHING_GRADIENT["CollectionConfigurations"] + DEAD_RELU["CollectionConfigurations"])
    core = training.HandDrivenHook(str(tmp_path), collections=collections, profiler_config=_no_profiler())
    try:
        included = {c.name: c for c in core.included}
        assert included["gradients"].save_config == SaveConfig(save_interval=500)
        assert included["gradients"].matches("gradient/fc.weight")  # the built-in regex is kept
        assert included["relu_output"].matches("layer1.relu_output")
    finally:
        core.close()


def _no_profiler():
    from stepscope.config import ProfilerConfig

    return ProfilerConfig.disabled()


def test_action_list_json():
    serialized = '[{\\"name\\": \\"stoptraining\\", \\"training_job_prefix\\": \\"job-1\\"}]'  # ActionList.serialize()
    (action,) = parse_actions(serialized)
    assert isinstance(action, StopTraining) and action.training_job_prefix == "job-1"
    actions = parse_actions([{"name": "log"}, {"name": "webhook", "url": "http://127.0.0.1:1/hook", "retries": "0"}])
    assert isinstance(actions[0], Log) and isinstance(actions[1], Webhook) and actions[1].retries == 0
    for name in ("email", "sms"):
        with pytest.raises(ConfigError, match=f"action '{name}' is not supported.*use a webhook"):
            parse_actions([{"name": name, "endpoint": "x"}])
    with pytest.raises(ConfigError, match="unknown action 'pager'"):
        parse_actions('[{"name": "pager"}]')


class _Hook(http.server.BaseHTTPRequestHandler):
    received: list = []
    failures_left = 0

    def do_POST(self):
        body = self.rfile.read(int(self.headers["Content-Length"]))
        if type(self).failures_left > 0:
            type(self).failures_left -= 1
            self.send_response(503)
            self.end_headers()
            return
        type(self).received.append(json.loads(body))
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args):
        pass


@pytest.fixture
def webhook_server():
    _Hook.received, _Hook.failures_left = [], 0
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Hook)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/hook", _Hook
    server.shutdown()


def _job_with_nan(tmp_path):
    import numpy as np

    from stepscope import create_trial
    from stepscope.capture.writer import Writer
    from stepscope.modes import ModeKeys

    with Writer(str(tmp_path)) as writer:
        for step in range(3):
            writer.write_step(step, ModeKeys.TRAIN, step, {"w": np.array([1.0, np.nan if step == 1 else 2.0], np.float32)})
    return create_trial(str(tmp_path))


def test_webhook_posts_the_report_once_with_retries(tmp_path, webhook_server, caplog):
    url, handler = webhook_server
    handler.failures_left = 2
    from stepscope.rules import ExplodingTensor

    rule = ExplodingTensor(_job_with_nan(tmp_path), actions=[Webhook(url, retries=3, backoff=0.01), Log()])
    with caplog.at_level(logging.WARNING, logger="stepscope"):
        report = run_rules([rule])[0]
    assert report.fired and not report.errors
    (posted,) = handler.received
    assert posted["rule"] == "ExplodingTensor" and posted["step"] == 1
    assert posted["report"]["fired"] is True and posted["report"]["details"][0]["tensor"] == "w"
    assert "rule ExplodingTensor fired at TRAIN step 1 (global 1)" in caplog.text


def test_a_failing_webhook_is_reported_not_raised(tmp_path):
    from stepscope.rules import ExplodingTensor

    rule = ExplodingTensor(_job_with_nan(tmp_path), actions=[Webhook("http://127.0.0.1:9/none", timeout=0.5, retries=1, backoff=0.01)])
    report = run_rules([rule])[0]
    assert report.fired and "webhook" in report.errors[0]
