"""The read side of one job: steps, workers, collections and tensors, from a local folder
or an s3:// prefix, while the job runs or after it ended (smdebug outputs included)."""

from __future__ import annotations

import logging
import re
import threading
import time
from collections import OrderedDict
from collections.abc import Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np

from . import job_files, layout, records, reductions, step_index, tensor_wire
from .capture import job_claim
from .capture.collection_manager import CollectionManager
from .capture.scopes import Scope, ScopeMap, merge_scope
from .config import Collection
from .exceptions import (
    ConfigError,
    CorruptRecord,
    StepNotYetAvailable,
    StepscopeError,
    StepUnavailable,
    TensorUnavailable,
    TensorUnavailableForStep,
    UnknownName,
)
from .modes import ModeKeys
from .store import Store, open_store

logger = logging.getLogger("stepscope")


@dataclass(frozen=True)
class _Location:
    event_key: str
    start: int
    length: int


class Tensor:
    """One tensor's saved values across steps, modes and workers (a view on the trial)."""

    def __init__(self, trial: Trial, name: str):
        self.trial = trial
        self.name = name

    def _global_steps(self) -> list[int]:
        name = self.name
        return [s for s, info in self.trial._steps.items() if info.has(name) or info.has_shape(name)]

    def steps(self, mode: ModeKeys | str | None = None, show_incomplete: bool = False) -> list[int]:
        """Steps with a saved value: global steps, or mode steps when `mode` is given."""
        return self.trial._filter_steps(self._global_steps(), mode, show_incomplete)

    def workers(self, step: int, mode: ModeKeys | str | None = None) -> list[str]:
        info = self.trial._steps[self.trial._global_step(step, mode)]
        return sorted(info.workers_with(self.name))

    def has_value(self, step: int, mode: ModeKeys | str | None = None) -> bool:
        try:
            return self.trial._steps[self.trial._global_step(step, mode)].has(self.name)
        except (StepUnavailable, StepNotYetAvailable):
            return False

    def _location(self, step: int, mode, worker: str | None) -> tuple[int, str, _Location]:
        global_step = self.trial._global_step(step, mode)
        info = self.trial._steps[global_step]
        workers = info.workers_with(self.name)
        if not workers:
            reason = "only its shape was saved" if info.has_shape(self.name) else ""
            raise TensorUnavailableForStep(self.name, step, mode, worker, reason)
        if worker is None:
            worker = min(workers)
        elif worker not in workers:
            raise TensorUnavailableForStep(self.name, step, mode, worker)
        start, length = info.entries(worker).location(self.name)  # type: ignore[union-attr]  # worker is in workers_with
        if type(start) is not int or type(length) is not int or start < 0 or length < 1:  # a crafted step table
            job_files.check_location(start, length, self.trial.store.describe(self.trial._index_key(info, global_step, worker)), self.name)
        event_key = info.event_keys.get(worker) or layout.event_file_key(global_step, worker)
        return global_step, worker, _Location(event_key, start, length)

    def value(self, step: int, mode: ModeKeys | str | None = None, worker: str | None = None) -> np.ndarray:
        """The saved value at `step` (a mode step when `mode` is given) as a numpy array.
        With several workers and no `worker`, the first worker's (sorted by name)."""
        global_step, worker, location = self._location(step, mode, worker)
        return self.trial._read_values([(self.name, global_step, worker, location)])[0]

    def values(self, mode: ModeKeys | str | None = None, worker: str | None = None) -> dict[int, np.ndarray]:
        """{step: value} over every step with a saved value (mode steps when `mode` is given)."""
        wanted = []
        for step in self.steps(mode):
            try:
                wanted.append((step,) + self._location(step, mode, worker))
            except TensorUnavailableForStep:
                continue  # only a shape was saved at this step
        arrays = self.trial._read_values([(self.name, g, w, loc) for _, g, w, loc in wanted])
        return {s: a for (s, *_), a in zip(wanted, arrays)}

    def wall_time(self, step: int, mode: ModeKeys | str | None = None, worker: str | None = None) -> float:
        """When the value at `step` was saved: the event's wall_time, seconds since the epoch."""
        _, _, location = self._location(step, mode, worker)
        from .events import decode_tensor_event  # protobuf: only where it is needed

        data = self.trial.store.read_range(location.event_key, location.start, location.length)
        return float(decode_tensor_event(self.trial._payload(data, location)).wall_time)

    def shape(self, step: int, mode: ModeKeys | str | None = None, worker: str | None = None) -> tuple[int, ...]:
        info = self.trial._steps[self.trial._global_step(step, mode)]
        shapes = info.shapes_of(self.name)
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
        for name in self.trial._tensor_names:
            parsed = reductions.parse_reduction_tensor_name(name)
            if parsed and parsed[0] == self.name:
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
        self._steps: dict[int, step_index.StepInfo] = {}
        self._mode_steps: dict[ModeKeys, dict[int, int]] = {}
        self._tensor_names: set[str] = set()
        self._loaded_index_keys: set[str] = set()
        self._loaded_tables: set[str] = set()
        self._collections: CollectionManager | None = None
        self._collection_keys: set[str] = set()  # collections files listed
        self._pending_collections: list[str] = []  # listed, not read yet (see _load_collections)
        self._seen_workers: set[str] = set()  # workers that published a step
        self._listed_tables = False
        self._collection_names: set[str] = set()
        self._num_workers = 1
        self._legacy = True
        self._complete = False
        self._listing_floor: str | None = None
        self._cache: OrderedDict[tuple[str, int, str], np.ndarray] = OrderedDict()
        self._cache_size = cache_size
        self._lock = threading.RLock()
        self._profiler = None
        self._problems: dict[str, str] = {}  # file -> why it was skipped
        self._positions: dict[tuple[str, ...], dict[str, int]] = {}  # shared by steps of one layout
        self._last_layout: tuple[tuple[str, ...], dict[str, int]] = ((), {})  # the last index file's
        self._index_parser = job_files.IndexParser()
        self._decoder = tensor_wire.TensorDecoder()
        self.refresh()

    @property
    def problems(self) -> list[str]:
        """The files this trial could not read and skipped, each with the reason."""
        self._read_collections()  # nothing listed stays unchecked
        return [f"{where}: {why}" for where, why in self._problems.items()]

    def _skip(self, key: str, exc: BaseException, what: str, then: str = "") -> None:
        where = self.store.describe(key)
        reason = exc.reason if isinstance(exc, CorruptRecord) else str(exc)
        if where not in self._problems:
            logger.warning("stepscope: skipping unreadable %s %s: %s%s", what, where, reason, f" ({then})" if then else "")
        self._problems[where] = reason

    # --- loading ----------------------------------------------------------------------

    def refresh(self) -> list[int]:
        """Load what was published since the last call; return the new global steps.

        Opening lists the step tables, reads one collections file (named after a worker
        with tables; without tables, the collections are listed) and lists the index files
        after the last step the tables cover. A refresh lists the index files after the
        first step some worker has not published yet; the collections only while a worker's
        file is missing (see `_load_collections`); the step tables only when a worker has
        more than one new step (a reader that fell behind), reading just the tables that
        cover new steps. So following a job costs in proportion to what is new."""
        with self._lock, job_files.parsing_in_bulk():
            # The end marker is checked before listing: it is written after the last index
            # file, so once it is seen, the listing below is final.
            was_complete, self._complete = self._complete, self.store.exists(layout.END_MARKER)
            workers_before = len(self._seen_workers)
            opening = not self._listed_tables
            if opening:
                new_steps, listed = self._open_step_tables()
            else:
                self._load_collections()
                new_steps, listed = [], None
            self._advance_listing_floor()
            if listed is None:
                listed = self.store.list(layout.INDEX_DIR + "/", start_after=self._listing_floor)
            keys = [k for k in listed if k not in self._loaded_index_keys]
            if not opening:
                wanted = self._uncovered_steps(keys)
                if any(len(steps) > 1 for steps in wanted.values()) or (wanted and self._complete and not was_complete):
                    new_steps += self._load_step_tables(wanted)
            new_steps += self._load_index_files(keys)
            if len(self._seen_workers) > workers_before:
                self._load_collections()  # a worker seen first now: its file says how many there are
            self._advance_listing_floor()
            return sorted(set(new_steps))

    def _load_collections(self, table_workers: Iterable[str] = ()) -> None:
        """Find the workers' collections files and read what opening needs: one of them (it
        says how many workers the job has). The others are read when collections are asked
        for (`collections()`, `collection()`, `module_class()`, `problems`): 64 workers write
        64 nearly identical files. All are read at once when the first does not settle the
        job: missing or unreadable, not written by stepscope (smdebug's), or saying fewer
        workers than there are files.

        Opening a job with step tables (`table_workers`: the workers they name) takes the
        files' names from those workers, without a listing; otherwise, and later while
        some may be missing (fewer known than the job's workers, or a worker publishing
        steps without one), the collections folder is listed."""
        known = self._collection_keys
        named = not known and bool(table_workers)
        if named:
            fresh = [layout.collections_key(w) for w in sorted(table_workers)]
        elif len(known) < self._expected_workers() or any(layout.collections_key(w) not in known for w in self._seen_workers) or not known:
            fresh = [k for k in self.store.list(layout.COLLECTIONS_DIR + "/") if k not in known]
        else:
            fresh = []
        known.update(fresh)
        self._pending_collections += fresh
        if self._pending_collections and self._collections is None:
            self._read_collections(self._pending_collections[:1])
        if self._pending_collections and (self._collections is None or self._legacy or len(known) > self._num_workers):
            if named and self._collections is None:  # the named file is not there: look
                fresh = [k for k in self.store.list(layout.COLLECTIONS_DIR + "/") if k not in known]
                known.update(fresh)
                self._pending_collections += fresh
            self._read_collections()

    def _read_collections(self, keys: list[str] | None = None) -> None:
        """Read `keys` (default: every collections file not read yet) into the collections."""
        with self._lock:
            keys = list(self._pending_collections) if keys is None else keys
            if not keys:
                return
            self._pending_collections = [k for k in self._pending_collections if k not in keys]

            def read(key: str) -> job_files.CollectionsFile | BaseException:
                try:
                    return job_files.parse_collections(self.store.read(key, max_size=job_files.MAX_COLLECTIONS_BYTES), self.store.describe(key))
                except (StepscopeError, OSError) as exc:
                    return exc

            for key, parsed in zip(keys, self._map(read, keys)):  # concurrent on S3: one file per worker
                where = self.store.describe(key)
                if isinstance(parsed, FileNotFoundError):
                    continue
                if isinstance(parsed, BaseException):
                    self._skip(key, parsed, "collections file")
                    continue
                manager = self._collections = self._collections or CollectionManager()
                self._num_workers = max(self._num_workers, parsed.num_workers)
                manager.module_classes.update(parsed.module_classes)
                for scope in parsed.scopes:  # the union over workers, as for tensor names
                    try:
                        manager.scopes[scope.name] = merge_scope(manager.scopes.get(scope.name), scope)
                    except ConfigError as exc:
                        logger.warning("stepscope: skipping a scope in %s: %s", where, exc)
                self._legacy = self._legacy and not parsed.ours
                for body in parsed.collections:
                    try:
                        collection = self._collection_from_job(body, where)
                    except Exception as exc:  # a bad entry must not hide the others
                        logger.warning("stepscope: skipping a collection in %s: %s", where, exc)
                        continue
                    if collection.name in self._collection_names:
                        # Each worker lists the tensors it saw; the trial's collection is their union.
                        manager.get(collection.name).tensor_names |= collection.tensor_names
                    else:
                        manager.add(collection)
                        self._collection_names.add(collection.name)

    @staticmethod
    def _collection_from_job(body: Any, where: str) -> Collection:
        """A collection from a job file, its regexes matched under a time bound (a crafted
        pattern must not hang the reader); a pattern that does not compile is dropped."""
        if not isinstance(body, dict):
            raise ConfigError(f"a collection must be a JSON object, got {type(body).__name__}")
        body = dict(body)
        patterns = body.get("include_regex") or ()
        if isinstance(patterns, str):
            patterns = (patterns,)
        if not isinstance(patterns, (list, tuple)):
            raise ConfigError(f"include_regex must be a list of strings, got {type(patterns).__name__}")
        compiled, kept = [], []
        for pattern in patterns:
            try:
                compiled.append(job_files.compile_untrusted_regex(pattern, f"{where}, collection {body.get('name')!r}"))
                kept.append(pattern)
            except ConfigError as exc:
                logger.warning("stepscope: %s; the pattern is ignored", exc)
        body["include_regex"] = []  # compiled above; Python's engine never sees them
        collection = Collection.from_json(body)
        collection.include_regex = tuple(kept)
        collection._patterns = tuple(compiled)  # type: ignore[arg-type]  # match/search/fullmatch as re.Pattern
        return collection

    def _open_step_tables(self) -> tuple[list[int], list[str] | None]:
        """Opening: load the step tables and, while they are read, list the index files
        after the last step that every worker's tables reach (a guess from the tables' names:
        `<worker>/<first>_<last>.json`). The guess is checked once the tables are read: when
        the steps that every worker published end earlier (a table missing or unreadable,
        a step missing from one), the listing is not used and the caller lists again from
        there. Returns the new steps and the index keys listed (None: not usable)."""
        table_keys = self.store.list(layout.STEP_TABLE_DIR + "/")
        self._load_collections(span[0] for span in map(step_index.table_span, table_keys) if span is not None)
        guess = step_index.tables_floor(table_keys)
        if guess is None:
            return self._load_step_tables(listed=table_keys), None
        with ThreadPoolExecutor(max_workers=1) as pool:
            listing = pool.submit(self.store.list, layout.INDEX_DIR + "/", step_index.index_floor_key(guess))
            new_steps = self._load_step_tables(listed=table_keys)
            floor = self._floor_step()
            if floor is None or floor < guess:
                return new_steps, None  # listed from too late; the pool waits it out
            return new_steps, listing.result()

    def _load_step_tables(self, wanted: Mapping[str, list[int]] | None = None, listed: list[str] | None = None) -> list[int]:
        """Load the step tables our writer publishes (see Writer): one read per 1,000 steps
        instead of one per step. Steps they cover are not read from index files again.
        With `wanted` (a refresh's new index files: worker -> steps), only the tables that
        cover one of those steps are read; the others hold nothing new. `listed`: the
        tables' keys, when already listed."""
        self._listed_tables = True
        if listed is None:
            listed = self.store.list(layout.STEP_TABLE_DIR + "/")
        keys = [k for k in listed if k not in self._loaded_tables]
        if wanted is not None:
            keys = [k for k in keys if step_index.table_covers(k, wanted)]
        new_steps: list[int] = []
        for key, parsed in zip(keys, self._map(self._read_table, keys)):
            self._loaded_tables.add(key)
            if parsed is not None:
                new_steps += self._add_table(parsed)
        return new_steps

    def _uncovered_steps(self, index_keys: list[str]) -> dict[str, list[int]]:
        """worker -> steps of the index files in `index_keys` that no step table covers."""
        found: dict[str, list[int]] = {}
        for key in index_keys:
            parsed = layout.parse_index_key(key)
            if parsed is not None and not self._covered_by_table(*parsed):
                found.setdefault(parsed[1], []).append(parsed[0])
        return found

    def _add_table(self, table: job_files.StepTable) -> list[int]:
        """Register the steps of one worker's table; the steps that are new to that worker."""
        # The hot loop of opening a long job (one pass per step and worker), so it only
        # links each step to the table; a step's tensor locations are made when it is read.
        loaded = step_index.TableSteps(table, [self._positions_of(names) for names in table.layouts])
        worker, all_steps, mode_steps = table.worker, self._steps, self._mode_steps
        self._seen_workers.add(worker)
        new_steps = []
        for step, row in table.rows.items():
            info = all_steps.get(step)
            if info is None:
                info = all_steps[step] = step_index.StepInfo(step, row[0], row[1])
                mode_steps.setdefault(row[0], {})[row[1]] = step
            elif worker in info.tables or worker in info.index_keys:
                continue  # already known: from its index file (the source of truth) or an earlier table
            info.tables[worker] = loaded
            if step in table.event_keys:  # (a batch of steps in one event file: Writer.write_steps)
                info.event_keys[worker] = table.event_keys[step]
            new_steps.append(step)
        if new_steps:
            self._tensor_names.update(*loaded.positions)
            self._tensor_names.update(table.shape_names)
        return new_steps

    def _positions_of(self, names: tuple[str, ...]) -> dict[str, int]:
        """name -> position in a layout, one map shared by every table with that layout."""
        positions = self._positions.get(names)
        if positions is None:
            positions = self._positions[names] = {name: i for i, name in enumerate(names)}
        return positions

    def _read_table(self, key: str) -> job_files.StepTable | None:
        folder_worker = key[len(layout.STEP_TABLE_DIR) + 1 :].split("/", 1)[0]
        try:
            return job_files.parse_step_table(self.store.read(key, max_size=job_files.MAX_TABLE_BYTES), self.store.describe(key), folder_worker)
        except FileNotFoundError:
            return None
        except (StepscopeError, OSError) as exc:
            # The per-step index files hold the same facts; the reader falls back to them.
            self._skip(key, exc, "step table", "the index files are read instead")
            return None

    def _load_index_files(self, keys: list[str]) -> list[int]:
        candidates = [(k, layout.parse_index_key(k)) for k in keys]
        parsed: list[tuple[str, tuple[int, str]]] = [(k, p) for k, p in candidates if p is not None and not self._covered_by_table(*p)]
        if not parsed:
            return []
        reads = self._map(lambda kp: self._read_index(kp[0]), parsed)
        new_steps = []
        for (key, (step, worker)), index in zip(parsed, reads):
            self._loaded_index_keys.add(key)
            if index is None:
                continue
            if self._covered_by_table(step, worker):
                continue  # a step table covered it (and loses to it only on a bad read)
            self._add_index(step, worker, key, index)
            new_steps.append(step)
        return new_steps

    def _covered_by_table(self, step: int, worker: str) -> bool:
        info = self._steps.get(step)
        return info is not None and worker in info.tables

    def _index_key(self, info: step_index.StepInfo, step: int, worker: str) -> str:
        return info.index_keys.get(worker) or layout.index_file_key(step, worker)

    def _map(self, fn, items: list) -> list:
        if self.store.concurrent_reads and len(items) > 1:
            with ThreadPoolExecutor(max_workers=16) as pool:
                return list(pool.map(fn, items))
        return [fn(item) for item in items]

    def _read_index(self, key: str) -> job_files.IndexEntry | None:
        """Parse one index file; a malformed one is skipped with a warning naming it."""
        try:
            return self._index_parser.parse(self.store.read(key, max_size=job_files.MAX_INDEX_BYTES), self.store.describe(key))
        except FileNotFoundError:
            return None
        except (StepscopeError, OSError) as exc:
            self._skip(key, exc, "index file")
            return None

    def _add_index(self, step: int, worker: str, key: str, entry: job_files.IndexEntry) -> None:
        mode, mode_step = entry.mode, entry.mode_step
        if mode_step < 0:
            mode_step = step
        info = self._steps.get(step)
        if info is None:
            info = self._steps[step] = step_index.StepInfo(step, mode, mode_step)
            self._mode_steps.setdefault(mode, {})[mode_step] = step
        # Steps of one layout share one name -> position map (as a step table's rows do).
        # Most steps repeat the step before's layout: comparing with it costs less than
        # hashing the names (new strings each file) to look the layout up.
        last_names, positions = self._last_layout
        if entry.names != last_names:
            known = self._positions.get(entry.names)
            if known is None:
                known = self._positions[entry.names] = {name: i for i, name in enumerate(entry.names)}
                self._tensor_names.update(known)
            positions = known
            self._last_layout = (entry.names, positions)
        payload = step_index.Entries(positions, entry.starts, entry.lengths)
        self._seen_workers.add(worker)
        info.tables.pop(worker, None)  # the index file replaces what a step table said
        info.index_keys[worker] = key
        if entry.event_key:  # else the default name, made when a value is read
            info.event_keys[worker] = entry.event_key
        else:
            info.event_keys.pop(worker, None)
        info.payload[worker] = payload
        if entry.shapes:
            info.shapes[worker] = dict(entry.shapes)
        else:
            info.shapes.pop(worker, None)
        if entry.shapes:
            self._tensor_names.update(entry.shapes)

    def _reload_from_index(self, step: int, worker: str) -> bool:
        """Replace what a step table said about (step, worker) by its index file, the source
        of truth; True when the index file was read."""
        info = self._steps.get(step)
        if info is None or worker not in info.tables:
            return False
        key = self._index_key(info, step, worker)
        entry = self._read_index(key)
        if entry is None:
            return False
        with self._lock:
            self._add_index(step, worker, key, entry)
            self._cache = OrderedDict((k, v) for k, v in self._cache.items() if k[1] != step or k[2] != worker)
        return True

    def _advance_listing_floor(self) -> None:
        """Relist from the first step some worker has not published yet: workers publish
        independently, so a key can appear below the last one seen."""
        floor = self._floor_step()
        self._listing_floor = None if floor is None else step_index.index_floor_key(floor)

    def _floor_step(self) -> int | None:
        """The last step of the run of steps, from the first, that every worker published."""
        expected = self._expected_workers()
        floor = None
        for step in sorted(self._steps):
            if self._steps[step].worker_count() < expected:
                break
            floor = step
        return floor

    def _expected_workers(self) -> int:
        return max(self._num_workers, 1)

    # --- reading values ---------------------------------------------------------------

    def _payload(self, record: bytes, location: _Location) -> memoryview:
        """The payload of one record read at `location`, its CRCs checked."""
        return memoryview(record)[slice(*self._payload_bounds(record, location))]

    def _payload_bounds(self, record: bytes, location: _Location) -> tuple[int, int]:
        if len(record) < location.length:
            raise CorruptRecord(self.store.describe(location.event_key), location.start, f"truncated file: record needs {location.length} bytes, {len(record)} present")
        try:
            return records.payload_bounds(record, 0, allow_placeholder_crc=self._legacy)
        except CorruptRecord as exc:  # re-raised with the file's name and the record's offset
            raise CorruptRecord(self.store.describe(location.event_key), location.start, exc.reason) from None

    def _decode(self, record: bytes, location: _Location, name: str) -> np.ndarray:
        start, end = self._payload_bounds(record, location)
        try:
            decoded = self._decoder.decode(record, start, end, name)  # the plain layout, without protobuf
            if decoded is None:
                from .events import decode_tensor_tag_value  # any other: protobuf says what is wrong

                decoded = decode_tensor_tag_value(memoryview(record)[start:end])
            tag, array = decoded
        except Exception as exc:
            raise CorruptRecord(self.store.describe(location.event_key), location.start, f"cannot decode the event: {exc}") from None
        if tag != name and tag:
            raise CorruptRecord(self.store.describe(location.event_key), location.start, f"the record there holds {tag!r}, not {name!r}")
        return array

    def _read_values(self, wanted: list[tuple[str, int, str, _Location]]) -> list[np.ndarray]:
        results: list[np.ndarray | None] = []
        missing = []
        for i, (name, step, worker, _location) in enumerate(wanted):
            cached = self._cache.get((name, step, worker))
            results.append(cached)
            if cached is None:
                missing.append(i)
        if missing:
            raw: list[bytes | None]
            try:
                raw = list(self.store.read_ranges([(wanted[i][3].event_key, wanted[i][3].start, wanted[i][3].length) for i in missing]))
            except FileNotFoundError as exc:
                raw = [None] * len(missing)
                if not any(wanted[i][2] in self._steps[wanted[i][1]].tables for i in missing if wanted[i][1] in self._steps):
                    raise CorruptRecord(str(exc), None, "event file listed in the index is missing") from None
            for i, data in zip(missing, raw):
                name, step, worker, location = wanted[i]
                try:
                    if data is None:
                        raise CorruptRecord(self.store.describe(location.event_key), None, "event file listed in the step table is missing")
                    array = self._decode(data, location, name)
                except CorruptRecord:
                    # A step table that disagrees with the event file loses to the index file.
                    if not self._reload_from_index(step, worker):
                        raise
                    recovered = Tensor(self, name).value(step, worker=worker) if self._steps[step].has(name) else None
                    if recovered is None:
                        raise
                    array = recovered
                results[i] = array
                self._remember((name, step, worker), array)
        return results  # type: ignore[return-value]

    def read_many(self, requests: Iterable[tuple[str, int, ModeKeys | str | None, str | None]]) -> list[np.ndarray | None]:
        """Values of several (tensor, step, mode, worker) at once, as one batch of ranged reads
        (concurrent on S3); None where a value is not available. Readers that need many
        tensors per step (rules) use this instead of one `value()` call per tensor."""
        requests = list(requests)
        out: list[np.ndarray | None] = [None] * len(requests)
        wanted, slots = [], []
        for i, (name, step, mode, worker) in enumerate(requests):
            if name not in self._tensor_names:
                continue
            try:
                global_step, chosen, location = Tensor(self, name)._location(step, mode, worker)
            except (StepUnavailable, StepNotYetAvailable, TensorUnavailableForStep):
                continue
            wanted.append((name, global_step, chosen, location))
            slots.append(i)
        for i, array in zip(slots, self._read_values(wanted) if wanted else []):
            out[i] = array
        return out

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
            if not show_incomplete and info.worker_count() < expected and not self._complete:
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
        found: set[str] = set()
        for info in self._steps.values():
            found.update(info.index_keys)
            found.update(info.tables)
        return sorted(found)

    @property
    def num_workers(self) -> int:
        return self._expected_workers()

    def collections(self) -> dict[str, Collection]:
        self._read_collections()
        return {c.name: c for c in self._collections} if self._collections else {}

    def module_class(self, tensor_name: str) -> str | None:
        """The class of the module (layer) `tensor_name` is an input or output of, as the
        hook recorded it (e.g. "ReLU"); None when not recorded (older jobs, custom tensors)."""
        self._read_collections()
        return self._collections.module_classes.get(tensor_name) if self._collections else None

    def scopes(self) -> list[Scope]:
        """The networks and optimizers the hook declared (`HookBase.declare_scope`); empty
        for a job that declared none (it is then judged as one scope, the whole job)."""
        if self._collections is None:  # a job without steps yet: its collections were not looked for
            self._load_collections()
        self._read_collections()
        return list(self._collections.scopes.values()) if self._collections else []

    def scope_map(self) -> ScopeMap:
        """Tensor name -> scope(s): `scope_map().group_of(name)` is the scope rules compare
        the tensor within; `scopes_of(name)` every scope that lists its parameter."""
        return ScopeMap(self.scopes())

    def collection(self, name: str) -> Collection:
        collections = self.collections()
        if name not in collections:
            raise UnknownName(f"no collection {name!r} in this trial; known: {', '.join(sorted(collections))}")
        return collections[name]

    def status(self) -> dict[str, dict[str, Any]]:
        """The health the workers' hooks reported (`stepscope-status/<worker>.json`), by
        worker: a hook that failed and switched itself off says so here ("state": "failed",
        "component", "error", "traceback", "time", "host", "pid"). Empty: nothing reported."""
        return self.status_in(self.store)

    @staticmethod
    def status_in(store: Store) -> dict[str, dict[str, Any]]:
        """`status()` of the job in `store`, without opening a trial."""
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

    def failed_workers(self) -> dict[str, str]:
        """Workers whose hook (or profiler side) failed: worker -> "component: error"."""
        return self.failed_workers_in(self.store)

    @classmethod
    def failed_workers_in(cls, store: Store) -> dict[str, str]:
        return {
            worker: f"{body.get('component', '?')}: {body.get('error', '?')}"
            for worker, body in cls.status_in(store).items()
            # degraded: some tensors skipped, the hook runs on; too little data: saved fewer
            # steps than the default rules need (stepscope.capture.evidence), nothing failed.
            if body.get("state") not in ("ok", "degraded", "too little data")
        }

    def tensor_names(self, regex: str | Iterable[str] | None = None, collection: str | Collection | None = None, step: int | None = None, mode: ModeKeys | str | None = None) -> list[str]:
        names = set(self._tensor_names)
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
        if name not in self._tensor_names:
            raise TensorUnavailable(name)
        return Tensor(self, name)

    def has_tensor(self, name: str) -> bool:
        return name in self._tensor_names

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
        return f"Trial({self.path!r}, steps={len(self._steps)}, tensors={len(self._tensor_names)}, complete={self._complete})"


def create_trial(path: str | Store, name: str | None = None, **kwargs: Any) -> Trial:
    """Open the job at a local path or s3:// URL. A local path that does not exist raises
    FileNotFoundError (a mistyped path is not an empty job); an s3:// prefix may be empty
    (a job that has not written yet)."""
    return Trial(path, name=name, **kwargs)
