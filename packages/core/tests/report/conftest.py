"""A small job with profiler data only (system metrics of one node, a step timeline with
phases), written through the same writers the hooks use."""

from __future__ import annotations

import json

import numpy as np
import pytest

from stepscope.capture.monitor import system_metrics_key
from stepscope.modes import ModeKeys
from stepscope.profiler import TimelineWriter
from stepscope.store import open_store

T0 = 1_700_000_000


@pytest.fixture
def profiler_job(tmp_path):
    path = str(tmp_path / "job")
    store = open_store(path)
    rng = np.random.default_rng(5)
    timeline = TimelineWriter(store, node_id="algo-1", flush_interval_s=3600)
    now = T0 * 10**9
    for step in range(40):
        duration = int((400 if step == 25 else 100) * 1e6)  # one slow step (StepOutlier: > 3x the median and 50 ms more)
        cut = [now + int(duration * f) for f in (0.0, 0.1, 0.5, 0.9, 1.0)]
        timeline.add_spans([("step", cut[0], cut[4]), ("data", cut[0], cut[1]), ("forward", cut[1], cut[2]), ("backward", cut[2], cut[3]), ("optimizer", cut[3], cut[4])], step=step, mode=ModeKeys.TRAIN)
        now += duration
    timeline.close()
    lines = []
    for t in np.arange(T0, T0 + 4.5, 0.5):
        for core in range(2):
            lines.append({"Type": "cpu", "Name": f"cpu{core}", "Dimension": "CPUUtilization", "Value": float(rng.uniform(10, 90)), "NodeId": "algo-1", "Timestamp": float(t)})
        lines.append({"Type": "gpu", "Name": "gpu0", "Dimension": "GPUUtilization", "Value": float(rng.uniform(0, 100)), "NodeId": "algo-1", "Timestamp": float(t)})
    store.write(system_metrics_key(T0 // 60 * 60, "algo-1"), "\n".join(json.dumps(line) for line in lines).encode())
    return path
