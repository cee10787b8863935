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
