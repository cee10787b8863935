"""launch_lookup: the runtime call that launched each GPU activity, found by correlation id,
against a plain dictionary of first occurrences; both the dense-table path (ids from a
counter) and the sorted-search path (sparse ids)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from stepscope.traces.analyzers.common import launch_lookup
from stepscope.traces.schema import KIND_CODE


def _events(call_ids: np.ndarray) -> pd.DataFrame:
    kinds = np.where(np.arange(call_ids.size) % 5 == 0, KIND_CODE["sync"], KIND_CODE["runtime"])
    frame = pd.DataFrame({"kind": kinds.astype(np.int8), "correlation": call_ids.astype(np.int64)})
    return frame.sort_values("kind", kind="stable", ignore_index=True)


def _expected(calls: pd.DataFrame, correlation: np.ndarray) -> np.ndarray:
    first: dict[int, int] = {}
    for position, value in enumerate(calls["correlation"].tolist()):
        first.setdefault(value, position)
    return np.array([first.get(int(c), -1) if c >= 0 else -1 for c in correlation], dtype=np.int64)


@pytest.mark.parametrize("spread", [1, 10_000], ids=["counter ids (table)", "sparse ids (search)"])
def test_each_activity_finds_the_first_call_with_its_id(spread):
    rng = np.random.default_rng(spread)
    ids = 1_000_000 + rng.integers(0, 3_000, size=2_000) * spread
    ids[rng.random(ids.size) < 0.05] = -1  # calls without a correlation id
    calls_events = _events(ids)
    # Ids that exist, ids that do not (inside and outside the range), and -1.
    queries = np.concatenate([rng.choice(ids, 500), 1_000_000 + rng.integers(-50, 3_050, 500) * spread, [-1, 0, 10**12]])
    calls, position = launch_lookup(calls_events, queries)
    np.testing.assert_array_equal(position, _expected(calls, queries))
    assert (position >= 0).any() and (position == -1).any()


def test_calls_without_ids_only():
    assert launch_lookup(_events(np.full(4, -1)), np.array([-1, 0, 3]))[1].tolist() == [-1, -1, -1]


def test_no_calls_or_no_activities():
    empty_calls = _events(np.zeros(0, dtype=np.int64))
    assert launch_lookup(empty_calls, np.array([5, 6]))[1].tolist() == [-1, -1]
    assert launch_lookup(_events(np.array([7, 8])), np.zeros(0, dtype=np.int64))[1].size == 0
