"""A trial's tensor values: where a saved value sits (step, worker, event file, offset),
reading it with its record's CRCs checked and decoding it, and a bounded cache of what
was read. Every damaged record is a CorruptRecord naming the file and the offset."""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Iterable
from typing import NamedTuple

import numpy as np

from .. import job_files, layout, records, tensor_wire
from ..exceptions import CorruptRecord, StepNotYetAvailable, StepUnavailable, TensorUnavailableForStep
from ..modes import ModeKeys
from ..store import Store
from .collections import JobCollections
from .steps import StepCatalog


class Location(NamedTuple):  # one per value read: a tuple costs less to make than a frozen dataclass
    event_key: str
    start: int
    length: int


# (tensor name, global step, worker, where its record is)
Wanted = tuple[str, int, str, Location]


class ValueReader:
    """Reads saved values for the trial and its tensors (see `Trial.read_many`)."""

    def __init__(self, store: Store, catalog: StepCatalog, collections: JobCollections, lock: threading.RLock, cache_size: int):
        self._store, self._catalog, self._collections, self._lock = store, catalog, collections, lock
        self._cache: OrderedDict[tuple[str, int, str], np.ndarray] = OrderedDict()
        self._cache_size = cache_size
        self._decoder = tensor_wire.TensorDecoder()

    def locate(self, name: str, step: int, mode: ModeKeys | str | None, worker: str | None) -> tuple[int, str, Location]:
        """(global step, worker, location) of `name`'s value at `step` (a mode step of
        `mode` when given) of `worker` (default: the first, by name, that saved it)."""
        catalog = self._catalog
        global_step = catalog.global_step(step, mode)
        info = catalog.steps[global_step]
        workers = info.workers_with(name)
        if not workers:
            reason = "only its shape was saved" if info.has_shape(name) else ""
            raise TensorUnavailableForStep(name, step, mode, worker, reason)
        if worker is None:
            worker = min(workers)
        elif worker not in workers:
            raise TensorUnavailableForStep(name, step, mode, worker)
        start, length = info.entries(worker).location(name)  # type: ignore[union-attr]  # worker is in workers_with
        if type(start) is not int or type(length) is not int or start < 0 or length < 1:  # a crafted step table
            job_files.check_location(start, length, self._store.describe(catalog.index_key(info, global_step, worker)), name)
        event_key = info.event_keys.get(worker) or layout.event_file_key(global_step, worker)
        return global_step, worker, Location(event_key, start, length)

    def payload(self, record: bytes, location: Location) -> memoryview:
        """The payload of one record read at `location`, its CRCs checked."""
        return memoryview(record)[slice(*self._payload_bounds(record, location))]

    def _payload_bounds(self, record: bytes, location: Location) -> tuple[int, int]:
        if len(record) < location.length:
            raise CorruptRecord(self._store.describe(location.event_key), location.start, f"truncated file: record needs {location.length} bytes, {len(record)} present")
        try:
            return records.payload_bounds(record, 0, allow_placeholder_crc=self._collections.legacy)
        except CorruptRecord as exc:  # re-raised with the file's name and the record's offset
            raise CorruptRecord(self._store.describe(location.event_key), location.start, exc.reason) from None

    def _decode(self, record: bytes, location: Location, name: str) -> np.ndarray:
        start, end = self._payload_bounds(record, location)
        try:
            decoded = self._decoder.decode(record, start, end, name)  # the plain layout, without protobuf
            if decoded is None:
                from ..events import decode_tensor_tag_value  # any other: protobuf says what is wrong

                decoded = decode_tensor_tag_value(memoryview(record)[start:end])
            tag, array = decoded
        except Exception as exc:
            raise CorruptRecord(self._store.describe(location.event_key), location.start, f"cannot decode the event: {exc}") from None
        if tag != name and tag:
            raise CorruptRecord(self._store.describe(location.event_key), location.start, f"the record there holds {tag!r}, not {name!r}")
        return array

    def read(self, wanted: list[Wanted]) -> list[np.ndarray]:
        """The values of `wanted`, from the cache or as one batch of ranged reads."""
        results: list[np.ndarray | None] = []
        missing = []
        for i, (name, step, worker, _location) in enumerate(wanted):
            cached = self._cache.get((name, step, worker))
            results.append(cached)
            if cached is None:
                missing.append(i)
        if missing:
            steps = self._catalog.steps
            raw: list[bytes | None]
            try:
                raw = list(self._store.read_ranges([wanted[i][3] for i in missing]))  # a Location is (key, start, length)
            except FileNotFoundError as exc:
                raw = [None] * len(missing)
                if not any(wanted[i][2] in steps[wanted[i][1]].tables for i in missing if wanted[i][1] in steps):
                    raise CorruptRecord(str(exc), None, "event file listed in the index is missing") from None
            for i, data in zip(missing, raw):
                name, step, worker, location = wanted[i]
                try:
                    if data is None:
                        raise CorruptRecord(self._store.describe(location.event_key), None, "event file listed in the step table is missing")
                    array = self._decode(data, location, name)
                except CorruptRecord:
                    recovered = self._from_index_file(name, step, worker)
                    if recovered is None:
                        raise
                    array = recovered
                results[i] = array
            # What the cache would hold after remembering each in turn: the batch's last ones.
            for i in missing[-self._cache_size :] if self._cache_size > 0 else ():
                self._remember((wanted[i][0], wanted[i][1], wanted[i][2]), results[i])  # type: ignore[arg-type]
        return results  # type: ignore[return-value]

    def _from_index_file(self, name: str, step: int, worker: str) -> np.ndarray | None:
        """A step table that disagrees with the event file loses to the index file: the
        value where the index file says; None when there is no index file to ask, or it
        does not list `name`."""
        if not self._catalog.reload_from_index(step, worker):
            return None
        with self._lock:
            self._cache = OrderedDict((k, v) for k, v in self._cache.items() if k[1] != step or k[2] != worker)
        if not self._catalog.steps[step].has(name):
            return None
        return self.read([(name, step, worker, self.locate(name, step, None, worker)[2])])[0]

    def read_many(self, requests: Iterable[tuple[str, int, ModeKeys | str | None, str | None]]) -> list[np.ndarray | None]:
        """Values of several (tensor, step, mode, worker) at once; None where not available."""
        requests = list(requests)
        out: list[np.ndarray | None] = [None] * len(requests)
        wanted, slots = [], []
        names = self._catalog.tensor_names
        for i, (name, step, mode, worker) in enumerate(requests):
            if name not in names:
                continue
            try:
                global_step, chosen, location = self.locate(name, step, mode, worker)
            except (StepUnavailable, StepNotYetAvailable, TensorUnavailableForStep):
                continue
            wanted.append((name, global_step, chosen, location))
            slots.append(i)
        for i, array in zip(slots, self.read(wanted) if wanted else []):
            out[i] = array
        return out

    def wall_time(self, name: str, step: int, mode: ModeKeys | str | None, worker: str | None) -> float:
        """When the value at `step` was saved: the event's wall_time, seconds since the epoch."""
        from ..events import decode_tensor_event  # protobuf: only where it is needed

        _, _, location = self.locate(name, step, mode, worker)
        data = self._store.read_range(location.event_key, location.start, location.length)
        return float(decode_tensor_event(self.payload(data, location)).wall_time)

    def _remember(self, key: tuple[str, int, str], array: np.ndarray) -> None:
        if self._cache_size <= 0:
            return
        with self._lock:
            self._cache[key] = array
            self._cache.move_to_end(key)
            while len(self._cache) > self._cache_size:
                self._cache.popitem(last=False)
