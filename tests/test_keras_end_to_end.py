"""Across packages: a Keras job's files open in TensorBoard's own event loader, and its step
timeline is a Chrome trace whose slices nest properly on each track (what Perfetto needs)."""

import json
import os
from decimal import Decimal

import numpy as np
import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "0")

pytestmark = pytest.mark.heavy


def test_keras_job_opens_in_tensorboard_and_perfetto(tmp_path):
    import keras
    from tensorboard.backend.event_processing.event_file_loader import EventFileLoader
    from tensorboard.util import tensor_util

    import stepscope
    from stepscope.config import SaveConfig
    from stepscope_tf import StepscopeCallback

    keras.utils.set_random_seed(1)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3, name="dense")])
    model.compile(optimizer="sgd", loss="mse")
    x, y = np.random.RandomState(0).randn(64, 4).astype("float32"), np.zeros((64, 3), "float32")
    with StepscopeCallback(str(tmp_path), save_config=SaveConfig(save_interval=2), include_collections=["weights"]) as callback:
        model.fit(x, y, batch_size=16, epochs=1, callbacks=[callback], verbose=0)

    trial = stepscope.create_trial(str(tmp_path))
    kernel = trial.tensor_names(collection="weights")[0]
    saved = trial.tensor(kernel).value(2, mode="train")
    event_files = sorted(tmp_path.glob("events/*/*.tfevents"))
    loaded = [e for f in event_files for e in EventFileLoader(str(f)).Load() if e.HasField("summary")]
    tags = {(e.step, e.summary.value[0].tag): e for e in loaded}
    global_step = trial.global_step("train", 2)
    np.testing.assert_array_equal(tensor_util.make_ndarray(tags[(global_step, kernel)].summary.value[0].tensor), saved)

    for path in tmp_path.glob("profiler-output/framework/**/*.json"):
        trace = json.loads(path.read_text(), parse_float=Decimal)  # exact: floats of epoch µs drop ns
        spans = [e for e in trace["traceEvents"] if e.get("ph") == "X"]
        assert spans
        by_track = {}
        for event in spans:
            by_track.setdefault((event["pid"], event["tid"]), []).append((Decimal(event["ts"]), Decimal(event["ts"]) + Decimal(event["dur"])))
        for track in by_track.values():
            open_ends = []
            for start, end in sorted(track, key=lambda s: (s[0], -s[1])):
                while open_ends and open_ends[-1] <= start:
                    open_ends.pop()
                assert not open_ends or end <= open_ends[-1], "slices on one track must nest"
                open_ends.append(end)
