"""The read side of a job's profiler data: system metrics and the step timeline as pandas
DataFrames, for our jobs and legacy SageMaker `profiler-output` folders alike."""

from __future__ import annotations

import datetime as _dt
import json
import logging
import math
import os
from collections.abc import Iterable
from typing import Any, TypeAlias

import numpy as np
import pandas as pd

from ..capture.monitor import ROTATION_S, parse_system_metrics_key
from ..exceptions import ConfigError, CorruptRecord
from ..layout import SYSTEM_METRICS_DIR
from ..store import Store, open_store
from .step_reader import KeyListing, StepTimelineReader

logger = logging.getLogger("stepscope.profiler")

SYSTEM_COLUMNS = ("timestamp", "node_id", "type", "name", "dimension", "value")
_CATEGORY_COLUMNS = ("node_id", "type", "name", "dimension")

TimeLike: TypeAlias = "float | int | _dt.datetime | pd.Timestamp | None"


class ProfilerTrial:
    """One job's profiler data. Files are read when a query first needs them and kept;
    `refresh()` picks up what a running job published since."""

    def __init__(self, path: str | os.PathLike[str] | Store):
        self.store = open_store(path if isinstance(path, Store) else os.fspath(path))
        self.path = self.store.url
        self._system = KeyListing(SYSTEM_METRICS_DIR)
        self._system_files: dict[str, tuple[int, str]] = {}  # key -> (minute start, node)
        self._system_frames: dict[str, pd.DataFrame] = {}
        # The last concatenation (keys it was built from, frame): rules ask for the whole job
        # many times over, one dimension at a time.
        self._concatenated: tuple[tuple[str, ...], pd.DataFrame] | None = None
        self._steps = StepTimelineReader(self.store)
        self._listed = False
        self._traces: Any = None  # stepscope.traces.TraceAnalysis, made on first use

    def __repr__(self) -> str:
        return f"ProfilerTrial({self.path!r})"

    # --- following a job -------------------------------------------------------------

    def refresh(self) -> int:
        """List files published since the last refresh; returns how many are new."""
        self._listed = True
        new = 0
        for key in self._list_new(self._system):
            parsed = parse_system_metrics_key(key)
            if parsed is None:
                continue
            self._system_files[key] = parsed
            new += 1
        return new + self._steps.refresh()

    def _list_new(self, listing: KeyListing) -> list[str]:
        return listing.list_new(self.store)

    def _ensure_listed(self) -> None:
        if not self._listed:
            self.refresh()

    # --- system metrics --------------------------------------------------------------

    def nodes(self) -> list[str]:
        """The nodes that published system metrics."""
        self._ensure_listed()
        return sorted({node for _, node in self._system_files.values()})

    def system_metrics(self, start: TimeLike = None, end: TimeLike = None, names: Iterable[str] | None = None) -> pd.DataFrame:
        """Samples with `start <= timestamp <= end` (epoch seconds, or datetimes; naive ones
        are UTC), keeping rows whose dimension or name is in `names` when given.

        Columns: timestamp (epoch s), node_id, type, name, dimension, value; sorted by time."""
        self._ensure_listed()
        start_s, end_s = _to_epoch_seconds(start, "start"), _to_epoch_seconds(end, "end")
        keys = [
            key
            for key, (minute, _node) in sorted(self._system_files.items(), key=lambda item: (item[1][0], item[0]))
            if (start_s is None or minute + ROTATION_S > start_s) and (end_s is None or minute <= end_s)
        ]
        df = self._concatenate(tuple(keys))
        mask = np.ones(len(df), dtype=bool)
        if start_s is not None:
            mask &= df["timestamp"].to_numpy() >= start_s
        if end_s is not None:
            mask &= df["timestamp"].to_numpy() <= end_s
        if names is not None:
            wanted = list(names)
            mask &= (df["dimension"].isin(wanted) | df["name"].isin(wanted)).to_numpy()
        return df[mask].reset_index(drop=True)

    def _concatenate(self, keys: tuple[str, ...]) -> pd.DataFrame:
        if self._concatenated is not None and self._concatenated[0] == keys:
            return self._concatenated[1]
        frames = [frame for frame in (self._system_frame(key) for key in keys) if len(frame)]
        if not frames:
            return _empty_system_frame()
        df = pd.concat(frames, ignore_index=True).sort_values("timestamp", kind="stable").reset_index(drop=True)
        for column in _CATEGORY_COLUMNS:
            df[column] = df[column].astype("category")
        self._concatenated = (keys, df)
        return df

    def time_range(self) -> tuple[float, float] | None:
        """(first, last) system-metric timestamp in epoch seconds; reads only the first and
        last minute files."""
        self._ensure_listed()
        if not self._system_files:
            return None
        minutes = [minute for minute, _ in self._system_files.values()]
        first = self.system_metrics(end=min(minutes) + ROTATION_S)
        last = self.system_metrics(start=max(minutes))
        if first.empty or last.empty:
            return None
        return float(first["timestamp"].min()), float(last["timestamp"].max())

    def _system_frame(self, key: str) -> pd.DataFrame:
        frame = self._system_frames.get(key)
        if frame is None:
            _minute, node = self._system_files[key]
            try:
                frame = parse_system_metrics(self.store.read(key), node, self.store.describe(key))
            except FileNotFoundError:
                logger.warning("%s: listed but gone; skipped", self.store.describe(key))
                frame = _empty_system_frame()
            except CorruptRecord as exc:
                logger.warning("%s; skipped", exc)
                frame = _empty_system_frame()
            self._system_frames[key] = frame
        return frame

    @property
    def traces(self) -> Any:
        """The detailed traces of the job and their analyses (stepscope.traces.TraceAnalysis)."""
        if self._traces is None:
            from ..traces.analysis import TraceAnalysis

            self._traces = TraceAnalysis(self.store)
        return self._traces

    # --- step timeline ---------------------------------------------------------------

    def step_timeline(self) -> pd.DataFrame:
        """Every step and phase interval of every rank, sorted by start.

        Columns: node_id, rank (-1 for legacy files), framework, mode (TRAIN, EVAL, ...),
        step, phase, name, start_ns, end_ns (epoch ns), duration_ms, args (extra fields)."""
        self._ensure_listed()
        return self._steps.step_timeline()

    def timeline_start_ns(self) -> int | None:
        """When the earliest timeline writer was created (the hook's start), if recorded."""
        self._ensure_listed()
        return self._steps.timeline_start_ns()

    # --- the whole job ---------------------------------------------------------------

    def job_start(self) -> float | None:
        """The earliest sign of the job (first system sample, timeline writer start, first
        step), in epoch seconds."""
        candidates = []
        span = self.time_range()
        if span is not None:
            candidates.append(span[0])
        writer_start = self.timeline_start_ns()
        if writer_start is not None:
            candidates.append(writer_start / 1e9)
        timeline = self.step_timeline()
        if len(timeline):
            candidates.append(float(timeline["start_ns"].min()) / 1e9)
        return min(candidates) if candidates else None


def create_profiler_trial(path: str | os.PathLike[str] | Store) -> ProfilerTrial:
    """The profiler side of the job in `path` (local folder, s3:// URL, or a Store)."""
    return ProfilerTrial(path)


_MAX_EPOCH_S = 1e11  # the year 5138: a later timestamp is not one


def parse_system_metrics(data: bytes, node_id: str, where: str) -> pd.DataFrame:
    """One system-metrics file as a DataFrame. Unreadable lines (a truncated last line, say)
    are skipped with one warning naming the file and the first bad line."""
    lines = data.decode("utf-8", errors="replace").splitlines()
    numbered = [(number, line) for number, line in enumerate(lines, 1) if line.strip()]
    try:
        # One parse of the whole file is far faster than one per line; lines are parsed
        # one by one only to find the bad ones.
        records = json.loads("[" + ",".join(line for _, line in numbered) + "]")
        numbers = [number for number, _ in numbered]
    except (ValueError, RecursionError):  # a bad line, or one nested too deeply
        records, numbers = [], []
        for number, line in numbered:
            try:
                records.append(json.loads(line))
                numbers.append(number)
            except (ValueError, RecursionError):
                records.append(None)
                numbers.append(number)
    columns: dict[str, list[Any]] = {name: [] for name in SYSTEM_COLUMNS}
    bad: list[int] = []
    for number, record in zip(numbers, records):
        try:
            value, timestamp = float(record["Value"]), float(record["Timestamp"])
            type_, name, dimension = str(record["Type"]), str(record["Name"]), str(record["Dimension"])
            node = str(record.get("NodeId") or node_id)
            if not (math.isfinite(value) and 0 <= timestamp < _MAX_EPOCH_S):  # NaN, 1e300
                raise ValueError(f"value {value} or timestamp {timestamp} out of range")
        except (TypeError, KeyError, ValueError, OverflowError):
            bad.append(number)
            continue
        columns["timestamp"].append(timestamp)
        columns["node_id"].append(node)
        columns["type"].append(type_)
        columns["name"].append(name)
        columns["dimension"].append(dimension)
        columns["value"].append(value)
    if bad:
        logger.warning("%s: %d unreadable line(s) skipped (first: line %d)", where, len(bad), bad[0])
    frame = pd.DataFrame(columns)
    frame["timestamp"] = frame["timestamp"].astype("float64")
    frame["value"] = frame["value"].astype("float64")
    return frame


def _empty_system_frame() -> pd.DataFrame:
    frame = pd.DataFrame({name: pd.Series(dtype="float64" if name in ("timestamp", "value") else "object") for name in SYSTEM_COLUMNS})
    for column in _CATEGORY_COLUMNS:
        frame[column] = frame[column].astype("category")
    return frame


def _to_epoch_seconds(value: Any, field_name: str) -> float | None:
    if value is None:
        return None
    if isinstance(value, (_dt.datetime, pd.Timestamp)):
        stamp = pd.Timestamp(value)
        if stamp.tzinfo is None:
            stamp = stamp.tz_localize("UTC")
        return stamp.timestamp()
    if isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, bool):
        return float(value)
    raise ConfigError(f"{field_name}: {value!r} is not epoch seconds or a datetime")
