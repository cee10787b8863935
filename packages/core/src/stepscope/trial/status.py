"""The health the workers' hooks reported (`stepscope-status/<worker>.json`), read from a
job's store without opening a trial (`stepscope check` asks before it opens one)."""

from __future__ import annotations

from typing import Any

from .. import job_files, layout
from ..capture import job_claim
from ..exceptions import StepscopeError
from ..store import Store


def status_in(store: Store) -> dict[str, dict[str, Any]]:
    """By worker: what its hook reported. A hook that failed and switched itself off says
    so ("state": "failed", "component", "error", "traceback", "time", "host", "pid"); two
    trainings that wrote into one folder show as mixed. Empty: nothing reported."""
    found: dict[str, dict[str, Any]] = {}
    mixed: dict[str, dict[str, Any]] = {}
    for key in sorted(store.list(layout.STATUS_DIR + "/")):
        name = key.rsplit("/", 1)[-1]
        if name.endswith(job_claim.LOCK_SUFFIX):  # the writers' claims: two trainings in one folder
            runs = job_claim.read_runs(store, name[: -len(job_claim.LOCK_SUFFIX)])
            if job_claim.is_mixed(runs):
                worker = name[: -len(job_claim.LOCK_SUFFIX)]
                mixed[worker] = job_claim.mixed_status(worker, runs)
            continue
        if not name.endswith(".json"):
            continue
        try:
            body = job_files.load_json(store.read(key, max_size=job_files.MAX_STATUS_BYTES), store.describe(key))
        except (OSError, StepscopeError) as exc:
            body = {"state": "unreadable", "error": f"{key}: {exc}"}
        if not isinstance(body, dict):
            body = {"state": "unreadable", "error": f"{key}: not a JSON object"}
        found[name[: -len(".json")]] = body
    for worker, status in mixed.items():
        # A failure says more than the mix; "ok" / "degraded" say less.
        body = found.get(worker)
        found[worker] = status if body is None or body.get("state") in ("ok", "degraded") else {**body, "runs": status["runs"]}
    return found


def failed_workers_in(store: Store) -> dict[str, str]:
    """Workers whose hook (or profiler side) failed: worker -> "component: error"."""
    return {
        worker: f"{body.get('component', '?')}: {body.get('error', '?')}"
        for worker, body in status_in(store).items()
        # degraded: some tensors skipped, the hook runs on; too little data: saved fewer
        # steps than the default rules need (stepscope.capture.evidence), nothing failed.
        if body.get("state") not in ("ok", "degraded", "too little data")
    }
