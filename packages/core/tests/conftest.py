"""Fixtures of the core package's tests."""

from __future__ import annotations

import numpy as np
import pytest

from stepscope.capture.collection_manager import CollectionManager
from stepscope.capture.writer import Writer
from stepscope.modes import ModeKeys


@pytest.fixture
def write_job():
    """Write a small job: `steps` TRAIN steps of a few tensors, then `eval_steps` EVAL
    steps. Returns the dict of what was written, {global_step: {name: value}}."""

    def _write(out_dir, steps: int = 5, eval_steps: int = 2, worker: str = "worker_0", num_workers: int = 1, close: bool = True, seed: int = 0):
        rng = np.random.default_rng(seed)
        written: dict[int, dict[str, np.ndarray]] = {}
        writer = Writer(out_dir, worker)
        manager = CollectionManager(builtin_regexes={"weights": ["weight"], "losses": ["loss"]})
        writer.write_collections(manager.dumps(num_workers))
        global_step = 0
        for mode, count in ((ModeKeys.TRAIN, steps), (ModeKeys.EVAL, eval_steps)):
            for mode_step in range(count):
                tensors = {
                    "fc.weight": rng.standard_normal((4, 3)).astype(np.float32),
                    "loss": np.float32(rng.random()),
                }
                writer.write_step(global_step, mode, mode_step, tensors, shapes={"fc.weight": (4, 3)})
                written[global_step] = tensors
                global_step += 1
        if close:
            writer.close()
        else:
            writer.flush()
        return written, writer

    return _write
