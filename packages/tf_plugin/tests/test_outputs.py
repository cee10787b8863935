"""The Keras callback takes the hook base's outputs: `tensorboard_dir=` (read back by
TensorBoard's loader against the saved losses) and `report=True` (the report at close,
with the cost the hook measured)."""

from __future__ import annotations

import os

import numpy as np
import pytest

import stepscope
from stepscope.config import ProfilerConfig, SaveConfig
from stepscope.job_files import read_costs
from stepscope.modes import ModeKeys
from stepscope.store import open_store
from stepscope_tf import StepscopeCallback

pytestmark = pytest.mark.heavy


def test_keras_fit_with_live_tensorboard_and_report(tmp_path, make_model, data):
    from tensorboard import context
    from tensorboard.backend.event_processing import data_provider, plugin_event_multiplexer

    x, y = data
    out_dir, logdir = str(tmp_path / "job"), str(tmp_path / "tb")
    with StepscopeCallback(out_dir, save_config=SaveConfig(save_interval=1), include_collections=["weights", "losses"],
                           profiler_config=ProfilerConfig(system_monitor=False), tensorboard_dir=logdir, report=True) as callback:
        make_model().fit(x, y, batch_size=8, epochs=1, verbose=0, callbacks=[callback])
    trial = stepscope.create_trial(out_dir)
    losses = trial.tensor_names(collection="losses")
    assert losses
    multiplexer = plugin_event_multiplexer.EventMultiplexer()
    multiplexer.AddRunsFromDirectory(logdir)
    multiplexer.Reload()
    provider = data_provider.MultiplexerDataProvider(multiplexer, logdir)
    scalars = provider.read_scalars(context.RequestContext(), experiment_id="", plugin_name="scalars", downsample=100)
    values = trial.tensor(losses[0]).values(mode=ModeKeys.TRAIN)
    points = scalars["train"][losses[0]]
    assert [p.step for p in points] == sorted(values)
    np.testing.assert_allclose([p.value for p in points], [float(values[s]) for s in sorted(values)], rtol=1e-6)
    html = open(os.path.join(out_dir, "stepscope-report.html"), encoding="utf-8").read()
    cost = read_costs(open_store(out_dir))["worker_0"]
    assert cost.steps == 4 and 0 < cost.hook_s < cost.step_s and "tensorflow" in cost.versions
    assert 'data-table="cost"' in html and 'data-section="health"' in html


def test_a_slow_input_pipeline_is_no_data_for_the_dataloader_rule_not_ok(tmp_path, make_model):
    # Keras's fit reads the next batch inside its compiled step: a PyDataset that takes
    # 20 ms a batch shows in the step timeline's "compute", its "data" stays near zero.
    # The Dataloader rule said "ok" on that evidence; it says it cannot see the wait.
    import time

    import keras

    from stepscope.rules.profiler import Dataloader, ProfilerTrial

    class Slow(keras.utils.PyDataset):
        def __len__(self) -> int:
            return 24

        def __getitem__(self, i: int):
            time.sleep(0.02)
            rng = np.random.default_rng(i)
            return rng.standard_normal((8, 4)).astype("float32"), rng.integers(0, 3, 8)

    out_dir = str(tmp_path / "job")
    with StepscopeCallback(out_dir) as callback:  # (the system monitor on: the rule reads its samples)
        make_model().fit(Slow(), epochs=1, verbose=0, callbacks=[callback])
    timeline = stepscope.create_trial(out_dir).profiler.step_timeline()
    train = timeline[(timeline["mode"] == "TRAIN") & (timeline["step"] > 0)]
    medians = train.groupby("phase", observed=True)["duration_ms"].median()
    assert medians["compute"] >= 15 and medians["data"] < 5, medians.to_dict()  # the wait is in compute
    report = Dataloader(**Dataloader.preset).run(ProfilerTrial(out_dir))
    assert report.status == "no data" and "inside" in report.no_data_reason, (report.status, report.no_data_reason)
