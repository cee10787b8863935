"""The TensorBoard export, read back by TensorBoard's own loader (its event multiplexer and
the data provider its HTTP server serves from)."""

from __future__ import annotations

import numpy as np
import pytest

from stepscope.exceptions import ConfigError
from stepscope.export import Selection, TensorBoardWriter, export_tensorboard, histogram_proto
from stepscope.export.tensorboard import scalar_tag


def _provider(logdir):
    from tensorboard.backend.event_processing import data_provider, plugin_event_multiplexer

    multiplexer = plugin_event_multiplexer.EventMultiplexer()
    multiplexer.AddRunsFromDirectory(str(logdir))
    multiplexer.Reload()
    return data_provider.MultiplexerDataProvider(multiplexer, str(logdir))


def _context():
    from tensorboard import context

    return context.RequestContext()


def _scalars(provider):
    return provider.read_scalars(_context(), experiment_id="", plugin_name="scalars", downsample=10**6)


def _histograms(provider):
    return provider.read_tensors(_context(), experiment_id="", plugin_name="histograms", downsample=10**6)


def test_scalars_and_histograms_per_mode_and_worker(export_job, tmp_path):
    path, written, modes = export_job
    result = export_tensorboard(path, tmp_path / "tb")
    runs = ["eval/worker_0", "eval/worker_1", "train/worker_0", "train/worker_1"]
    assert result.runs == runs
    provider = _provider(tmp_path / "tb")
    scalars = _scalars(provider)
    assert sorted(scalars) == runs
    for run, tags in scalars.items():
        mode_name, worker = run.split("/")
        steps = sorted(s for s, (m, _) in modes.items() if m.name.lower() == mode_name)
        assert set(tags) == {"loss", "gradient/fc.weight/l2"}
        for tag, name in (("loss", "loss"), ("gradient/fc.weight/l2", "smdebug/reductions/l2/gradient/fc.weight")):
            points = tags[tag]
            assert [p.step for p in points] == steps
            expected = [float(written[(worker, s)][name]) for s in steps]
            np.testing.assert_allclose([p.value for p in points], expected, rtol=1e-6)
    histograms = _histograms(provider)
    assert sorted(histograms) == runs
    for run, tags in histograms.items():
        mode_name, worker = run.split("/")
        assert set(tags) == {"fc.weight", "inputs"}  # strings are not charted
        for datum in tags["fc.weight"]:
            buckets = datum.numpy  # TensorBoard's [left, right, count] rows
            value = written[(worker, datum.step)]["fc.weight"]
            assert buckets[:, 2].sum() == value.size
            assert buckets[0, 0] == pytest.approx(value.min())
            assert buckets[-1, 1] == pytest.approx(value.max())
            counts, _ = np.histogram(value.astype(np.float64), bins=30, range=(float(value.min()), float(value.max())))
            np.testing.assert_array_equal(buckets[:, 2], counts)


def test_selection_and_mode_step_axis(export_job, tmp_path):
    path, written, modes = export_job
    selection = Selection.from_args(regex=["^loss$"], steps="1:2", mode="eval")
    result = export_tensorboard(path, tmp_path / "tb", selection, step_axis="mode")
    assert result.runs == ["eval/worker_0", "eval/worker_1"]
    assert result.histograms == 0 and result.scalars == 4
    points = _scalars(_provider(tmp_path / "tb"))["eval/worker_1"]["loss"]
    assert [p.step for p in points] == [1, 2]
    global_steps = {ms: g for g, (m, ms) in modes.items() if m.name == "EVAL"}
    assert [p.value for p in points] == pytest.approx([float(written[("worker_1", global_steps[s])]["loss"]) for s in (1, 2)])


def test_live_writer_single_run(tmp_path):
    with TensorBoardWriter(tmp_path / "live") as writer:
        for step in range(3):
            writer.add_scalar("train", "loss", 1.0 / (step + 1), step, wall_time=1000.0 + step)
        assert writer.add_histogram("train", "w", np.arange(10.0), 2)
        assert not writer.add_histogram("train", "nan", np.array([np.nan]), 2)
    provider = _provider(tmp_path / "live")
    points = _scalars(provider)["train"]["loss"]
    assert [(p.step, p.wall_time) for p in points] == [(0, 1000.0), (1, 1001.0), (2, 1002.0)]
    assert [p.value for p in points] == pytest.approx([1.0, 0.5, 1 / 3])
    assert list(_histograms(provider)["train"]) == ["w"]


def test_histogram_proto_edge_cases():
    assert histogram_proto(np.array([], dtype=np.float32)) is None
    assert histogram_proto(np.array(["a", "b"])) is None
    constant = histogram_proto(np.full(5, 2.0))
    assert list(constant.bucket) == [5.0] and list(constant.bucket_limit) == [2.0]
    mixed = histogram_proto(np.array([1.0, np.inf, 3.0, np.nan]), bins=2)
    assert mixed.num == 2 and mixed.sum == 4.0 and mixed.sum_squares == 10.0 and list(mixed.bucket) == [1.0, 1.0]


def test_scalar_tag():
    assert scalar_tag("smdebug/reductions/abs_l2/gradient/x") == "gradient/x/abs_l2"
    assert scalar_tag("loss_output_0") == "loss_output_0"


def test_bad_arguments(export_job, tmp_path):
    path, _, _ = export_job
    with pytest.raises(ConfigError, match="step_axis"):
        export_tensorboard(path, tmp_path / "tb", step_axis="wall")
    with pytest.raises(ConfigError, match="regex"):
        Selection.from_args(regex=["("])
    with pytest.raises(ConfigError, match="--steps"):
        Selection.from_args(steps="5:x")
    with pytest.raises(ConfigError, match="before the first"):
        Selection.from_args(steps="5:2")
    with pytest.raises(ConfigError, match="mode"):
        Selection.from_args(mode="testing")
    with pytest.raises(ConfigError, match="local folder"):
        TensorBoardWriter("s3://bucket/tb")


def test_buckets_equal_numpy_histogram():
    from stepscope.export.tb_writer import _equal_bins

    rng = np.random.default_rng(3)
    checked = 0
    for i in range(600):
        x = rng.standard_normal(int(rng.integers(2, 200))) * 10 ** rng.uniform(-8, 8)
        if i % 3 == 0:
            x = np.round(x, 1)  # values on bucket edges
        low, high, bins = float(x.min()), float(x.max()), int(rng.integers(1, 50))
        if low == high:
            continue
        counts, limits = _equal_bins(x, low, high, bins)
        expected, edges = np.histogram(x, bins=bins, range=(low, high))
        np.testing.assert_array_equal(counts, expected)
        np.testing.assert_array_equal(limits, edges[1:])
        checked += 1
    assert checked > 500
