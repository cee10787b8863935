"""The data behind a job's Ranks page, as plain JSON: the per-rank comparison and the
stragglers from the per-rank trace summaries queried with DuckDB (JobQuery, the same
queries as the report's Distributed section), so memory is O(summaries)."""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any

from ..exceptions import ConfigError
from .views import _cached, _traces, table


def ranks(trial: Any, stamp: Hashable) -> dict[str, Any]:
    return _cached(trial, stamp, "ranks", lambda: _ranks(trial))


def _ranks(trial: Any) -> dict[str, Any]:
    if _traces(trial) is None:
        return {"available": False, "reason": "no detailed traces in this job (profile some steps with the plugins' detailed profiling)"}
    try:
        from ..traces.cluster import JobQuery

        query = JobQuery(trial.store)
    except ConfigError as exc:  # DuckDB not installed
        return {"available": False, "reason": str(exc)}
    with query:
        found = query.ranks
        if len(found) < 2:
            return {"available": False, "reason": f"a single-rank job ({len(found)} rank with traces): nothing to compare across ranks"}
        return {"available": True, "ranks": table(query.rank_comparison()), "stragglers": table(query.straggler_ranks())}
