import pytest

from stepscope.capture.collection_manager import CollectionManager
from stepscope.config import DEFAULT_SAVE_INTERVAL, Collection, ProfilerConfig, ReductionConfig, SaveConfig, SaveConfigMode
from stepscope.exceptions import ConfigError
from stepscope.modes import ALL_MODES, ModeKeys


def brute_force_should_save(step, interval, save_steps, start, end):
    return step in save_steps or (start <= step and (end is None or step < end) and step % interval == 0)


@pytest.mark.parametrize("interval,save_steps,start,end", [(500, (), 0, None), (3, (7, 8), 2, 20), (1, (), 5, 6), (10, (0, 1, 2), 0, 0)])
def test_should_save_matches_definition(interval, save_steps, start, end):
    config = SaveConfig(save_interval=interval, save_steps=save_steps, start_step=start, end_step=end)
    for step in range(60):
        expected = brute_force_should_save(step, interval, set(save_steps), start, end)
        assert config.should_save(step, ModeKeys.TRAIN) is expected
        mode_config = config.for_mode("eval")
        assert mode_config.should_save(step) is expected
        nxt = mode_config.next_save_step(step)
        later = [s for s in range(step, 2000) if brute_force_should_save(s, interval, set(save_steps), start, end)]
        assert nxt == (later[0] if later else None)


def test_per_mode_overrides():
    config = SaveConfig(save_interval=10, mode_save_configs={ModeKeys.EVAL: SaveConfigMode(save_interval=1), "predict": {"save_steps": [3]}})
    assert config.should_save(10, ModeKeys.TRAIN) and not config.should_save(5, ModeKeys.TRAIN)
    assert config.should_save(5, ModeKeys.EVAL)
    assert config.should_save(3, ModeKeys.PREDICT) and config.should_save(10, ModeKeys.PREDICT)
    assert SaveConfig.from_json(config.to_json()) == config


@pytest.mark.parametrize(
    "kwargs,field",
    [
        ({"save_interval": 0}, "save_interval"),
        ({"save_interval": "x"}, "save_interval"),
        ({"start_step": -1}, "start_step"),
        ({"save_steps": ["a"]}, "save_steps"),
        ({"start_step": 5, "end_step": 2}, "end_step"),
    ],
)
def test_save_config_errors_name_the_field(kwargs, field):
    with pytest.raises(ConfigError, match=field):
        SaveConfig(**kwargs)


def test_reduction_config_and_smdebug_strings():
    rc = ReductionConfig.from_smdebug_string("min,abs_mean,l2_norm,abs_l1_norm", save_raw_tensor="true")
    assert rc.reductions == ("min",) and rc.abs_reductions == ("mean",)
    assert rc.norms == ("l2",) and rc.abs_norms == ("l1",) and rc.save_raw_tensor is True
    assert rc.to_smdebug_string() == "min,abs_mean,l2_norm,abs_l1_norm"
    assert rc.requested() == [("min", False), ("mean", True), ("l2", False), ("l1", True)]
    with pytest.raises(ConfigError, match="median"):
        ReductionConfig(reductions=("median",))
    with pytest.raises(ConfigError, match="save_shape"):
        ReductionConfig(save_shape="maybe")


def test_collections_match_and_round_trip():
    weights = Collection("weights", include_regex=r"^(?!gradient).*weight")
    assert weights.matches("fc1.weight") and not weights.matches("gradient/fc1.weight")
    with pytest.raises(ConfigError, match=r"include_regex.*\("):
        Collection("bad", include_regex="(")
    manager = CollectionManager([Collection("custom", include_regex="relu", reduction_config=ReductionConfig(norms=("l2",)))])
    restored = CollectionManager.from_json(manager.to_json(2))
    custom = restored.get("custom")
    assert custom.include_regex == ("relu",) and custom.reduction_config.norms == ("l2",)
    assert manager.to_json(2)["_meta"]["num_workers"] == 2
    with pytest.raises(ConfigError, match="unknown collection 'nope'"):
        manager.get("nope")


def test_profiler_config_validates_interval():
    assert ProfilerConfig().monitor_interval_ms == 500
    with pytest.raises(ConfigError, match="monitor_interval_ms.*300"):
        ProfilerConfig(monitor_interval_ms=300)


@pytest.mark.parametrize(
    "kwargs, field",
    [
        ({"save_config": 5}, "save_config"),
        ({"reduction_config": "max"}, "reduction_config"),
        ({"include_regex": [5]}, "include_regex"),
        ({"tensor_names": 5}, "tensor_names"),
        ({"save_histogram": "no"}, "save_histogram"),
    ],
)
def test_collection_fields_of_the_wrong_type_are_a_type_error_naming_the_field(kwargs, field):
    from stepscope.config import Collection
    from stepscope.exceptions import ConfigError

    with pytest.raises(TypeError, match=rf"Collection\('c'\)\.{field} must be") as caught:
        Collection("c", **kwargs)
    assert isinstance(caught.value, ConfigError)  # one hierarchy: `except ConfigError` catches it


def test_a_collection_schedule_naming_some_modes_takes_the_others_from_the_hook():
    # smdebug 1.0.34, run side by side: a collection given SaveConfig(mode_save_configs=
    # {TRAIN: every step}) under a hook saving every 10 steps saves EVAL, PREDICT and GLOBAL
    # every 10 steps (merge_default_save_config); given keyword arguments too, it is whole.
    hook_schedule = SaveConfig(save_interval=10)
    train_only = Collection("weights", save_config=SaveConfig(mode_save_configs={ModeKeys.TRAIN: SaveConfigMode(save_interval=1)}))
    merged = train_only.with_defaults(hook_schedule, ReductionConfig()).save_config
    assert [merged.for_mode(mode).save_interval for mode in ALL_MODES] == [1, 10, 10, 10]
    whole = SaveConfig(save_interval=5, mode_save_configs={ModeKeys.TRAIN: SaveConfigMode(save_interval=1)})
    assert [whole.merged(hook_schedule).for_mode(mode).save_interval for mode in ALL_MODES] == [1, 5, 5, 5]
    # Alone (a hook's), an unset mode saves on the default interval; naming it sets it.
    assert train_only.save_config.for_mode(ModeKeys.EVAL).save_interval == DEFAULT_SAVE_INTERVAL
    named = train_only.save_config.with_mode(ModeKeys.EVAL, SaveConfigMode(save_interval=3))
    assert [named.merged(hook_schedule).for_mode(mode).save_interval for mode in ALL_MODES] == [1, 3, 10, 10]
    assert SaveConfig() == SaveConfig(save_interval=DEFAULT_SAVE_INTERVAL) != train_only.save_config
