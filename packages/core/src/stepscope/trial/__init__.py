"""The read side of one job: steps, workers, collections and tensors, from a local folder
or an s3:// prefix, while the job runs or after it ended (smdebug outputs included).

`Trial` is a facade over parts with one job each: `steps.StepCatalog` (what the job
published: steps, mode steps, workers, tensor names, loaded from step tables and index
files), `collections.JobCollections` (the workers' collections files), `values.ValueReader`
(locating, reading, checking and decoding saved values, and their cache) and `status` (the
hooks' health reports)."""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Iterable
from typing import Any

import numpy as np

from .. import reductions
from ..capture.scopes import Scope, ScopeMap
from ..config import Collection
from ..exceptions import StepNotYetAvailable, StepUnavailable, TensorUnavailable, TensorUnavailableForStep, UnknownName
from ..modes import ModeKeys
from ..store import Store, open_store
from . import status as _status
from .collections import JobCollections
from .files import Problems
from .steps import StepCatalog
from .values import ValueReader


class Tensor:
    """One tensor's saved values across steps, modes and workers (a view on the trial)."""

    def __init__(self, trial: Trial, name: str):
        self.trial = trial
        self.name = name

    def _global_steps(self) -> list[int]:
        name = self.name
        reduced = self.trial._reductions_of().get(name, ())
        if not reduced:
            return [s for s, info in self.trial._catalog.steps.items() if info.has(name) or info.has_shape(name)]
        # A step where only its reductions were saved is one of its steps too (smdebug's
        # Tensor.steps): `value` there says the raw value was not saved.
        return [s for s, info in self.trial._catalog.steps.items() if info.has(name) or info.has_shape(name) or any(info.has(r) for r in reduced)]

    def steps(self, mode: ModeKeys | str | None = None, show_incomplete: bool = False) -> list[int]:
        """Steps with a saved value: global steps, or mode steps when `mode` is given."""
        return self.trial._catalog.filter_steps(self._global_steps(), mode, show_incomplete)

    def workers(self, step: int, mode: ModeKeys | str | None = None) -> list[str]:
        catalog = self.trial._catalog
        return sorted(catalog.steps[catalog.global_step(step, mode)].workers_with(self.name))

    def has_value(self, step: int, mode: ModeKeys | str | None = None) -> bool:
        catalog = self.trial._catalog
        try:
            return catalog.steps[catalog.global_step(step, mode)].has(self.name)
        except (StepUnavailable, StepNotYetAvailable):
            return False

    def value(self, step: int, mode: ModeKeys | str | None = None, worker: str | None = None) -> np.ndarray:
        """The saved value at `step` (a mode step when `mode` is given) as a numpy array.
        With several workers and no `worker`, the first worker's (sorted by name)."""
        values = self.trial._values
        global_step, worker, location = values.locate(self.name, step, mode, worker)
        return values.read([(self.name, global_step, worker, location)])[0]

    def values(self, mode: ModeKeys | str | None = None, worker: str | None = None) -> dict[int, np.ndarray]:
        """{step: value} over every step with a saved value (mode steps when `mode` is given)."""
        reader, name = self.trial._values, self.name
        wanted = []
        for step in self.steps(mode):
            try:
                wanted.append((step, *reader.locate(name, step, mode, worker)))
            except TensorUnavailableForStep:
                continue  # only a shape was saved at this step
        arrays = reader.read([(name, g, w, loc) for _, g, w, loc in wanted])
        return {s: a for (s, *_), a in zip(wanted, arrays)}

    def wall_time(self, step: int, mode: ModeKeys | str | None = None, worker: str | None = None) -> float:
        """When the value at `step` was saved: the event's wall_time, seconds since the epoch."""
        return self.trial._values.wall_time(self.name, step, mode, worker)

    def shape(self, step: int, mode: ModeKeys | str | None = None, worker: str | None = None) -> tuple[int, ...]:
        catalog = self.trial._catalog
        shapes = catalog.steps[catalog.global_step(step, mode)].shapes_of(self.name)
        if shapes:
            return shapes[worker] if worker in shapes else shapes[min(shapes)]
        return tuple(self.value(step, mode, worker).shape)

    def reduction_value(self, step: int, reduction_name: str, mode: ModeKeys | str | None = None, worker: str | None = None, abs: bool = False) -> float:
        """The reduction saved at `step`, else computed from the raw value."""
        base = reductions.normalize_reduction(reduction_name)

        def read(name: str) -> np.ndarray | None:
            if not self.trial.has_tensor(name):
                return None
            tensor = self.trial.tensor(name)
            return tensor.value(step, mode, worker) if tensor.has_value(step, mode) else None

        result = reductions.saved_or_computed(read, self.name, base, abs)
        if result is None:
            raise TensorUnavailableForStep(self.name, step, mode, worker, f"neither the raw value nor its {'abs_' if abs else ''}{base} was saved")
        return result

    def reduction_values(self, step: int, mode: ModeKeys | str | None = None, worker: str | None = None) -> dict[tuple[str, bool], float]:
        """Every reduction saved for this tensor at `step`: {(name, abs): value}."""
        out = {}
        for name in self.trial._reductions_of().get(self.name, ()):
            parsed = reductions.parse_reduction_tensor_name(name)
            assert parsed is not None  # (_reductions_of keeps names that parse)
            tensor = self.trial.tensor(name)
            if tensor.has_value(step, mode):
                out[(parsed[1], parsed[2])] = float(np.asarray(tensor.value(step, mode, worker)).reshape(-1)[0])
        return out

    def __repr__(self) -> str:
        return f"Tensor({self.name!r})"


class Trial:
    """Reader of one job. Call `refresh()` to see what a running job wrote since."""

    def __init__(self, path: str | Store, name: str | None = None, *, cache_size: int = 256):
        self.store = open_store(path)
        if not self.store.root_exists():
            raise FileNotFoundError(f"no job folder at {self.store.describe()} (a mistyped path?)")
        self.path = self.store.url
        self.name = name or self.path.rstrip("/").rsplit("/", 1)[-1]
        lock = threading.RLock()  # one for the parts: a refresh and a read may run in two threads
        self._problems = Problems(self.store)
        self._collections = JobCollections(self.store, self._problems, lock)
        self._catalog = StepCatalog(self.store, self._collections, self._problems, lock)
        self._values = ValueReader(self.store, self._catalog, self._collections, lock, cache_size)
        self._profiler = None
        self._reductions: tuple[int, dict[str, tuple[str, ...]]] = (-1, {})  # see _reductions_of
        self.refresh()

    def refresh(self) -> list[int]:
        """Load what was published since the last call; return the new global steps (see
        `StepCatalog.refresh` for what that costs)."""
        return self._catalog.refresh()

    @property
    def problems(self) -> list[str]:
        """The files this trial could not read and skipped, each with the reason."""
        self._collections.read()  # nothing listed stays unchecked
        return self._problems.listed()

    # --- steps, modes and workers ------------------------------------------------------

    def steps(self, mode: ModeKeys | str | None = None, show_incomplete: bool = False) -> list[int]:
        """Global steps (or mode steps of `mode`) that every worker has published."""
        return self._catalog.filter_steps(self._catalog.steps, mode, show_incomplete)

    def modes(self) -> list[ModeKeys]:
        return sorted({info.mode for info in self._catalog.steps.values()})

    def mode_of(self, global_step: int) -> tuple[ModeKeys, int]:
        info = self._catalog.steps.get(global_step)
        if info is None:
            self._catalog.raise_missing(global_step)
        return info.mode, info.mode_step

    def global_step(self, mode: ModeKeys | str, mode_step: int) -> int:
        return self._catalog.global_step(mode_step, mode)

    def workers(self) -> list[str]:
        return self._catalog.workers()

    @property
    def num_workers(self) -> int:
        return self._collections.expected_workers

    def is_complete(self) -> bool:
        """True once the job wrote its end marker (training_job_end.ts)."""
        return self._catalog.complete

    def last_complete_step(self, mode: ModeKeys | str | None = None) -> int | None:
        steps = self.steps(mode)
        return steps[-1] if steps else None

    def wait_for_steps(self, steps: Iterable[int], mode: ModeKeys | str | None = None, timeout: float | None = None, poll_interval: float = 0.5) -> None:
        """Block until every step in `steps` is published by every worker. Raises
        StepUnavailable if the job ends without them, StepNotYetAvailable on timeout."""
        wanted = set(steps)
        deadline = None if timeout is None else time.monotonic() + timeout
        delay = min(0.05, poll_interval)
        while True:
            missing = wanted - set(self.steps(mode))
            if not missing:
                return
            if self._catalog.complete:
                raise StepUnavailable(min(missing), mode)
            if deadline is not None and time.monotonic() >= deadline:
                raise StepNotYetAvailable(min(missing), mode)
            time.sleep(delay if deadline is None else max(0.0, min(delay, deadline - time.monotonic())))
            delay = min(delay * 2, poll_interval)
            self.refresh()

    # --- collections and scopes ----------------------------------------------------------

    def collections(self) -> dict[str, Collection]:
        return self._collections.collections()

    def collection(self, name: str) -> Collection:
        collections = self.collections()
        if name not in collections:
            raise UnknownName(f"no collection {name!r} in this trial; known: {', '.join(sorted(collections))}")
        return collections[name]

    def module_class(self, tensor_name: str) -> str | None:
        """The class of the module (layer) `tensor_name` is an input or output of, as the
        hook recorded it (e.g. "ReLU"); None when not recorded (older jobs, custom tensors)."""
        return self._collections.module_class(tensor_name)

    def scopes(self) -> list[Scope]:
        """The networks and optimizers the hook declared (`HookBase.declare_scope`); empty
        for a job that declared none (it is then judged as one scope, the whole job)."""
        return self._collections.scopes(self._catalog.seen_workers)

    def scope_map(self) -> ScopeMap:
        """Tensor name -> scope(s): `scope_map().group_of(name)` is the scope rules compare
        the tensor within; `scopes_of(name)` every scope that lists its parameter."""
        return ScopeMap(self.scopes())

    # --- the hooks' health ---------------------------------------------------------------

    def status(self) -> dict[str, dict[str, Any]]:
        """The health the workers' hooks reported (`stepscope-status/<worker>.json`), by
        worker: a hook that failed and switched itself off says so here ("state": "failed",
        "component", "error", "traceback", "time", "host", "pid"). Empty: nothing reported."""
        return _status.status_in(self.store)

    @staticmethod
    def status_in(store: Store) -> dict[str, dict[str, Any]]:
        """`status()` of the job in `store`, without opening a trial."""
        return _status.status_in(store)

    def failed_workers(self) -> dict[str, str]:
        """Workers whose hook (or profiler side) failed: worker -> "component: error"."""
        return _status.failed_workers_in(self.store)

    @staticmethod
    def failed_workers_in(store: Store) -> dict[str, str]:
        return _status.failed_workers_in(store)

    # --- tensors -------------------------------------------------------------------------

    def _reductions_of(self) -> dict[str, tuple[str, ...]]:
        """{tensor name: the names of its saved reductions}, for every tensor with one.
        A tensor saved only as reductions is a tensor of the trial under its own name, as in
        smdebug's reader (`tensor(name).reduction_value(...)`). Made again when the catalog
        has grown (its names are only ever added)."""
        names = self._catalog.tensor_names
        size, found = self._reductions
        if size != len(names):
            grouped: dict[str, list[str]] = {}
            for name in list(names):
                try:
                    parsed = reductions.parse_reduction_tensor_name(name)
                except ValueError:  # an unknown reduction: listed under its own name only
                    continue
                if parsed is not None:
                    grouped.setdefault(parsed[0], []).append(name)
            found = {base: tuple(sorted(reduced)) for base, reduced in grouped.items()}
            self._reductions = (len(names), found)
        return found

    def tensor_names(self, regex: str | Iterable[str] | None = None, collection: str | Collection | None = None, step: int | None = None, mode: ModeKeys | str | None = None) -> list[str]:
        names = set(self._catalog.tensor_names) | self._reductions_of().keys()
        if collection is not None:
            coll = collection if isinstance(collection, Collection) else self.collection(collection)
            names = {n for n in names if coll.matches(n)}
        if regex is not None:
            patterns = [re.compile(r) for r in ([regex] if isinstance(regex, str) else regex)]
            names = {n for n in names if any(p.search(n) for p in patterns)}
        if step is not None or mode is not None:
            names = {n for n in names if (step is None and Tensor(self, n).steps(mode)) or (step is not None and Tensor(self, n).has_value(step, mode))}
        return sorted(names)

    def tensor(self, name: str) -> Tensor:
        if not self.has_tensor(name):
            raise TensorUnavailable(name)
        return Tensor(self, name)

    def has_tensor(self, name: str) -> bool:
        return name in self._catalog.tensor_names or name in self._reductions_of()

    def read_many(self, requests: Iterable[tuple[str, int, ModeKeys | str | None, str | None]]) -> list[np.ndarray | None]:
        """Values of several (tensor, step, mode, worker) at once, as one batch of ranged reads
        (concurrent on S3); None where a value is not available. Readers that need many
        tensors per step (rules) use this instead of one `value()` call per tensor."""
        return self._values.read_many(requests)

    @property
    def profiler(self):
        """The profiler side of the job (system metrics, step timeline)."""
        if self._profiler is None:
            from ..profiler import create_profiler_trial

            self._profiler = create_profiler_trial(self.store)
        return self._profiler

    def __repr__(self) -> str:
        return f"Trial({self.path!r}, steps={len(self._catalog.steps)}, tensors={len(self._catalog.tensor_names)}, complete={self._catalog.complete})"


def create_trial(path: str | Store, name: str | None = None, **kwargs: Any) -> Trial:
    """Open the job at a local path or s3:// URL. A local path that does not exist raises
    FileNotFoundError (a mistyped path is not an empty job); an s3:// prefix may be empty
    (a job that has not written yet)."""
    return Trial(path, name=name, **kwargs)


__all__ = ["Trial", "Tensor", "create_trial"]
