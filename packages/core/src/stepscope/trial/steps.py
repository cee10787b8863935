"""A trial's catalogue of what the job published: its steps (global and per mode), which
workers published each and where their tensors sit, and every tensor name, loaded from the
step tables our writer publishes and the per-step index files (smdebug's and ours), and
brought up to date by `refresh` at a cost in proportion to what is new."""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import NoReturn

from .. import job_files, layout, step_index
from ..exceptions import CorruptRecord, StepNotYetAvailable, StepscopeError, StepUnavailable
from ..modes import ModeKeys
from ..store import Store
from .collections import JobCollections
from .files import Problems, read_all


class StepCatalog:
    """Steps, mode steps, workers and tensor names of one job, as far as it is loaded."""

    def __init__(self, store: Store, collections: JobCollections, problems: Problems, lock: threading.RLock):
        self._store, self._collections, self._problems, self._lock = store, collections, problems, lock
        self.steps: dict[int, step_index.StepInfo] = {}
        self.mode_steps: dict[ModeKeys, dict[int, int]] = {}
        self.tensor_names: set[str] = set()
        self.seen_workers: set[str] = set()  # workers that published a step
        self.complete = False  # the end marker was seen
        self._loaded_index_keys: set[str] = set()
        self._loaded_tables: set[str] = set()
        self._unread_held: set[str] = set()  # held tables an index file named that could not be read
        self._bad_tables: set[str] = set()  # tables read that are malformed (not read again)
        self._listed_tables = False
        self._listing_floor: str | None = None
        self._positions: dict[tuple[str, ...], dict[str, int]] = {}  # shared by steps of one layout
        self._last_layout: tuple[tuple[str, ...], dict[str, int]] = ((), {})  # the last index file's
        self._index_parser = job_files.IndexParser()

    # --- loading ----------------------------------------------------------------------

    def refresh(self) -> list[int]:
        """Load what was published since the last call; return the new global steps.

        Opening lists the step tables, reads one collections file (named after a worker
        with tables; without tables, the collections are listed) and lists the index files
        after the last step the tables cover. A refresh lists the index files after the
        first step some worker has not published yet; the collections only while a worker's
        file is missing (see `JobCollections.load`); the step tables only when a worker has
        more than one new step (a reader that fell behind), reading just the tables that
        cover new steps. So following a job costs in proportion to what is new."""
        with self._lock, job_files.parsing_in_bulk():
            # The end marker is checked before listing: it is written after the last index
            # file, so once it is seen, the listing below is final.
            was_complete, self.complete = self.complete, self._store.exists(layout.END_MARKER)
            workers_before = len(self.seen_workers)
            opening = not self._listed_tables
            if opening:
                new_steps, listed = self._open_step_tables()
            else:
                self._collections.load(self.seen_workers)
                new_steps, listed = [], None
            self._advance_listing_floor()
            if listed is None:
                listed = self._store.list(layout.INDEX_DIR + "/", start_after=self._listing_floor)
            keys = [k for k in listed if k not in self._loaded_index_keys]
            if not opening:
                wanted = self._uncovered_steps(keys)
                if any(len(steps) > 1 for steps in wanted.values()) or (wanted and self.complete and not was_complete):
                    new_steps += self._load_step_tables(wanted)
            new_steps += self._load_index_files(keys)
            if len(self.seen_workers) > workers_before:
                self._collections.load(self.seen_workers)  # a worker seen first now: its file says how many there are
            self._advance_listing_floor()
            return sorted(set(new_steps))

    def _open_step_tables(self) -> tuple[list[int], list[str] | None]:
        """Opening: load the step tables and, while they are read, list the index files
        after the last step that every worker's tables reach (a guess from the tables' names:
        `<worker>/<first>_<last>.json`). The guess is checked once the tables are read: when
        the steps that every worker published end earlier (a table missing or unreadable,
        a step missing from one), the listing is not used and the caller lists again from
        there. Returns the new steps and the index keys listed (None: not usable)."""
        table_keys = self._store.list(layout.STEP_TABLE_DIR + "/")
        self._collections.load(self.seen_workers, (span[0] for span in map(step_index.table_span, table_keys) if span is not None))
        guess = step_index.tables_floor(table_keys)
        if guess is None:
            return self._load_step_tables(listed=table_keys), None
        with ThreadPoolExecutor(max_workers=1) as pool:
            listing = pool.submit(self._store.list, layout.INDEX_DIR + "/", step_index.index_floor_key(guess))
            new_steps = self._load_step_tables(listed=table_keys)
            floor = self.floor_step()
            if floor is None or floor < guess:
                return new_steps, None  # listed from too late; the pool waits it out
            return new_steps, listing.result()

    def _load_step_tables(self, wanted: Mapping[str, list[int]] | None = None, listed: list[str] | None = None, held: bool = False) -> list[int]:
        """Load the step tables our writer publishes (see Writer): one read per 1,000 steps
        instead of one per step. Steps they cover are not read from index files again.
        With `wanted` (a refresh's new index files: worker -> steps), only the tables that
        cover one of those steps are read; the others hold nothing new. `listed`: the
        tables' keys, when already listed. A held table (layout.held_table_key) is read
        only where an index file named it (`held`): its steps are then the listing's, in
        order, while a held table found by listing the tables may be newer than the index
        files listed before it, and the listing floor would pass the steps between."""
        self._listed_tables = True
        if listed is None:
            listed = self._store.list(layout.STEP_TABLE_DIR + "/")
        keys = [k for k in listed if k not in self._loaded_tables and held == k.endswith(layout.HELD_TABLE_SUFFIX)]
        if wanted is not None:
            keys = [k for k in keys if step_index.table_covers(k, wanted)]
        new_steps: list[int] = []
        for key, parsed in zip(keys, read_all(self._store, self._read_table, keys)):
            if parsed is None and held and key not in self._bad_tables:
                # No index file holds these steps: read it again at the next refresh (the
                # store failed to answer; a table that is not one is not read again).
                self._unread_held.add(key)
                continue
            self._loaded_tables.add(key)
            self._unread_held.discard(key)
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
        worker, all_steps, mode_steps = table.worker, self.steps, self.mode_steps
        self.seen_workers.add(worker)
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
            self.tensor_names.update(*loaded.positions)
            self.tensor_names.update(table.shape_names)
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
            return job_files.parse_step_table(self._store.read(key, max_size=job_files.MAX_TABLE_BYTES), self._store.describe(key), folder_worker)
        except FileNotFoundError:
            return None
        except (StepscopeError, OSError) as exc:
            if isinstance(exc, CorruptRecord):
                self._bad_tables.add(key)
            # A block's index files hold the same facts, and the reader falls back to them; a
            # held batch's steps have no index files but the last one's.
            held = key.endswith(layout.HELD_TABLE_SUFFIX)
            self._problems.skip(key, exc, "step table", "its steps before the last are not read" if held else "the index files are read instead")
            return None

    def _load_index_files(self, keys: list[str]) -> list[int]:
        candidates = [(k, layout.parse_index_key(k)) for k in keys]
        parsed: list[tuple[str, tuple[int, str]]] = [(k, p) for k, p in candidates if p is not None and not self._covered_by_table(*p)]
        if not parsed and not self._unread_held:
            return []
        reads = read_all(self._store, lambda kp: self._read_index(kp[0]), parsed)
        new_steps = []
        held_tables = []
        for (key, (step, worker)), index in zip(parsed, reads):
            self._loaded_index_keys.add(key)
            if index is None:
                continue
            if self._covered_by_table(step, worker):
                continue  # a step table covered it (and loses to it only on a bad read)
            self._add_index(step, worker, key, index)
            new_steps.append(step)
            if index.step_table and index.step_table not in self._loaded_tables:
                held_tables.append(self._held_table_of(key, worker, index.step_table))
        held = {t for t in held_tables if t} | self._unread_held
        if held:
            # The steps of the held batches these index files end (Writer._publish_held):
            # one read per batch, no listing.
            new_steps += self._load_step_tables(listed=sorted(held), held=True)
        return new_steps

    def _held_table_of(self, key: str, worker: str, table: str) -> str:
        """The held table that index file `key` of `worker` names, or "" (with a problem
        reported) where it names another worker's table."""
        if table.rpartition("/")[0] == f"{layout.STEP_TABLE_DIR}/{worker}":
            return table
        self._problems.skip(key, StepscopeError(f"its step_table {table!r} is not one of {worker}'s"), "step table reference", "the steps before it in its batch are not read")
        return ""

    def _covered_by_table(self, step: int, worker: str) -> bool:
        info = self.steps.get(step)
        return info is not None and worker in info.tables

    def index_key(self, info: step_index.StepInfo, step: int, worker: str) -> str:
        return info.index_keys.get(worker) or layout.index_file_key(step, worker)

    def _read_index(self, key: str) -> job_files.IndexEntry | None:
        """Parse one index file; a malformed one is skipped with a warning naming it."""
        try:
            return self._index_parser.parse(self._store.read(key, max_size=job_files.MAX_INDEX_BYTES), self._store.describe(key))
        except FileNotFoundError:
            return None
        except (StepscopeError, OSError) as exc:
            self._problems.skip(key, exc, "index file")
            return None

    def _add_index(self, step: int, worker: str, key: str, entry: job_files.IndexEntry) -> None:
        mode, mode_step = entry.mode, entry.mode_step
        if mode_step < 0:
            mode_step = step
        info = self.steps.get(step)
        if info is None:
            info = self.steps[step] = step_index.StepInfo(step, mode, mode_step)
            self.mode_steps.setdefault(mode, {})[mode_step] = step
        # Steps of one layout share one name -> position map (as a step table's rows do).
        # Most steps repeat the step before's layout: comparing with it costs less than
        # hashing the names (new strings each file) to look the layout up.
        last_names, positions = self._last_layout
        if entry.names != last_names:
            known = self._positions.get(entry.names)
            if known is None:
                known = self._positions[entry.names] = {name: i for i, name in enumerate(entry.names)}
                self.tensor_names.update(known)
            positions = known
            self._last_layout = (entry.names, positions)
        payload = step_index.Entries(positions, entry.starts, entry.lengths)
        self.seen_workers.add(worker)
        info.tables.pop(worker, None)  # the index file replaces what a step table said
        info.index_keys[worker] = key
        if entry.event_key:  # else the default name, made when a value is read
            info.event_keys[worker] = entry.event_key
        else:
            info.event_keys.pop(worker, None)
        info.payload[worker] = payload
        if entry.shapes:
            info.shapes[worker] = dict(entry.shapes)
            self.tensor_names.update(entry.shapes)
        else:
            info.shapes.pop(worker, None)

    def reload_from_index(self, step: int, worker: str) -> bool:
        """Replace what a step table said about (step, worker) by its index file, the source
        of truth; True when the index file was read."""
        info = self.steps.get(step)
        if info is None or worker not in info.tables:
            return False
        key = self.index_key(info, step, worker)
        entry = self._read_index(key)
        if entry is None:
            return False
        with self._lock:
            self._add_index(step, worker, key, entry)
        return True

    def _advance_listing_floor(self) -> None:
        """Relist from the first step some worker has not published yet: workers publish
        independently, so a key can appear below the last one seen."""
        floor = self.floor_step()
        self._listing_floor = None if floor is None else step_index.index_floor_key(floor)

    def floor_step(self) -> int | None:
        """The last step of the run of steps, from the first, that every worker published."""
        expected = self._collections.expected_workers
        floor = None
        for step in sorted(self.steps):
            if self.steps[step].worker_count() < expected:
                break
            floor = step
        return floor

    # --- steps and modes --------------------------------------------------------------

    def global_step(self, step: int, mode: ModeKeys | str | None) -> int:
        """The global step of `step` (a mode step of `mode` when given); StepUnavailable
        once the job ended without it, StepNotYetAvailable before."""
        if mode is None:
            if step in self.steps:
                return step
        else:
            mode = ModeKeys.parse(mode)
            global_step = self.mode_steps.get(mode, {}).get(step)
            if global_step is not None:
                return global_step
        self.raise_missing(step, mode)

    def raise_missing(self, step: int, mode: ModeKeys | None = None) -> NoReturn:
        if self.complete:
            raise StepUnavailable(step, mode)
        raise StepNotYetAvailable(step, mode)

    def filter_steps(self, global_steps: Iterable[int], mode: ModeKeys | str | None, show_incomplete: bool) -> list[int]:
        """Of `global_steps`, those every worker published (all, with `show_incomplete` or
        once the job ended), as global steps or, with `mode`, as that mode's steps."""
        expected = self._collections.expected_workers
        wanted: ModeKeys | None = None  # `mode` parsed at the first step (no step: never)
        out = []
        for step in global_steps:
            info = self.steps.get(step)
            if info is None:
                continue
            if not show_incomplete and info.worker_count() < expected and not self.complete:
                continue
            if mode is None:
                out.append(step)
                continue
            if wanted is None:
                wanted = ModeKeys.parse(mode)
            if info.mode == wanted:
                out.append(info.mode_step)
        return sorted(out)

    def workers(self) -> list[str]:
        found: set[str] = set()
        for info in self.steps.values():
            found.update(info.index_keys)
            found.update(info.tables)
        return sorted(found)
