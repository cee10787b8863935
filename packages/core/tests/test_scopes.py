"""Scopes: declared by a hook, written in the collections file's `_meta`, read back by the
trial as untrusted input, and mapped from tensor names (gradients, reductions included)."""

import json

import pytest

from stepscope import create_trial, layout
from stepscope.capture.hook import HookBase
from stepscope.capture.scopes import WHOLE_JOB, Scope, ScopeMap, make_scope, parameter_of, parse_scopes
from stepscope.config import ProfilerConfig, SaveConfig
from stepscope.exceptions import ConfigError


class BareHook(HookBase):
    framework = "test"
    builtin_regexes = {"weights": [r"^(?!gradient).*weight"], "gradients": ["^gradient"]}


def _hook(tmp_path):
    return BareHook(str(tmp_path), profiler_config=ProfilerConfig.disabled(), save_config=SaveConfig(save_interval=1), include_collections=["weights", "gradients"])


def test_declared_scopes_reach_the_trial_and_map_gradients_to_their_network(tmp_path):
    hook = _hook(tmp_path)
    hook.declare_scope("generator", ["gen.0.weight", "gen.0.bias"])
    hook.declare_scope("discriminator", iter(["disc.0.weight"]))
    hook.declare_scope("opt_g", ["gen.0.weight", "gen.0.bias"], kind="optimizer")
    hook.declare_scope("generator", ["gen.2.weight"])  # declared again: parameters add up
    hook.begin_step()
    hook.save_tensor("gen.0.weight", [1.0, 2.0], "weights")
    hook.end_step()
    hook.close()

    raw = json.loads((tmp_path / layout.collections_key("worker_0")).read_text())
    assert raw["_meta"]["scopes"][0] == {"name": "generator", "kind": "model", "parameters": ["gen.0.weight", "gen.0.bias", "gen.2.weight"]}

    trial = create_trial(str(tmp_path))
    scopes = trial.scopes()
    assert [(s.name, s.kind) for s in scopes] == [("generator", "model"), ("discriminator", "model"), ("opt_g", "optimizer")]
    assert all(isinstance(s, Scope) for s in scopes)
    groups = trial.scope_map()
    assert groups.group_of("gradient/gen.2.weight") == "generator"
    assert groups.group_of("smdebug/reductions/abs_mean/gradient/disc.0.weight") == "discriminator"
    assert [s.name for s in groups.scopes_of("gen.0.bias")] == ["generator", "opt_g"]
    assert groups.group_of("something.else") == WHOLE_JOB


def test_bad_declarations_are_ignored_without_raising(tmp_path, caplog):
    hook = _hook(tmp_path)
    hook.declare_scope("", ["a.weight"])
    hook.declare_scope("net", "a.weight")  # a string is not a list of names
    hook.declare_scope("net", ["a.weight"], kind="layer")
    hook.declare_scope("net", [3])
    hook.declare_scope("net", ["a.weight"])
    hook.declare_scope("net", ["b.weight"], kind="optimizer")  # same name, other kind
    hook.close()
    assert [s.name for s in hook.scopes] == ["net"] and hook.scopes[0].parameters == ("a.weight",)
    assert caplog.text.count("declare_scope ignored") == 5
    assert "kind must be one of model, optimizer, got 'layer'" in caplog.text


def test_a_job_without_scopes_is_one_scope(tmp_path):
    hook = _hook(tmp_path)
    hook.begin_step()
    hook.save_tensor("a.weight", [1.0], "weights")
    hook.end_step()
    hook.close()
    trial = create_trial(str(tmp_path))
    assert trial.scopes() == []
    assert trial.scope_map().group_of("gradient/a.weight") == WHOLE_JOB


@pytest.mark.parametrize(
    "raw, message",
    [
        ({"name": "x"}, "must be a JSON list"),
        ([1], "scopes[0] must be a JSON object"),
        ([{"name": "", "parameters": []}], "scope name must be a non-empty string"),
        ([{"name": "x", "kind": "net", "parameters": []}], "kind must be one of"),
        ([{"name": "x", "parameters": "a"}], "parameters must be a JSON list"),
        ([{"name": "x", "parameters": [None]}], "parameter name must be a non-empty string"),
        ([{"name": "x", "parameters": []}] * 300, "at most 256"),
    ],
)
def test_untrusted_scopes_fail_naming_the_file(raw, message):
    with pytest.raises(ConfigError, match="job.json") as info:
        parse_scopes(raw, "job.json")
    assert message in str(info.value)


def test_a_bad_scopes_entry_leaves_the_collections_readable(tmp_path, caplog):
    hook = _hook(tmp_path)
    hook.begin_step()
    hook.save_tensor("a.weight", [1.0], "weights")
    hook.end_step()
    hook.close()
    key = tmp_path / layout.collections_key("worker_0")
    body = json.loads(key.read_text())
    body["_meta"]["scopes"] = [{"name": 7}]
    key.write_text(json.dumps(body))
    trial = create_trial(str(tmp_path))
    assert trial.scopes() == [] and "weights" in trial.collections()
    assert "ignoring the scopes" in caplog.text


def test_parameter_of_and_make_scope():
    assert parameter_of("gradient/net.0.weight") == "net.0.weight"
    assert parameter_of("smdebug/reductions/l2/gradient/net.0.weight") == "net.0.weight"
    assert parameter_of("net.0.weight") == "net.0.weight"
    assert make_scope("n", ["a", "a", "b"]).parameters == ("a", "b")
    assert not ScopeMap()
