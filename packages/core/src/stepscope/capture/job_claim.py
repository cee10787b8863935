"""One writer per worker of a job folder. Each hook that saves tensors claims its worker in
`stepscope-status/<worker>.lock` (its run id, pid, host, start and close times); a second
hook or a second training into the same folder is refused while the first one is alive,
and recorded as a mixed job when it starts after one that closed or died.

Two trainings mixing in one folder overwrite each other's step files (both start at step 0)
and leave a job no rule can judge, so this must never be silent: `trial.status()` shows a
mixed worker ("state": "mixed", with its runs) and `stepscope check` exits 2 on it. A run
that continues another through `load_state_dict` (a Lightning checkpoint) is a resume, not
a mix.

Liveness is known only on the claiming host (the pid is alive), and within one process
through `_OPEN_CLAIMS` (the one process-wide table here: two hooks of one process share a
pid). A claim from another host cannot be checked: it is taken as a finished run, with a
warning. Reads and writes go through the store, so on S3 two starts in the same second may
both succeed; each still records the other's run."""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
import uuid
import weakref
from collections.abc import Mapping
from typing import Any

from .. import layout
from ..exceptions import ConfigError
from ..store import Store

logger = logging.getLogger("stepscope")

LOCK_SUFFIX = ".lock"
MAX_LOCK_BYTES = 1 << 20
MAX_RUNS_KEPT = 100
# (store description, worker) -> the claim of this process's hook that holds it (weakly: a
# hook dropped without close() holds nothing).
_OPEN_CLAIMS: dict[tuple[str, str], weakref.ref[WriterClaim]] = {}
_CLAIMS_LOCK = threading.Lock()


def lock_key(worker: str) -> str:
    return f"{layout.STATUS_DIR}/{worker}{LOCK_SUFFIX}"


def read_runs(store: Store, worker: str) -> list[dict[str, Any]]:
    """The runs recorded for `worker` (oldest first); [] when none or unreadable."""
    return parse_runs(_read(store, lock_key(worker)))


def _read(store: Store, key: str) -> bytes | None:
    try:
        if not store.exists(key):
            return None
        return store.read(key, max_size=MAX_LOCK_BYTES)
    except Exception as exc:  # noqa: BLE001 - an unreadable claim is not a reason to stop training
        logger.warning("stepscope: could not read %s: %s", store.describe(key), exc)
        return None


def parse_runs(raw: bytes | None) -> list[dict[str, Any]]:
    """The runs of a lock file's bytes, as untrusted input: entries that are not objects go."""
    if not raw:
        return []
    try:
        body = json.loads(raw)
    except ValueError:
        return []
    runs = body.get("runs") if isinstance(body, dict) else None
    return [run for run in runs if isinstance(run, dict)] if isinstance(runs, list) else []


def is_mixed(runs: list[dict[str, Any]]) -> bool:
    """More than one training wrote this worker's files (a resume continues its run)."""
    return sum(1 for run in runs if not run.get("resumed")) > 1


def mixed_status(worker: str, runs: list[dict[str, Any]]) -> dict[str, Any]:
    """What `trial.status()` shows for a worker whose folder two trainings wrote."""
    fresh = [run for run in runs if not run.get("resumed")]
    described = "; ".join(f"run {r.get('run_id')} (pid {r.get('pid')} on {r.get('host')})" for r in fresh[:5])
    return {
        "state": "mixed",
        "component": f"job folder ({worker})",
        "error": f"{len(fresh)} trainings wrote into this job folder as {worker}: {described}; their steps are mixed "
        "(each began at step 0): write each training to its own out_dir",
        "runs": runs[-MAX_RUNS_KEPT:],
    }


def _alive_here(run: Mapping[str, Any], store_id: str, worker: str) -> bool:
    """Whether the run that wrote `run` is alive, as far as this host can tell."""
    if run.get("closed") is not None or run.get("host") != socket.gethostname():
        return False
    pid = run.get("pid")
    if not isinstance(pid, int) or pid <= 0:
        return False
    if pid == os.getpid():
        with _CLAIMS_LOCK:
            ref = _OPEN_CLAIMS.get((store_id, worker))
        holder = ref() if ref is not None else None
        return holder is not None and not holder.released and holder.run_id == run.get("run_id")
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's live process
        return True
    except OSError:
        return False
    return True


class WriterClaim:
    """This hook's claim on one worker of a job folder (see the module docstring)."""

    def __init__(self, store: Store, worker: str):
        self.store, self.worker = store, worker
        self.store_id = store.describe()
        self.run_id = uuid.uuid4().hex[:12]
        self.entry: dict[str, Any] = {
            "run_id": self.run_id, "pid": os.getpid(), "host": socket.gethostname(), "started": time.time(), "closed": None,
        }
        self.earlier: list[dict[str, Any]] = []
        self.released = False

    @classmethod
    def claim(cls, store: Store, worker: str) -> WriterClaim:
        """Claim `worker` in `store`'s job; ConfigError when a live hook holds it."""
        claim = cls(store, worker)
        earlier = read_runs(store, worker)
        holder = next((run for run in reversed(earlier) if run.get("closed") is None and _alive_here(run, claim.store_id, worker)), None)
        if holder is not None:
            since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(float(holder.get("started") or 0)))
            raise ConfigError(
                f"{claim.store_id} is being written as {worker} by another hook: run {holder.get('run_id')} "
                f"(pid {holder.get('pid')} on {holder.get('host')}, since {since}). One job folder has one writer per "
                "worker: register every model on one hook (hook.register_module(model, name=...)), or give this "
                "training its own out_dir"
            )
        if not earlier and store.exists(layout.collections_key(worker)):
            earlier = [{"run_id": None, "note": "files of an earlier writer that kept no claim"}]
        for run in earlier:
            if run.get("closed") is None and run.get("run_id") is not None:
                run["closed"] = "never (its process is gone or on another host)"
        claim.earlier = earlier
        with _CLAIMS_LOCK:
            _OPEN_CLAIMS[(claim.store_id, worker)] = weakref.ref(claim)
        claim._publish()
        if earlier:
            logger.warning(
                "stepscope: %s already holds the files of %d earlier training(s) as %s; this run's steps will be mixed "
                "with theirs (stepscope check reports the job as mixed). Give each training its own out_dir; a run "
                "resumed with the callback's/hook's state (load_state_dict) continues the job instead.",
                claim.store_id, len(earlier), worker,
            )
        return claim

    @property
    def mixed(self) -> bool:
        return is_mixed([*self.earlier, self.entry])

    def resumed(self) -> None:
        """This run continues the job's step numbering (load_state_dict): not a mix."""
        if self.earlier and not self.entry.get("resumed"):
            self.entry["resumed"] = True
            self._publish()

    def release(self) -> None:
        """At close: the worker is free again (the runs stay recorded)."""
        if self.released:
            return
        self.released = True
        self.entry["closed"] = time.time()
        with _CLAIMS_LOCK:
            ref = _OPEN_CLAIMS.get((self.store_id, self.worker))
            if ref is not None and ref() is self:
                del _OPEN_CLAIMS[(self.store_id, self.worker)]
        self._publish()

    def _publish(self) -> None:
        runs = [*self.earlier, self.entry][-MAX_RUNS_KEPT:]
        body = {"worker": self.worker, "runs": runs}
        self.store.write(lock_key(self.worker), json.dumps(body, indent=1, default=str).encode())


__all__ = ["WriterClaim", "is_mixed", "lock_key", "mixed_status", "parse_runs", "read_runs"]
