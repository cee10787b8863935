"""The read side of one job: steps, workers, collections and tensors, from a local folder
or an s3:// prefix, while the job runs or after it ended (smdebug outputs included)."""

from __future__ import annotations

import json
import logging
import re
import threading
import time
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Iterable

import numpy as np

from . import layout, reductions, records
from .collection_manager import CollectionManager
from .config import Collection
from .events import decode_tensor_event
from .exceptions import (
    CorruptRecord,
    StepNotYetAvailable,
    StepUnavailable,
    TensorUnavailable,
    TensorUnavailableForStep,
)
from .modes import ModeKeys
from .store import Store, open_store

logger = logging.getLogger("stepscope")


@dataclass(frozen=True)
class _Location:
    event_key: str
    start: int
    length: int


@dataclass
class _StepInfo:
    mode: ModeKeys
    mode_step: int
    workers: dict[str, str]  # worker -> index key


class Tensor:
    """One tensor's saved values across steps, modes and workers."""

    def __init__(self, trial: "Trial", name: str):
        self.trial = trial
        self.name = name
        self._locations: dict[int, dict[str, _Location]] = {}
        self.shapes: dict[int, dict[str, tuple[int, ...]]] = {}

    def _add(self, step: int, worker: str, location: _Location | None, shape: tuple[int, ...] | None) -> None:
        if location is not None:
            self._locations.setdefault(step, {})[worker] = location
        if shape is not None:
            self.shapes.setdefault(step, {})[worker] = shape

    def steps(self, mode: ModeKeys | str | None = None, show_incomplete: bool = False) -> list[int]:
        """Steps with a saved value: global steps, or mode steps when `mode` is given."""
        return self.trial._filter_steps(set(self._locations) | set(self.shapes), mode, show_incomplete)

    def workers(self, step: int, mode: ModeKeys | str | None = None) -> list[str]:
        return sorted(self._locations.get(self.trial._global_step(step, mode, self.name), {}))

    def has_value(self, step: int, mode: ModeKeys | str | None = None) -> bool:
        try:
            return self.trial._global_step(step, mode, self.name) in self._locations
        except (StepUnavailable, StepNotYetAvailable, TensorUnavailableForStep):
            return False

    def _location(self, step: int, mode, worker: str | None) -> tuple[int, str, _Location]:
        global_step = self.trial._global_step(step, mode, self.name)
        by_worker = self._locations.get(global_step)
        if not by_worker:
            reason = "only its shape was saved" if global_step in self.shapes else ""
            raise TensorUnavailableForStep(self.name, step, mode, worker, reason)
        if worker is None:
            worker = min(by_worker)
        elif worker not in by_worker:
            raise TensorUnavailableForStep(self.name, step, mode, worker)
        return global_step, worker, by_worker[worker]

    def value(self, step: int, mode: ModeKeys | str | None = None, worker: str | None = None) -> np.ndarray:
        """The saved value at `step` (a mode step when `mode` is given) as a numpy array.
        With several workers and no `worker`, the first worker's (sorted by name)."""
        global_step, worker, location = self._location(step, mode, worker)
        return self.trial._read_value(self.name, global_step, worker, location)

    def values(self, mode: ModeKeys | str | None = None, worker: str | None = None) -> dict[int, np.ndarray]:
        """{step: value} over every saved step (mode steps when `mode` is given)."""
        steps = self.steps(mode)
        wanted = [(s,) + self._location(s, mode, worker) for s in steps]
        arrays = self.trial._read_values([(self.name, g, w, loc) for _, g, w, loc in wanted])
        return {s: a for (s, *_), a in zip(wanted, arrays)}

    def shape(self, step: int, mode: ModeKeys | str | None = None, worker: str | None = None) -> tuple[int, ...]:
        global_step = self.trial._global_step(step, mode, self.name)
        shapes = self.shapes.get(global_step)
        if shapes:
            return shapes[worker] if worker in shapes else shapes[min(shapes)]
        return tuple(self.value(step, mode, worker).shape)

    def reduction_value(self, step: int, reduction_name: str, mode: ModeKeys | str | None = None, worker: str | None = None, abs: bool = False) -> float:
        """The reduction saved at `step`, else computed from the raw value."""
        base = reductions.normalize_reduction(reduction_name)
        for spelling in (base, f"{base}_norm") if base in ("l1", "l2") else (base,):
            saved = self.trial._tensors.get(reductions.reduction_tensor_name(self.name, spelling, abs))
            if saved is not None and saved.has_value(step, mode):
                return float(np.asarray(saved.value(step, mode, worker)).reshape(-1)[0])
        try:
            raw = self.value(step, mode, worker)
        except TensorUnavailableForStep:
            raise TensorUnavailableForStep(self.name, step, mode, worker, f"neither the raw value nor its {'abs_' if abs else ''}{base} was saved") from None
        return float(reductions.compute(raw, base, abs))

    def reduction_values(self, step: int, mode: ModeKeys | str | None = None, worker: str | None = None) -> dict[tuple[str, bool], float]:
        """Every reduction saved for this tensor at `step`: {(name, abs): value}."""
        out = {}
        for name, tensor in self.trial._tensors.items():
            parsed = reductions.parse_reduction_tensor_name(name)
            if parsed and parsed[0] == self.name and tensor.has_value(step, mode):
                out[(parsed[1], parsed[2])] = float(np.asarray(tensor.value(step, mode, worker)).reshape(-1)[0])
        return out

    def __repr__(self) -> str:
        return f"Tensor({self.name!r}, steps={len(self._locations)})"


class Trial:
    """Reader of one job. Call `refresh()` to see what a running job wrote since."""

    def __init__(self, path: "str | Store", name: str | None = None, *, cache_size: int = 256):
        self.store = open_store(path)
        self.path = self.store.url
        self.name = name or self.path.rstrip("/").rsplit("/", 1)[-1]
        self._steps: dict[int, _StepInfo] = {}
        self._mode_steps: dict[ModeKeys, dict[int, int]] = {}
        self._tensors: dict[str, Tensor] = {}
        self._loaded_index_keys: set[str] = set()
        self._collections: CollectionManager | None = None
        self._collection_workers: set[str] = set()
        self._collection_names: set[str] = set()
        self._num_workers = 1
        self._legacy = True
        self._complete = False
        self._listing_floor: str | None = None
        self._cache: OrderedDict[tuple[str, int, str], np.ndarray] = OrderedDict()
        self._cache_size = cache_size
        self._lock = threading.RLock()
        self._profiler = None
        self.refresh()

    # --- loading ----------------------------------------------------------------------

    def refresh(self) -> list[int]:
        """Load what was published since the last call; return the new global steps."""
        with self._lock:
            was_complete = self._complete
            self._complete = self.store.exists(layout.END_MARKER)
            self._load_collections()
            keys = [k for k in self.store.list(layout.INDEX_DIR + "/", start_after=self._listing_floor) if k not in self._loaded_index_keys]
            new_steps = self._load_index_files(keys)
            self._advance_listing_floor()
            if self._complete and not was_complete:
                # The end marker is written after the last index file, but a listing may
                # have raced it: one more look after seeing the marker.
                keys = [k for k in self.store.list(layout.INDEX_DIR + "/", start_after=self._listing_floor) if k not in self._loaded_index_keys]
                new_steps += self._load_index_files(keys)
            return sorted(set(new_steps))

    def _load_collections(self) -> None:
        keys = self.store.list(layout.COLLECTIONS_DIR + "/")
        fresh = [k for k in keys if k not in self._collection_workers]
        if not fresh:
            return
        manager = self._collections or CollectionManager()
        for key in fresh:
            try:
                data = json.loads(self.store.read(key))
            except (ValueError, OSError) as exc:
                logger.warning("stepscope: skipping unreadable collections file %s: %s", self.store.describe(key), exc)
                self._collection_workers.add(key)
                continue
            meta = data.get("_meta") or {}
            self._num_workers = max(self._num_workers, int(meta.get("num_workers", 1)))
            self._legacy = self._legacy and meta.get("writer", "").split(" ")[0] != "stepscope"
            for body in (data.get("collections") or {}).values():
                try:
                    collection = Collection.from_json(body)
                except Exception as exc:  # a bad entry must not hide the others
                    logger.warning("stepscope: skipping collection in %s: %s", self.store.describe(key), exc)
                    continue
                if collection.name in self._collection_names:
                    # Each worker lists the tensors it saw; the trial's collection is their union.
                    manager.get(collection.name).tensor_names |= collection.tensor_names
                else:
                    manager.add(collection)
                    self._collection_names.add(collection.name)
            self._collection_workers.add(key)
        self._collections = manager

    def _load_index_files(self, keys: list[str]) -> list[int]:
        parsed = [(k, layout.parse_index_key(k)) for k in keys]
        parsed = [(k, p) for k, p in parsed if p is not None]
        if not parsed:
            return []
        reads = self._map(lambda kp: self._read_index(kp[0]), parsed)
        new_steps = []
        for (key, (step, worker)), index in zip(parsed, reads):
            self._loaded_index_keys.add(key)
            if index is None:
                continue
            self._add_index(step, worker, key, index)
            new_steps.append(step)
        return new_steps

    def _map(self, fn, items: list) -> list:
        if self.store.concurrent_reads and len(items) > 1:
            with ThreadPoolExecutor(max_workers=16) as pool:
                return list(pool.map(fn, items))
        return [fn(item) for item in items]

    def _read_index(self, key: str) -> dict[str, Any] | None:
        try:
            data = json.loads(self.store.read(key))
            meta = data["meta"]
            ModeKeys.parse(meta.get("mode", "GLOBAL"))
            for entry in data.get("tensor_payload", ()):
                entry["tensorname"], int(entry["start_idx"]), int(entry["length"])
            return data
        except FileNotFoundError:
            return None
        except (ValueError, KeyError, TypeError) as exc:
            logger.warning("stepscope: skipping malformed index file %s: %s", self.store.describe(key), exc)
            return None

    def _add_index(self, step: int, worker: str, key: str, index: dict[str, Any]) -> None:
        meta = index["meta"]
        mode = ModeKeys.parse(meta.get("mode", "GLOBAL"))
        mode_step = int(meta.get("mode_step", step))
        info = self._steps.get(step)
        if info is None:
            info = self._steps[step] = _StepInfo(mode, mode_step, {})
            self._mode_steps.setdefault(mode, {})[mode_step] = step
        info.workers[worker] = key
        event_key = meta.get("event_file_name") or layout.event_file_key(step, worker)
        event_key = event_key.split(self.path.rstrip("/") + "/", 1)[-1]
        for entry in index.get("tensor_payload", ()):
            self._tensor(entry["tensorname"])._add(step, worker, _Location(event_key, int(entry["start_idx"]), int(entry["length"])), None)
        for entry in index.get("shape_payload", ()) or ():
            self._tensor(entry["tensorname"])._add(step, worker, None, tuple(int(d) for d in entry.get("shape", ())))

    def _tensor(self, name: str) -> Tensor:
        tensor = self._tensors.get(name)
        if tensor is None:
            tensor = self._tensors[name] = Tensor(self, name)
        return tensor

    def _advance_listing_floor(self) -> None:
        """Relist from the first step some worker has not published yet: workers publish
        independently, so a key can appear below the last one seen."""
        expected = self._expected_workers()
        floor = None
        for step in sorted(self._steps):
            if len(self._steps[step].workers) < expected:
                break
            floor = step
        if floor is not None:
            self._listing_floor = f"{layout.INDEX_DIR}/{floor // 1000:09d}/{floor:012d}_~"

    def _expected_workers(self) -> int:
        return max(self._num_workers, 1)

    # --- reading values ---------------------------------------------------------------

    def _decode(self, payload_bytes: bytes, event_key: str, location: _Location) -> np.ndarray:
        payload, _ = records.parse_record(payload_bytes, 0, path=self.store.describe(event_key), allow_placeholder_crc=self._legacy)
        try:
            return decode_tensor_event(payload).value
        except Exception as exc:
            raise CorruptRecord(self.store.describe(event_key), location.start, f"cannot decode the event: {exc}") from None

    def _read_value(self, name: str, step: int, worker: str, location: _Location) -> np.ndarray:
        return self._read_values([(name, step, worker, location)])[0]

    def _read_values(self, wanted: list[tuple[str, int, str, _Location]]) -> list[np.ndarray]:
        results: list[np.ndarray | None] = []
        missing = []
        for i, (name, step, worker, location) in enumerate(wanted):
            cached = self._cache.get((name, step, worker))
            results.append(cached)
            if cached is None:
                missing.append(i)
        if missing:
            try:
                raw = self.store.read_ranges([(wanted[i][3].event_key, wanted[i][3].start, wanted[i][3].length) for i in missing])
            except FileNotFoundError as exc:
                raise CorruptRecord(str(exc), None, "event file listed in the index is missing") from None
            for i, data in zip(missing, raw):
                name, step, worker, location = wanted[i]
                if len(data) < location.length:
                    raise CorruptRecord(self.store.describe(location.event_key), location.start, f"truncated file: record needs {location.length} bytes, {len(data)} present")
                array = self._decode(data, location.event_key, location)
                results[i] = array
                self._remember((name, step, worker), array)
        return results  # type: ignore[return-value]

    def _remember(self, key: tuple[str, int, str], array: np.ndarray) -> None:
        if self._cache_size <= 0:
            return
        with self._lock:
            self._cache[key] = array
            self._cache.move_to_end(key)
            while len(self._cache) > self._cache_size:
                self._cache.popitem(last=False)

    # --- steps and modes --------------------------------------------------------------

    def _global_step(self, step: int, mode: ModeKeys | str | None, tensor: str | None = None) -> int:
        if mode is None:
            if step in self._steps:
                return step
        else:
            mode = ModeKeys.parse(mode)
            global_step = self._mode_steps.get(mode, {}).get(step)
            if global_step is not None:
                return global_step
        if self._complete:
            raise StepUnavailable(step, mode)
        raise StepNotYetAvailable(step, mode)

    def _filter_steps(self, global_steps: Iterable[int], mode, show_incomplete: bool) -> list[int]:
        expected = self._expected_workers()
        out = []
        for step in global_steps:
            info = self._steps.get(step)
            if info is None:
                continue
            if not show_incomplete and len(info.workers) < expected and not self._complete:
                continue
            if mode is None:
                out.append(step)
            elif info.mode == ModeKeys.parse(mode):
                out.append(info.mode_step)
        return sorted(out)

    def steps(self, mode: ModeKeys | str | None = None, show_incomplete: bool = False) -> list[int]:
        """Global steps (or mode steps of `mode`) that every worker has published."""
        return self._filter_steps(self._steps, mode, show_incomplete)

    def modes(self) -> list[ModeKeys]:
        return sorted({info.mode for info in self._steps.values()})

    def mode_of(self, global_step: int) -> tuple[ModeKeys, int]:
        info = self._steps.get(global_step)
        if info is None:
            return self._raise_missing(global_step)
        return info.mode, info.mode_step

    def global_step(self, mode: ModeKeys | str, mode_step: int) -> int:
        return self._global_step(mode_step, mode)

    def _raise_missing(self, step: int):
        if self._complete:
            raise StepUnavailable(step)
        raise StepNotYetAvailable(step)

    def workers(self) -> list[str]:
        return sorted({w for info in self._steps.values() for w in info.workers})

    @property
    def num_workers(self) -> int:
        return self._expected_workers()

    def collections(self) -> dict[str, Collection]:
        return {c.name: c for c in self._collections} if self._collections else {}

    def collection(self, name: str) -> Collection:
        collections = self.collections()
        if name not in collections:
            raise KeyError(f"no collection {name!r} in this trial; known: {', '.join(sorted(collections))}")
        return collections[name]

    def tensor_names(self, regex: str | Iterable[str] | None = None, collection: str | Collection | None = None, step: int | None = None, mode: ModeKeys | str | None = None) -> list[str]:
        names = set(self._tensors)
        if collection is not None:
            coll = collection if isinstance(collection, Collection) else self.collection(collection)
            names = {n for n in names if coll.matches(n)}
        if regex is not None:
            patterns = [re.compile(r) for r in ([regex] if isinstance(regex, str) else regex)]
            names = {n for n in names if any(p.search(n) for p in patterns)}
        if step is not None or mode is not None:
            names = {n for n in names if (step is None and self._tensors[n].steps(mode)) or (step is not None and self._tensors[n].has_value(step, mode))}
        return sorted(names)

    def tensor(self, name: str) -> Tensor:
        tensor = self._tensors.get(name)
        if tensor is None:
            raise TensorUnavailable(name)
        return tensor

    def has_tensor(self, name: str) -> bool:
        return name in self._tensors

    def is_complete(self) -> bool:
        """True once the job wrote its end marker (training_job_end.ts)."""
        return self._complete

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
            if self._complete:
                raise StepUnavailable(min(missing), mode)
            if deadline is not None and time.monotonic() >= deadline:
                raise StepNotYetAvailable(min(missing), mode)
            time.sleep(delay if deadline is None else max(0.0, min(delay, deadline - time.monotonic())))
            delay = min(delay * 2, poll_interval)
            self.refresh()

    @property
    def profiler(self):
        """The profiler side of the job (system metrics, step timeline)."""
        if self._profiler is None:
            from .profiler import create_profiler_trial

            self._profiler = create_profiler_trial(self.store)
        return self._profiler

    def __repr__(self) -> str:
        return f"Trial({self.path!r}, steps={len(self._steps)}, tensors={len(self._tensors)}, complete={self._complete})"


def create_trial(path: "str | Store", name: str | None = None, **kwargs: Any) -> Trial:
    """Open the job at a local path or s3:// URL."""
    return Trial(path, name=name, **kwargs)
