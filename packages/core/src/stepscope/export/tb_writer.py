"""Writing TensorBoard event files: what to log (scalar and histogram summaries built from
numpy values), how to frame it (our TFRecord framing in `records`) and where (one
`events.out.tfevents.*` file per run folder). Used by `stepscope export --tensorboard`
and by the hooks' `tensorboard_dir=` option."""

from __future__ import annotations

import contextlib
import functools
import math
import os
import socket
import threading
import time
from typing import Any

import numpy as np

from ..events import Event, HistogramProto, Summary, file_version_event
from ..exceptions import ConfigError, OutputError
from ..records import frame_bytes

DEFAULT_BINS = 30


def histogram_proto(values: Any, bins: int = DEFAULT_BINS) -> Any | None:
    """A HistogramProto of the finite values of `values` (`bins` equal-width buckets between
    their min and max), or None when there are none. TensorBoard takes the first bucket's
    left edge from `min`, so `bucket_limit` holds right edges only."""
    array = np.asarray(values)
    if array.dtype.kind not in "biuf" or array.size == 0:
        return None
    flat = array.reshape(-1).astype(np.float64)
    low, high = float(flat.min()), float(flat.max())
    if not (math.isfinite(low) and math.isfinite(high)):  # NaN or inf somewhere: drop them
        flat = flat[np.isfinite(flat)]
        if flat.size == 0:
            return None
        low, high = float(flat.min()), float(flat.max())
    if low == high:
        counts, limits = np.array([flat.size]), np.array([high])
    else:
        counts, limits = _equal_bins(flat, low, high, bins)
    return HistogramProto(
        min=low, max=high, num=float(flat.size), sum=float(flat.sum()), sum_squares=float(np.dot(flat, flat)),
        bucket_limit=limits.tolist(), bucket=counts.astype(np.float64).tolist(),
    )


@functools.lru_cache(maxsize=8)
def _steps(bins: int) -> np.ndarray:
    return np.arange(bins + 1, dtype=np.float64)


def _equal_bins(flat: np.ndarray, low: float, high: float, bins: int) -> tuple[np.ndarray, np.ndarray]:
    """np.histogram(flat, bins, (low, high)) without its generality (several times faster on
    small tensors): the same edges as its np.linspace, index by scaling, then move values
    that rounding put on the wrong side of an edge, as numpy does."""
    edges = _steps(bins) * ((high - low) / bins) + low
    edges[-1] = high
    index = ((flat - low) * (bins / (high - low))).astype(np.intp)
    np.minimum(index, bins - 1, out=index)  # flat >= low: never below 0
    index -= flat < edges[index]
    index += (flat >= edges[index + 1]) & (index != bins - 1)
    return np.bincount(index, minlength=bins), edges[1:]


def scalar_value(tag: str, value: float) -> Any:
    return Summary.Value(tag=tag, simple_value=float(value))


def histogram_value(tag: str, histo: Any) -> Any:
    return Summary.Value(tag=tag, histo=histo)


class _EventFile:
    """One open event file of one run: appends framed events, flushes on demand. With
    `atomic` (exports), the file is written under a temporary name and renamed when closed:
    TensorBoard never shows half an export, and a failed one leaves nothing behind."""

    _counter = 0
    _counter_lock = threading.Lock()

    def __init__(self, logdir: str, run: str, atomic: bool = False):
        run_dir = _run_folder(logdir, run)
        with _EventFile._counter_lock:
            _EventFile._counter += 1
            serial = _EventFile._counter
        # TensorBoard picks up any file with "tfevents" in its name; the suffix keeps two
        # writers of one process (or one host) from sharing a file.
        name = f"events.out.tfevents.{int(time.time())}.{socket.gethostname()}.{os.getpid()}.{serial}.stepscope"
        self.path = os.path.join(run_dir, name)
        self._tmp = os.path.join(run_dir, f".{name}.tmp") if atomic else None
        flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
        try:
            fd = os.open(self._tmp or self.path, flags | (os.O_EXCL if atomic else 0), 0o666)
        except OSError as exc:
            raise OutputError(f"cannot write {self.path}: {exc.strerror or exc}") from None
        self._file = os.fdopen(fd, "ab")
        self._file.write(frame_bytes(file_version_event()))
        self.bytes_written = 0

    def write(self, payload: bytes) -> None:
        record = frame_bytes(payload)
        self._file.write(record)
        self.bytes_written += len(record)

    def flush(self) -> None:
        self._file.flush()

    def close(self) -> None:
        if self._tmp is None:
            self._file.close()
            return
        try:
            with self._file:
                self._file.flush()
                os.fsync(self._file.fileno())
            os.replace(self._tmp, self.path)
        except OSError as exc:
            self.abort()
            raise OutputError(f"cannot write {self.path}: {exc.strerror or exc}") from exc

    def abort(self) -> None:
        """Drop what an atomic file holds (a failed export)."""
        with contextlib.suppress(OSError):
            self._file.close()
        if self._tmp is not None:
            with contextlib.suppress(OSError):
                os.unlink(self._tmp)


def _run_folder(logdir: str, run: str) -> str:
    """logdir/run, made if needed, every folder below `logdir` a real folder (a symbolic
    link there would send the events elsewhere): OutputError naming it otherwise."""
    folder = logdir
    os.makedirs(logdir, exist_ok=True)
    for part in run.split("/"):
        if part in ("", ".", "..") or "\\" in part or "\x00" in part:
            raise OutputError(f"run name {run!r} would leave {logdir}")
        folder = os.path.join(folder, part)
        try:
            os.mkdir(folder)
        except FileExistsError:
            pass
        except OSError as exc:
            raise OutputError(f"cannot create {folder}: {exc.strerror or exc}") from None
        if os.path.islink(folder) or not os.path.isdir(folder):
            raise OutputError(f"{folder} is a symbolic link or not a folder; stepscope writes event files only into real folders")
    return folder


class TensorBoardWriter:
    """Scalars and histograms into `logdir/<run>/events.out.tfevents.*`, one file per run.
    Not thread-safe: one writer per thread (the hooks write from their own thread)."""

    def __init__(self, logdir: str | os.PathLike[str], bins: int = DEFAULT_BINS, atomic: bool = False):
        if not isinstance(bins, int) or bins < 1:
            raise ConfigError(f"bins must be a positive integer, got {bins!r}")
        self.logdir = os.fspath(logdir)
        if self.logdir.startswith("s3://"):
            raise ConfigError(f"tensorboard_dir must be a local folder, got {self.logdir!r} (export from S3 to a local folder)")
        self.bins = bins
        self.atomic = atomic  # event files appear only when closed (exports)
        self._files: dict[str, _EventFile] = {}

    def _file(self, run: str) -> _EventFile:
        event_file = self._files.get(run)
        if event_file is None:
            event_file = self._files[run] = _EventFile(self.logdir, run, self.atomic)
        return event_file

    @property
    def bytes_written(self) -> int:
        return sum(f.bytes_written for f in self._files.values())

    def add_values(self, run: str, step: int, values: list[Any], wall_time: float | None = None) -> None:
        """One event at `step` holding several Summary.Values (scalar_value / histogram_value)."""
        if not values:
            return
        event = Event(wall_time=time.time() if wall_time is None else wall_time, step=int(step), summary=Summary(value=values))
        self._file(run).write(event.SerializeToString())

    def add_scalar(self, run: str, tag: str, value: float, step: int, wall_time: float | None = None) -> None:
        self.add_values(run, step, [scalar_value(tag, value)], wall_time)

    def add_histogram(self, run: str, tag: str, values: Any, step: int, wall_time: float | None = None) -> bool:
        """False (nothing written) when `values` holds no finite number."""
        histo = histogram_proto(values, self.bins)
        if histo is None:
            return False
        self.add_values(run, step, [histogram_value(tag, histo)], wall_time)
        return True

    def flush(self) -> None:
        for event_file in self._files.values():
            event_file.flush()

    def close(self) -> None:
        files, self._files = list(self._files.values()), {}
        while files:
            event_file = files.pop(0)
            try:
                event_file.close()
            except BaseException:
                for rest in files:  # one failed: publish none of the others either
                    rest.abort()
                raise

    def abort(self) -> None:
        """Close without publishing what atomic files hold."""
        for event_file in self._files.values():
            event_file.abort()
        self._files.clear()

    def __enter__(self) -> TensorBoardWriter:
        return self

    def __exit__(self, exc_type: object, *exc: object) -> None:
        if exc_type is not None and self.atomic:
            self.abort()
        else:
            self.close()
