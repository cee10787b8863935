"""The health series (stepscope.health) against numpy on the saved tensors, on a job whose
TRAIN steps are interleaved with EVAL steps; the rules report the same figures."""

from __future__ import annotations

import numpy as np
import pytest

from stepscope import health
from stepscope.capture.collection_manager import CollectionManager
from stepscope.capture.writer import Writer
from stepscope.modes import ModeKeys
from stepscope.rules import DeadRelu, WeightUpdateRatio, run_rules
from stepscope.trial import create_trial

# (mode, mode step) of each global step: 4 TRAIN, 2 EVAL, 4 TRAIN.
SCHEDULE = [(ModeKeys.TRAIN, i) for i in range(4)] + [(ModeKeys.EVAL, i) for i in range(2)] + [(ModeKeys.TRAIN, i) for i in range(4, 8)]


def _norm(x: np.ndarray) -> float:
    return float(np.sqrt(np.sum(np.square(x, dtype=np.float64))))


@pytest.fixture
def job(tmp_path):
    """Weights that move each TRAIN step and repeat the last TRAIN step's at EVAL steps (as a
    real model's do), a zero-initialised LayerNorm beta, gradients, and ReLU outputs."""
    rng = np.random.default_rng(11)
    manager = CollectionManager(builtin_regexes={"weights": ["^(?!gradient/).*(weight|beta)$"], "gradients": ["^gradient/"]})
    manager.note_module_class("block.relu_output_0", "ReLU")
    writer = Writer(str(tmp_path / "job"), "worker_0")
    writer.write_collections(manager.dumps(1))
    weight = rng.standard_normal((16, 8)).astype(np.float32) * 0.3
    beta = np.zeros(16, dtype=np.float32)
    written = {}
    for step, (mode, mode_step) in enumerate(SCHEDULE):
        if mode == ModeKeys.TRAIN and step:
            weight = weight - 0.01 * rng.standard_normal(weight.shape).astype(np.float32)
            beta = beta - 1e-3 * np.sign(rng.standard_normal(16)).astype(np.float32)
        relu = np.maximum(rng.standard_normal((32, 10)), 0).astype(np.float32)
        relu[:, :4] = 0  # four units off on every batch
        tensors = {"fc.weight": weight.copy(), "ln.beta": beta.copy(), "block.relu_output_0": relu}
        if mode == ModeKeys.TRAIN:
            tensors["gradient/fc.weight"] = rng.standard_normal((16, 8)).astype(np.float32)
        writer.write_step(step, mode, mode_step, tensors)
        written[step] = tensors
    writer.close()
    return str(tmp_path / "job"), written


def test_update_ratio_is_the_documented_formula():
    rng = np.random.default_rng(0)
    before, after = rng.standard_normal((5, 7)), rng.standard_normal((5, 7))
    assert health.update_ratio(before, after) == pytest.approx(np.linalg.norm(after - before) / np.linalg.norm(before), rel=1e-12)
    # a near-zero start (a LayerNorm beta after its first tiny step): the RMS floor of 1e-3
    tiny = np.full(768, 1e-10)
    moved = tiny + 1e-3
    assert health.update_ratio(tiny, moved) == pytest.approx(1.0, rel=1e-6)
    assert np.linalg.norm(moved - tiny) / (np.linalg.norm(tiny) + 1e-9) > 1e5  # what ||w|| + 1e-9 gave
    assert health.update_ratio(np.zeros(4), np.ones(4)) is None  # a start from zero: no relative change
    assert health.update_ratio(before, after[:, :3]) is None
    assert health.update_ratio(np.arange(4), np.arange(4) + 1) is None  # integers are no weights
    assert health.update_ratio(before.astype(np.float16), after.astype(np.float16)) == pytest.approx(
        np.linalg.norm(after.astype(np.float16).astype(np.float64) - before.astype(np.float16)) / np.linalg.norm(before.astype(np.float16).astype(np.float64)), rel=1e-9)


def test_update_ratios_are_consecutive_train_steps_only(job):
    path, written = job
    trial = create_trial(path)
    train = [s for s, (mode, _) in enumerate(SCHEDULE) if mode == ModeKeys.TRAIN]
    series = health.update_ratio_series(trial, "fc.weight")
    assert series.mode == "TRAIN" and series.steps == train[1:]  # never an EVAL step: no dip to 0 at 4, 5
    for prev, step, value in zip(train, train[1:], series.values):
        before, after = written[prev]["fc.weight"].astype(np.float64), written[step]["fc.weight"].astype(np.float64)
        assert value == pytest.approx(_norm(after - before) / max(_norm(before), 1e-3 * np.sqrt(before.size)), rel=1e-9)
    assert min(series.values) > 0
    # fewer points for a long job: still each against the TRAIN step saved just before it
    few = health.update_ratio_series(trial, "fc.weight", max_points=3)
    assert few.steps == [1, 6, 9] and few.values == pytest.approx([series.values[series.steps.index(s)] for s in few.steps], rel=1e-12)
    beta = health.update_ratio_series(trial, "ln.beta")
    assert beta.steps == train[2:]  # the all-zero start has no ratio
    assert max(beta.values) < 10  # bounded: ||w|| + 1e-9 gave 1e7-scale ratios here
    # the rule judges that same figure: with thresholds every ratio crosses, its evidence is the series
    rule = WeightUpdateRatio(trial, small_threshold=1e6, large_threshold=1e7)
    (report,) = run_rules([rule])
    got = {(e.tensor, e.step): e.data["ratio"] for e in report.evidence}
    assert got == pytest.approx({**{("fc.weight", s): v for s, v in zip(series.steps, series.values)}, **{("ln.beta", s): v for s, v in zip(beta.steps, beta.values)}})


def test_gradient_norms_at_train_steps(job):
    path, written = job
    trial = create_trial(path)
    series = health.gradient_norm_series(trial, "gradient/fc.weight")
    assert series.steps == [s for s, (mode, _) in enumerate(SCHEDULE) if mode == ModeKeys.TRAIN]
    np.testing.assert_allclose(series.values, [_norm(written[s]["gradient/fc.weight"]) for s in series.steps], rtol=1e-9)


def test_dead_unit_shares_per_mode_are_the_rules(job):
    path, written = job
    trial = create_trial(path)
    rule = DeadRelu(trial, **DeadRelu.preset)
    assert rule.layers() == ["block.relu_output_0"]
    found = {s.mode: s for s in health.inactive_unit_series(trial, "block.relu_output_0", lambda v, step: v > 0, 1.0, persistence=3)}
    # from a mode's 3rd saved step on: the chain of 3 never crosses the EVAL steps (and the 2
    # EVAL steps are too few for a share)
    assert set(found) == {"TRAIN"} and found["TRAIN"].steps == [2, 3, 6, 7, 8, 9]
    per_step = health.inactive_unit_series(trial, "block.relu_output_0", lambda v, step: v > 0, 1.0)
    assert [(s.mode, s.steps) for s in per_step] == [("TRAIN", [0, 1, 2, 3, 6, 7, 8, 9]), ("EVAL", [4, 5])]
    off = {s: (written[s]["block.relu_output_0"] > 0).mean(axis=0) * 100 < 1.0 for s in written}
    train = [0, 1, 2, 3, 6, 7, 8, 9]
    expected = [100 * np.mean(off[train[i - 2]] & off[train[i - 1]] & off[train[i]]) for i in range(2, len(train))]
    np.testing.assert_allclose(found["TRAIN"].values, expected)
    (report,) = run_rules([DeadRelu(trial, **{**DeadRelu.preset, "threshold_layer": 30.0})])
    assert [(e.step, e.value) for e in report.evidence] == list(zip(found["TRAIN"].steps, found["TRAIN"].values))


def test_step_outliers_by_the_criterion():
    import pandas as pd

    rng = np.random.default_rng(2)
    durations = 70 + 5 * rng.random(400)
    durations[0] = 900.0  # the first step (compilation): left out
    slow = [50, 100, 150, 200, 250, 300]
    durations[slow] = 170.0  # over mean + 3 std, under 3 x the median
    durations[350] = 300.0
    frame = pd.DataFrame({"node_id": "n", "rank": 0, "mode": "TRAIN", "phase": "step", "step": np.arange(400) * 2, "start_ns": np.arange(400) * 10**9,
                          "duration_ms": durations})
    rest = durations[1:]
    naive = rest.mean() + 3 * rest.std()
    preset = max(naive, 3 * np.median(rest), np.median(rest) + 50)
    (plain,) = health.step_groups(frame, health.OutlierCriterion())
    (chosen,) = health.step_groups(frame, health.OutlierCriterion(3.0, 3.0, 50.0))
    assert plain.limit_ms == pytest.approx(naive) and plain.outliers == [2 * i for i in [*slow, 350]]
    assert chosen.limit_ms == pytest.approx(preset) and chosen.outliers == [700]
    assert chosen.steps == list(frame["step"]) and chosen.judged == 399
