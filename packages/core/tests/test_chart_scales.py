"""What a chart shows: far-out values drawn apart from a histogram's range, log axes over
decades with zeros handled, legends capped with the flagged series kept."""

from __future__ import annotations

import numpy as np
import pytest

from stepscope import chart_scales


def test_a_compile_step_is_drawn_apart_and_the_rest_spread_over_bins():
    rng = np.random.default_rng(0)
    durations = np.concatenate([[8300.0], 10 + rng.random(470)])
    split = chart_scales.split_far(durations)
    assert split.apart == [(0, 8300.0)]
    assert split.keep.sum() == 470 and not split.keep[0]
    counts, _ = np.histogram(durations[split.keep], bins=30)
    assert (counts > 0).sum() > 10  # all of them fell into one bin before
    whole, _ = np.histogram(durations, bins=30)
    assert (whole > 0).sum() == 2
    note = split.statement("ms", "step", [f"TRAIN step {i}" for i in range(len(durations))])
    assert note.startswith("1 step drawn apart") and "8.3 s (TRAIN step 0)" in note


def test_nothing_is_set_apart_in_a_steady_or_two_mode_run():
    assert chart_scales.split_far(np.full(50, 10.0)).apart == []
    assert chart_scales.split_far(10 * (1 + 0.01 * np.arange(50))).apart == []  # a 1 % spread is no outlier
    two_modes = np.r_[np.full(40, 10.0), np.full(10, 100.0)]  # every fifth step slow: both modes stay
    assert chart_scales.split_far(two_modes).apart == []
    assert chart_scales.split_far([5.0, 9000.0]).keep.tolist() == [True, True]  # too few values to judge


def test_nan_is_never_kept_and_a_single_value_is_its_own_range():
    split = chart_scales.split_far([np.nan, 3.0])
    assert split.keep.tolist() == [False, True] and split.low == split.high == 3.0


def test_log_axis_over_decades_with_zeros_and_denormals_left_out_and_counted():
    assert chart_scales.wants_log([1e-3, 1e7, 0.0])
    assert not chart_scales.wants_log([1.0, 50.0, 0.0])
    values, dropped = chart_scales.for_log([0.0, 1e-45, 2.0, None, -1.0, float("nan")])
    assert values == [None, None, 2.0, None, None, None] and dropped == 3  # 0, a denormal, a negative


def test_the_legend_keeps_the_top_series_and_every_flagged_one():
    series = {f"layer{i}.weight": [float(i), float(i) / 2] for i in range(41)}
    names, caption = chart_scales.top_series(series, 8, keep=["layer0.weight"])
    expected = ["layer0.weight"] + [f"layer{i}.weight" for i in range(34, 41)]
    assert names == expected and caption == "top 8 of 41 by max, with the 1 a rule flagged"
    assert chart_scales.top_series({"a": [1.0]}, 8) == (["a"], "")


@pytest.mark.parametrize(("ms", "text"), [(8300.0, "8.3 s"), (12.5, "12.5 ms"), (0.34, "340 µs"), (125_000.0, "2 min 5 s")])
def test_human_durations(ms, text):
    assert chart_scales.human_ms(ms) == text
