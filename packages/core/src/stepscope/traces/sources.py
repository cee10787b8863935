"""Where a trace analysis reads its traces and keeps its tables: a job (traces under
`profiler-output/framework/`), any folder of Kineto / XSpace traces (the output of
torch.profiler.tensorboard_trace_handler, a folder of rank files, nested), or one trace
file, local or on S3. The tables go beside the traces when that folder is writable, else
to a user cache folder, so a read-only folder of traces still opens."""

from __future__ import annotations

import hashlib
import logging
import os
import re
from pathlib import Path

from ..store import Store, open_store
from .tables import _TRACE_SUFFIXES, TABLE_DIR

logger = logging.getLogger("stepscope.traces")

# tensorboard_trace_handler names a file `<worker>.<timestamp ms>.pt.trace.json[.gz]`, the
# worker being `<host>_<pid>` unless the user names it: one worker is one process.
_WORKER = re.compile(r"^([^.]+)\.")


def is_trace_file(name: str) -> bool:
    """Whether a file name is one the trace engine reads (.json, .json.gz, .xplane.pb)."""
    return name.endswith(_TRACE_SUFFIXES)


def locate(path: str | os.PathLike[str]) -> tuple[Store, list[str] | None]:
    """The store to read and, for a single trace file, its one key (None: a folder, whose
    traces the analysis lists itself)."""
    text = os.fspath(path)
    if text.startswith("s3://"):
        if is_trace_file(text.rstrip("/")) and not text.endswith("/"):
            parent, _, name = text.rstrip("/").rpartition("/")
            return open_store(parent), [name]
        return open_store(text), None
    if text.startswith("file://"):
        text = text[len("file://") :]
    local = Path(text).expanduser()
    if local.is_file():
        return open_store(str(local.parent)), [local.name]
    return open_store(text), None


def worker_ranks(keys: list[str]) -> dict[str, int]:
    """A rank for each trace whose content and path name none: the order of its worker
    (the file name up to its first dot: `<host>_<pid>` for tensorboard_trace_handler) among
    the traces' workers, so the windows of one process share one rank."""
    workers = sorted({_worker(key) for key in keys})
    order = {worker: rank for rank, worker in enumerate(workers)}
    return {key: order[_worker(key)] for key in keys}


def _worker(key: str) -> str:
    folder, _, name = key.rpartition("/")
    match = _WORKER.match(name)
    return f"{folder}/{match.group(1) if match else name}"


def table_store(store: Store) -> Store:
    """Where the tables of `store`'s traces go: the store itself (under stepscope-traces/)
    when it can be written, else a folder of the user's cache named after the store."""
    root = store.local_path()
    if root is None:
        return store  # S3: beside the traces, as for a job; a failed write is only logged
    try:
        # Through the store: its path policy refuses a linked stepscope-traces/ (the
        # tables then go to the cache), where a plain mkdir/open would write through it.
        probe = f"{TABLE_DIR}/.write-probe-{os.getpid()}"
        store.write(probe, b"")
        store.delete(probe)
        return store
    except OSError as exc:
        cache = user_cache_dir() / "traces" / hashlib.sha1(os.path.realpath(root).encode()).hexdigest()[:16]
        logger.info("%s is not writable (%s); trace tables go to %s", store.describe(TABLE_DIR), exc.strerror or exc, cache)
        cache.mkdir(parents=True, exist_ok=True)
        return open_store(str(cache))


def user_cache_dir() -> Path:
    """$STEPSCOPE_CACHE_DIR, else $XDG_CACHE_HOME/stepscope, else ~/.cache/stepscope."""
    explicit = os.environ.get("STEPSCOPE_CACHE_DIR")
    if explicit:
        return Path(explicit).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "stepscope"
