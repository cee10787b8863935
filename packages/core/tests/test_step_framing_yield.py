"""The framer hands the GIL over on purpose (a short sleep) after holding it for its
bound, but not after a tensor whose CRC already released it (64 KiB and more): a sleep
there would only wake the writer thread once more per tensor, each wake-up a chance to
take a core from training that uses every one. The records are the same either way."""

from __future__ import annotations

import numpy as np
import pytest

from stepscope.capture import step_framing
from stepscope.capture.step_framing import GIL_RELEASED_FROM, StepFramer
from stepscope.modes import ModeKeys


@pytest.fixture
def sleeps(monkeypatch):
    seen: list[float] = []
    monkeypatch.setattr(step_framing.time, "sleep", seen.append)
    return seen


def _frame(tensors):
    framer = StepFramer("worker_0", lambda *args: None, yield_every_s=0.0)  # a pause owed after every tensor
    parts, index = framer.frame(3, ModeKeys.TRAIN, 3, tensors, {})
    return b"".join(bytes(memoryview(p).cast("B")) for p in parts), index


def test_small_tensors_hand_the_gil_over_and_large_ones_do_not(sleeps):
    small = {f"s{i}": np.full(10, i, np.float32) for i in range(5)}
    _frame(small)
    assert len(sleeps) == 5
    sleeps.clear()
    large = {f"w{i}": np.full(GIL_RELEASED_FROM // 4, i, np.float32) for i in range(5)}
    _frame(large)
    assert sleeps == []


def test_the_records_do_not_depend_on_the_pauses(monkeypatch, sleeps):
    tensors = {"w": np.arange(GIL_RELEASED_FROM // 4, dtype=np.float32), "b": np.ones(3, np.float32)}
    with_rule = _frame(tensors)
    monkeypatch.setattr(step_framing, "GIL_RELEASED_FROM", 1 << 62)  # every tensor pauses
    every = _frame(tensors)
    # Only the records' wall times may differ (a float in each event): compare the index.
    assert with_rule[1] == every[1]
    assert len(with_rule[0]) == len(every[0])
