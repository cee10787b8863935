"""The read side of the framework step timeline: lists a job's step-timeline files
(`profiler-output/framework/steps/`, and SageMaker's legacy `pevents/`), parses them with
profiler/timeline.py's parser and hands every step and phase interval over as one
DataFrame. ProfilerTrial and the trace engine (TraceAnalysis.step_timeline) both read it
from here, so neither has to import the other for it.

This module is the step timeline's reader; capture/step_timeline.py's docstring lists the
four things called "timeline" and where each lives."""

from __future__ import annotations

import datetime as _dt
import logging
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from ..exceptions import CorruptRecord
from ..store import Store
from .timeline import LEGACY_TIMELINE_DIR, STEP_TIMELINE_DIR, TIMELINE_COLUMNS, ParsedTimeline, is_timeline_key, parse_timeline

logger = logging.getLogger("stepscope.profiler")

_HOUR_FORMAT = "%Y%m%d%H"


@dataclass
class KeyListing:
    """What has been listed under one prefix, so that a refresh lists only the recent part."""

    prefix: str
    keys: set[str] = field(default_factory=set)
    flat: bool = False  # a legacy layout without hour folders: always list everything
    latest_hour: str | None = None

    def start_after(self) -> str | None:
        # Files of other nodes can arrive late, so the listing goes back one hour before
        # the newest hour folder seen; a node more than an hour late is missed until a
        # fresh ProfilerTrial.
        if self.flat or self.latest_hour is None:
            return None
        hour = _dt.datetime.strptime(self.latest_hour, _HOUR_FORMAT) - _dt.timedelta(hours=1)
        return f"{self.prefix}/{hour.strftime(_HOUR_FORMAT)}"

    def note(self, key: str) -> None:
        self.keys.add(key)
        first = key[len(self.prefix) + 1 :].split("/", 1)
        if len(first) == 1:
            self.flat = True
        elif len(first[0]) == 10 and first[0].isdigit():
            self.latest_hour = max(self.latest_hour or first[0], first[0])

    def list_new(self, store: Store) -> list[str]:
        """The keys under the prefix not seen before, noted as seen."""
        new = []
        for key in store.list(f"{self.prefix}/", self.start_after()):
            if key not in self.keys:
                self.note(key)
                new.append(key)
        return new


class StepTimelineReader:
    """The step timeline of one job. Files are parsed when a query first needs them and
    kept; `refresh()` lists what a running job published since."""

    def __init__(self, store: Store):
        self.store = store
        self._listings = [KeyListing(STEP_TIMELINE_DIR), KeyListing(LEGACY_TIMELINE_DIR)]
        self._keys: set[str] = set()
        self._parsed: dict[str, ParsedTimeline] = {}
        self._frame: pd.DataFrame | None = None
        self._listed = False

    def refresh(self) -> int:
        """List timeline files published since the last refresh; returns how many are new."""
        self._listed = True
        new = 0
        for listing in self._listings:
            for key in listing.list_new(self.store):
                if is_timeline_key(key):
                    self._keys.add(key)  # parsed when a query needs it
                    self._frame = None
                    new += 1
        return new

    def _ensure_listed(self) -> None:
        if not self._listed:
            self.refresh()

    def step_timeline(self) -> pd.DataFrame:
        """Every step and phase interval of every rank, sorted by start (the columns of
        ProfilerTrial.step_timeline)."""
        self._ensure_listed()
        if self._frame is None:
            rows: list[dict[str, Any]] = []
            for key in sorted(self._keys):
                rows.extend(self._parse(key).rows)
            frame = pd.DataFrame(rows, columns=list(TIMELINE_COLUMNS))
            for column in ("rank", "step", "start_ns", "end_ns"):
                frame[column] = frame[column].astype("int64")
            frame["duration_ms"] = frame["duration_ms"].astype("float64")
            self._frame = frame.sort_values(["start_ns", "end_ns"], ascending=[True, False], kind="stable").reset_index(drop=True)
        return self._frame.copy()

    def timeline_start_ns(self) -> int | None:
        """When the earliest timeline writer was created (the hook's start), if recorded."""
        self._ensure_listed()
        starts = [p.writer_start_ns for p in (self._parse(k) for k in sorted(self._keys)) if p.writer_start_ns]
        return min(starts) if starts else None

    def _parse(self, key: str) -> ParsedTimeline:
        parsed = self._parsed.get(key)
        if parsed is None:
            where = self.store.describe(key)
            try:
                parsed = parse_timeline(self.store.read(key), key, where)
            except FileNotFoundError:
                logger.warning("%s: listed but gone; skipped", where)
                parsed = ParsedTimeline([], None)
            except CorruptRecord as exc:
                logger.warning("%s; skipped", exc)
                parsed = ParsedTimeline([], None)
            self._parsed[key] = parsed
        return parsed
