"""A trial's view of the job's collections files: how many workers the job has, whether
stepscope wrote it (real payload CRCs) or smdebug, and the collections, module classes and
scopes the workers' hooks declared, as one union over the workers."""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable
from typing import Any

from .. import job_files, layout
from ..capture.collection_manager import CollectionManager
from ..capture.scopes import Scope, merge_scope
from ..config import Collection
from ..exceptions import ConfigError, StepscopeError
from ..store import Store
from .files import Problems, read_all

logger = logging.getLogger("stepscope")


class JobCollections:
    """The collections files of one job, found and read as the trial needs them (see
    `load`). `num_workers` and `legacy` settle once the first file is read."""

    def __init__(self, store: Store, problems: Problems, lock: threading.RLock):
        self._store, self._problems, self._lock = store, problems, lock
        self.manager: CollectionManager | None = None  # None: no file read yet
        self.num_workers = 1
        self.legacy = True  # until a file says stepscope wrote the job (smdebug's placeholder CRCs)
        self._keys: set[str] = set()  # collections files listed
        self._pending: list[str] = []  # listed, not read yet
        self._names: set[str] = set()

    @property
    def expected_workers(self) -> int:
        return max(self.num_workers, 1)

    def load(self, seen_workers: set[str], table_workers: Iterable[str] = ()) -> None:
        """Find the workers' collections files and read what opening needs: one of them (it
        says how many workers the job has). The others are read when collections are asked
        for (`read`, called by `collections()`, `collection()`, `module_class()`,
        `problems`): 64 workers write 64 nearly identical files. All are read at once when
        the first does not settle the job: missing or unreadable, not written by stepscope
        (smdebug's), or saying fewer workers than there are files.

        Opening a job with step tables (`table_workers`: the workers they name) takes the
        files' names from those workers, without a listing; otherwise, and later while
        some may be missing (fewer known than the job's workers, or a worker in
        `seen_workers` publishing steps without one), the collections folder is listed."""
        known = self._keys
        named = not known and bool(table_workers)
        if named:
            fresh = [layout.collections_key(w) for w in sorted(table_workers)]
        elif len(known) < self.expected_workers or any(layout.collections_key(w) not in known for w in seen_workers) or not known:
            fresh = [k for k in self._store.list(layout.COLLECTIONS_DIR + "/") if k not in known]
        else:
            fresh = []
        known.update(fresh)
        self._pending += fresh
        if self._pending and self.manager is None:
            self.read(self._pending[:1])
        if self._pending and (self.manager is None or self.legacy or len(known) > self.num_workers):
            if named and self.manager is None:  # the named file is not there: look
                fresh = [k for k in self._store.list(layout.COLLECTIONS_DIR + "/") if k not in known]
                known.update(fresh)
                self._pending += fresh
            self.read()

    def read(self, keys: list[str] | None = None) -> None:
        """Read `keys` (default: every collections file not read yet) into the collections."""
        with self._lock:
            keys = list(self._pending) if keys is None else keys
            if not keys:
                return
            self._pending = [k for k in self._pending if k not in keys]

            def parse(key: str) -> job_files.CollectionsFile | BaseException:
                try:
                    return job_files.parse_collections(self._store.read(key, max_size=job_files.MAX_COLLECTIONS_BYTES), self._store.describe(key))
                except (StepscopeError, OSError) as exc:
                    return exc

            for key, parsed in zip(keys, read_all(self._store, parse, keys)):  # concurrent on S3: one file per worker
                if isinstance(parsed, FileNotFoundError):
                    continue
                if isinstance(parsed, BaseException):
                    self._problems.skip(key, parsed, "collections file")
                    continue
                self._add(parsed, self._store.describe(key))

    def _add(self, parsed: job_files.CollectionsFile, where: str) -> None:
        manager = self.manager = self.manager or CollectionManager()
        self.num_workers = max(self.num_workers, parsed.num_workers)
        manager.module_classes.update(parsed.module_classes)
        for scope in parsed.scopes:  # the union over workers, as for tensor names
            try:
                manager.scopes[scope.name] = merge_scope(manager.scopes.get(scope.name), scope)
            except ConfigError as exc:
                logger.warning("stepscope: skipping a scope in %s: %s", where, exc)
        self.legacy = self.legacy and not parsed.ours
        for body in parsed.collections:
            try:
                collection = collection_from_job(body, where)
            except Exception as exc:  # a bad entry must not hide the others
                logger.warning("stepscope: skipping a collection in %s: %s", where, exc)
                continue
            if collection.name in self._names:
                # Each worker lists the tensors it saw; the trial's collection is their union.
                manager.get(collection.name).tensor_names |= collection.tensor_names
            else:
                manager.add(collection)
                self._names.add(collection.name)

    def collections(self) -> dict[str, Collection]:
        self.read()
        return {c.name: c for c in self.manager} if self.manager else {}

    def module_class(self, tensor_name: str) -> str | None:
        self.read()
        return self.manager.module_classes.get(tensor_name) if self.manager else None

    def scopes(self, seen_workers: set[str]) -> list[Scope]:
        if self.manager is None:  # a job without steps yet: its collections were not looked for
            self.load(seen_workers)
        self.read()
        return list(self.manager.scopes.values()) if self.manager else []


def collection_from_job(body: Any, where: str) -> Collection:
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
