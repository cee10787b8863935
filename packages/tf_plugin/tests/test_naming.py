"""Names, collections regexes and worker ranks: pure functions, no training."""

from __future__ import annotations

import re

import pytest

from stepscope.exceptions import ConfigError
from stepscope_tf import naming
from stepscope_tf.distribution import rank_from_tf_config


class _Var:
    def __init__(self, path: str):
        self.path = path


def test_variable_names_are_relative_to_the_model_and_unique():
    variables = [_Var("seq/dense/kernel"), _Var("seq/dense/bias"), _Var("other/w"), _Var("seq/dense/kernel")]
    assert naming.variable_names(variables, "seq") == ["dense/kernel", "dense/bias", "other/w", "dense/kernel_1"]


def test_tf_variable_names_lose_their_output_index():
    class TfVar:
        name = "scope/w:0"

    assert naming.variable_path(TfVar()) == "scope/w"


def test_optimizer_slot_names_drop_the_model_name():
    assert naming.optimizer_variable_name(_Var("adam/seq_dense_kernel_momentum"), "seq") == "optimizer/dense_kernel_momentum"
    assert naming.optimizer_variable_name(_Var("adam_3/iteration"), "seq") == "optimizer/iteration"


def test_layer_io_names():
    assert naming.layer_io_name("outputs", "block/dense", 0, 1) == "outputs/block/dense"
    assert naming.layer_io_name("inputs", "concat", 1, 2) == "inputs/concat/1"


@pytest.mark.parametrize(
    "name, collection",
    [
        ("dense/kernel", "weights"),
        ("block/conv/depthwise_kernel", "weights"),
        ("dense/bias", "biases"),
        ("gradients/dense/kernel", "gradients"),
        ("optimizer/iteration", "optimizer_variables"),
        ("outputs/dense", "outputs"),
        ("inputs/dense", "inputs"),
        ("loss", "losses"),
        ("val_loss", "losses"),
        ("head_loss", "losses"),
    ],
)
def test_builtin_regexes_put_each_name_in_exactly_one_collection(name, collection):
    matched = [c for c, patterns in naming.BUILTIN_REGEXES.items() if any(re.search(p, name) for p in patterns)]
    assert matched == [collection]


def test_loss_names():
    assert naming.is_loss_name("loss") and naming.is_loss_name("out_loss")
    assert not naming.is_loss_name("mae")


@pytest.mark.parametrize(
    "config, expected",
    [
        (None, (0, 1)),
        ({"cluster": {"chief": ["a"], "worker": ["b", "c"]}, "task": {"type": "chief", "index": 0}}, (0, 3)),
        ({"cluster": {"chief": ["a"], "worker": ["b", "c"]}, "task": {"type": "worker", "index": 1}}, (2, 3)),
        ({"cluster": {"worker": ["b", "c"]}, "task": {"type": "worker", "index": 0}}, (0, 2)),
        ({"cluster": {"worker": ["b", "c"], "ps": ["p"]}, "task": {"type": "ps", "index": 0}}, (2, 2)),
        ('{"cluster": {"worker": ["b", "c"]}, "task": {"type": "worker", "index": 1}}', (1, 2)),
    ],
)
def test_rank_from_tf_config(config, expected, monkeypatch):
    monkeypatch.delenv("TF_CONFIG", raising=False)
    assert rank_from_tf_config(config) == expected


def test_bad_tf_config_is_a_config_error(monkeypatch):
    monkeypatch.setenv("TF_CONFIG", "{not json")
    with pytest.raises(ConfigError, match="TF_CONFIG"):
        rank_from_tf_config()
