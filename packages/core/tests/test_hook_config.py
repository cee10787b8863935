import json

import pytest

from stepscope.capture.hook_config import load_hook_config, parse_hook_config
from stepscope.exceptions import ConfigError
from stepscope.modes import ModeKeys

SAGEMAKER_CONFIG = {
    "LocalPath": "/opt/ml/output/tensors",
    "HookParameters": {
        "save_all": "false",
        "include_regex": "relu,tanh",
        "reductions": "max,abs_mean",
        "save_raw_tensor": "true",
        "save_interval": "100",
        "train.save_interval": "10",
        "eval.save_steps": "1,2,3",
        "include_workers": "all",
    },
    "CollectionConfigurations": [
        {"CollectionName": "weights", "CollectionParameters": {"save_interval": "50"}},
        {"CollectionName": "custom", "CollectionParameters": {"include_regex": "fc.*", "reductions": "l2_norm", "predict.save_interval": "3"}},
        {"CollectionName": "losses"},
    ],
}


def test_sagemaker_hook_config_loads():
    config = parse_hook_config(SAGEMAKER_CONFIG)
    assert config.out_dir == "/opt/ml/output/tensors"
    assert config.include_regex == ("relu", "tanh") and config.include_workers == "all" and not config.save_all
    assert config.save_config.for_mode(ModeKeys.TRAIN).save_interval == 10
    assert config.save_config.for_mode(ModeKeys.GLOBAL).save_interval == 100
    assert config.save_config.for_mode(ModeKeys.EVAL).save_steps == (1, 2, 3)
    assert config.reduction_config.reductions == ("max",) and config.reduction_config.abs_reductions == ("mean",)
    assert config.collections["weights"].save_config.for_mode(ModeKeys.TRAIN).save_interval == 50
    custom = config.collections["custom"]
    assert custom.include_regex == ("fc.*",) and custom.reduction_config.norms == ("l2",)
    assert custom.save_config.for_mode(ModeKeys.PREDICT).save_interval == 3
    assert config.collections["losses"].save_config is None
    assert config.include_collections == ["weights", "custom", "losses"]


def test_a_collection_takes_what_it_does_not_set_from_the_hook_mode_by_mode():
    # smdebug 1.0.34's create_hook_from_json_config gives these schedules for this file
    # (run side by side: its save_raw_tensor wants a JSON true, not "true"): a collection's
    # settings override the hook's one by one, in each mode, rather than replacing them.
    config = parse_hook_config(SAGEMAKER_CONFIG)
    expected = {
        "weights": {ModeKeys.TRAIN: (50, ()), ModeKeys.EVAL: (50, (1, 2, 3)), ModeKeys.PREDICT: (50, ()), ModeKeys.GLOBAL: (50, ())},
        "custom": {ModeKeys.TRAIN: (10, ()), ModeKeys.EVAL: (100, (1, 2, 3)), ModeKeys.PREDICT: (3, ()), ModeKeys.GLOBAL: (100, ())},
    }
    for name, modes in expected.items():
        schedule = config.collections[name].save_config
        assert {mode: (schedule.for_mode(mode).save_interval, schedule.for_mode(mode).save_steps) for mode in modes} == modes, name


@pytest.mark.parametrize(
    "patch,message",
    [
        ({"HookParameters": {"save_interval": "ten"}}, r"HookParameters.*save_interval.*'ten'"),
        ({"HookParameters": {"save_al": "true"}}, r"unknown parameter 'save_al'"),
        ({"HookParameters": {"train.save_all": "1"}}, r"train.save_all"),
        ({"HookParameters": {"include_workers": "some"}}, r"include_workers.*'some'"),
        ({"HookParameters": {"reductions": "max,median"}}, r"'median'"),
        ({"CollectionConfigurations": [{"CollectionName": "x", "CollectionParameters": {"save_steps": "1,b"}}]}, r"CollectionConfigurations\[x\].*save_steps.*'b'"),
        ({"CollectionConfigurations": [{"CollectionParameters": {}}]}, r"CollectionName is missing"),
        ({"CollectionConfigurations": [{"CollectionName": "x", "CollectionParameters": {"include_regex": "("}}]}, r"bad regular expression"),
    ],
)
def test_bad_fields_are_named(patch, message):
    with pytest.raises(ConfigError, match=message):
        parse_hook_config(patch)


def test_load_from_file_and_env(tmp_path, monkeypatch):
    path = tmp_path / "debughookconfig.json"
    path.write_text(json.dumps(SAGEMAKER_CONFIG))
    assert load_hook_config(path).include_workers == "all"
    monkeypatch.setenv("STEPSCOPE_HOOK_CONFIG", str(path))
    assert load_hook_config().out_dir == "/opt/ml/output/tensors"
    path.write_text("{not json")
    with pytest.raises(ConfigError, match="debughookconfig.json: not valid JSON"):
        load_hook_config(path)
    with pytest.raises(ConfigError, match="cannot read"):
        load_hook_config(tmp_path / "missing.json")


@pytest.mark.parametrize(
    "data,message",
    [
        ({"HookParameters": {"reductions": 5}}, r"'5'"),
        ({"HookParameters": {"reductions": ["max"]}}, r"HookParameters.reductions must be a string, got list"),
        ({"CollectionConfigurations": [{"CollectionName": "w", "CollectionParameters": [1]}]}, r"CollectionConfigurations\[w\].CollectionParameters must be an object"),
        ({"LocalPath": ""}, r"LocalPath must be a non-empty path"),
        ({"LocalPath": 5}, r"LocalPath must be a non-empty path.*5"),
        ({"HookParameters": {"save_interval": {"a": {"b": {"c": [1]}}}}}, r"HookParameters.save_interval must be a string, got dict"),
        ({"CollectionConfigurations": [{"CollectionName": "w", "CollectionParameters": {"include_regex": [["fc"]]}}]}, r"include_regex\[\] must be a string, got list"),
        ({"CollectionConfigurations": {"CollectionName": "w"}}, r"CollectionConfigurations must be a list"),
        ({"CollectionConfigurations": [5]}, r"CollectionConfigurations\[0\] must be an object"),
        ({"CollectionConfigurations": [{"CollectionName": 7}]}, r"CollectionName must be a string"),
        ({"HookParameters": "save_all"}, r"HookParameters must be an object"),
    ],
)
def test_malformed_values_name_the_field(data, message):
    with pytest.raises(ConfigError, match=message):
        parse_hook_config(data)


def test_deeply_nested_json_is_a_config_error(tmp_path):
    path = tmp_path / "deep.json"
    path.write_text('{"HookParameters": ' + "[" * 100_000 + "]" * 100_000 + "}")
    with pytest.raises(ConfigError, match="deep.json"):
        load_hook_config(path)


def test_hook_json_gives_hook_options_directly(tmp_path):
    from stepscope.capture.hook_options import HookOptions

    path = tmp_path / "debughookconfig.json"
    path.write_text(json.dumps(SAGEMAKER_CONFIG))
    options = HookOptions.from_json(path)
    assert isinstance(options, HookOptions) and options.out_dir == "/opt/ml/output/tensors"
    assert options.include_regex == ("relu", "tanh") and options.include_workers == "all"
    assert [c.name for c in options.collections] == ["weights", "custom", "losses"]
    assert HookOptions.from_json(path, out_dir=str(tmp_path)).out_dir == str(tmp_path)
    path.write_text(json.dumps({"HookParameters": {"save_interval": "10"}}))
    with pytest.raises(ConfigError, match="no LocalPath; pass out_dir"):
        HookOptions.from_json(path)
    assert HookOptions.from_json(path, out_dir="x").save_config.for_mode(ModeKeys.TRAIN).save_interval == 10
