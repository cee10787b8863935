"""A small job with every kind of value the exports handle: scalars (loss), reductions,
raw tensors whose shape changes once, a string tensor, two modes and two workers."""

from __future__ import annotations

import numpy as np
import pytest

from stepscope.capture.collection_manager import CollectionManager
from stepscope.capture.writer import Writer
from stepscope.modes import ModeKeys
from stepscope.reductions import reduction_tensor_name


@pytest.fixture
def export_job(tmp_path):
    """Write the job; return (path, {(worker, global_step): {name: value}}, {global: (mode, mode_step)})."""
    out = tmp_path / "job"
    rng = np.random.default_rng(7)
    written: dict[tuple[str, int], dict[str, np.ndarray]] = {}
    modes: dict[int, tuple[ModeKeys, int]] = {}
    for worker in ("worker_0", "worker_1"):
        writer = Writer(str(out), worker)
        manager = CollectionManager(builtin_regexes={"weights": ["weight"], "losses": ["loss"]})
        writer.write_collections(manager.dumps(2))
        step = 0
        for mode, count in ((ModeKeys.TRAIN, 6), (ModeKeys.EVAL, 3)):
            for mode_step in range(count):
                weight = rng.standard_normal((4, 3)).astype(np.float32)
                tensors = {
                    "fc.weight": weight,
                    "loss": np.float32(rng.random()),
                    reduction_tensor_name("gradient/fc.weight", "l2"): np.float64(rng.random()),
                    "note": np.array(["hello"]),
                    # the batch is smaller at the last step of each mode
                    "inputs": rng.standard_normal((2 if mode_step == count - 1 else 3, 2)).astype(np.float64),
                }
                writer.write_step(step, mode, mode_step, tensors)
                written[(worker, step)] = tensors
                modes[step] = (mode, mode_step)
                step += 1
        writer.close()
    return str(out), written, modes
