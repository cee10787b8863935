"""The black box's step listener (capture/blackbox.py SavedValues) on the writer thread."""

import math

import numpy as np

from stepscope.capture.blackbox import SavedValues


def _expected(array):
    number = float(np.asarray(array, dtype=np.float64).reshape(-1)[0])
    shown = number if math.isfinite(number) else str(number)
    return {"shape": list(np.shape(array)), "min": shown, "max": shown, "mean": shown}


def test_one_element_values_give_the_figures_numpy_gives_and_the_first_non_finite_is_reported():
    found = []
    saved = SavedValues(on_non_finite=found.append)
    for dtype in (np.float16, np.float32, np.float64):
        for value in (1.5, -0.0, 1e-8, 65504.0):
            for shape in ((), (1,), (1, 1)):
                array = np.full(shape, value, dtype=dtype)
                saved(3, "TRAIN", 3, {"loss": array, "w": np.arange(4.0)})
                assert saved.last["tensors"]["loss"] == _expected(array)
                assert saved.last["tensors"]["w"] == {"shape": [4], "min": 0.0, "max": 3.0, "mean": 1.5}
    assert found == [] and saved.non_finite is None
    saved(7, "TRAIN", 7, {"loss": np.float32(np.inf), "acc": np.array([np.nan], np.float16), "ok": np.float32(1)})
    assert saved.last["tensors"]["loss"] == {"shape": [], "min": "inf", "max": "inf", "mean": "inf"}
    assert found == [{"step": 7, "mode": "TRAIN", "mode_step": 7, "tensors": {"loss": {"nan": 0, "inf": 1, "size": 1}, "acc": {"nan": 1, "inf": 0, "size": 1}}}]
    saved(8, "TRAIN", 8, {"loss": np.float32(np.nan)})  # only the first such step is reported
    assert len(found) == 1


def test_large_tensors_are_judged_element_by_element_as_numpy_does():
    """A sum that overflows its dtype is not a non-finite tensor; a NaN or an infinity
    anywhere in a tensor is one, with the counts numpy gives."""
    found = []
    saved = SavedValues(on_non_finite=found.append)
    rng = np.random.default_rng(0)
    overflowing = {
        "f16": np.full(10_000, 60_000.0, np.float16),  # sums past float16's 65504
        "f32": np.full(1_000, 3e38, np.float32),  # past float32's 3.4e38
        "mixed": np.array([3e38, 3e38, -3e38, 1.0], np.float32),
    }
    saved(1, "TRAIN", 1, {**overflowing, "g": rng.standard_normal(50_000).astype(np.float32)})
    assert found == [] and saved.non_finite is None
    for name, value in overflowing.items():
        assert np.isfinite(value).all(), name  # (the premise)
    bad = rng.standard_normal(50_000).astype(np.float32)
    bad[[5, 7, 49_999]] = [np.nan, np.inf, -np.inf]
    only_negative = np.ones(100, np.float64)
    only_negative[3] = -np.inf  # (found by the smallest element alone)
    saved(2, "TRAIN", 2, {"g": bad, "f32": overflowing["f32"], "d": only_negative})
    assert found == [{"step": 2, "mode": "TRAIN", "mode_step": 2, "tensors": {"g": {"nan": 1, "inf": 2, "size": 50_000},
                                                                               "d": {"nan": 0, "inf": 1, "size": 100}}}]  # fmt: skip


def test_the_last_step_s_figures_are_those_of_the_values_when_saved():
    """The figures are computed when read (a black box being written), from what the
    listener kept at the step: a value the user changes afterwards (their own buffer, as
    save_tensor may hand over) does not change them; nothing saved yet reads as {}."""
    saved = SavedValues()
    assert saved.last == {}
    buffer = np.array([1.0, 2.0, 6.0], np.float32)
    large = np.ones(5000, np.float32)  # over `small`: checked, not kept
    saved(4, "EVAL", 2, {"metric": buffer, "large": large, "loss": np.float64(0.25)})
    buffer[:] = -1.0
    assert saved.last == {"step": 4, "mode": "EVAL", "mode_step": 2, "tensors": {
        "metric": {"shape": [3], "min": 1.0, "max": 6.0, "mean": 3.0},
        "loss": {"shape": [], "min": 0.25, "max": 0.25, "mean": 0.25},
    }}
    saved(5, "TRAIN", 5, {"loss": np.float32(np.nan)})
    assert saved.last["tensors"] == {"loss": {"shape": [], "min": "nan", "max": "nan", "mean": "nan"}}
