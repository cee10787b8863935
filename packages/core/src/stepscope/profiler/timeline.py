"""The framework step timeline, read side: the parser of the files the training side's
writer publishes (stepscope.capture.step_timeline; one schema, documented in
docs/profiler.md) and of SageMaker's legacy `pythontimeline` files.

Four things are called "timeline": the hook's phase records (capture/phases.py); the step
timeline files, written by capture/step_timeline.py, parsed by profiler/timeline.py and read
for a job by profiler/step_reader.py; the merged Perfetto trace of `stepscope timeline`
(export/perfetto.py); and the app's timeline view (ui/timeline.py). This module is the step timeline's parser."""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Iterable
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from ..capture.phases import STEP_PHASES, TIMELINE_PHASES
from ..capture.step_timeline import (
    SCHEMA,
    SCHEMA_VERSION,
    STEP_TIMELINE_DIR,
    TIMELINE_KEY_RE,
    TimelineConfig,
    TimelineWriter,
    encode_timeline,
    timeline_key,
)
from ..exceptions import CorruptRecord
from ..layout import LEGACY_TIMELINE_DIR

logger = logging.getLogger("stepscope.profiler")

_LEGACY_KEY_RE = re.compile(r"^(\d+)_(.+?)_(?:python|model)_?timeline\.json$")
_LEGACY_STEP_RE = re.compile(r"^Step:ModeKeys\.(TRAIN|EVAL|PREDICT|GLOBAL)$")
# smdebug wrote some timestamps relative to a base given in a metadata event; anything
# before 1973 in microseconds is such a relative time.
_RELATIVE_TS_LIMIT_US = 1e14


def is_timeline_key(key: str) -> bool:
    name = key.rsplit("/", 1)[-1]
    return bool(TIMELINE_KEY_RE.match(name) or _LEGACY_KEY_RE.match(name))


def _us_as_ns(value: Any) -> int:
    if isinstance(value, int):
        return value * 1000
    exact = value if isinstance(value, Decimal) else Decimal(str(value))
    return int((exact * 1000).to_integral_value())


def _plain_numbers(value: Any) -> Any:
    if isinstance(value, Decimal):
        return float(value)
    if isinstance(value, dict):
        return {k: _plain_numbers(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain_numbers(v) for v in value]
    return value


# --- reading ----------------------------------------------------------------------------


@dataclass
class ParsedTimeline:
    """The rows of one timeline file (plain dicts, see `TIMELINE_COLUMNS`) and the time its
    writer started (None for legacy files)."""

    rows: list[dict[str, Any]]
    writer_start_ns: int | None


TIMELINE_COLUMNS = (
    "node_id", "rank", "framework", "mode", "step", "phase", "name", "start_ns", "end_ns", "duration_ms", "args",
)


def parse_timeline(data: bytes, key: str, describe: str | None = None) -> ParsedTimeline:
    """Rows of one of our timeline files, or of a SageMaker python timeline file.

    Raises CorruptRecord naming the file when it is not JSON at all; events that lack a
    field are skipped with one warning naming the file."""
    where = describe or key
    name = key.rsplit("/", 1)[-1]
    document = _load_trace_json(data, where)
    if isinstance(document, dict) and isinstance(document.get("metadata"), dict) and document["metadata"].get("schema") == SCHEMA:
        return _parse_ours(document, where)
    legacy = _LEGACY_KEY_RE.match(name)
    node_id = legacy.group(2) if legacy else "unknown"
    events = document.get("traceEvents", []) if isinstance(document, dict) else document
    if not isinstance(events, list):
        raise CorruptRecord(where, None, "no traceEvents list")
    return ParsedTimeline(_parse_legacy(events, node_id, where), None)


def _load_trace_json(data: bytes, where: str) -> Any:
    try:
        return json.loads(data, parse_float=Decimal)
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:
        # smdebug wrote the array form and a job killed mid-write leaves it unterminated,
        # which Chrome's trace viewer accepts too.
        text = data.decode("utf-8", errors="replace").rstrip().rstrip(",")
        if text.startswith("["):
            try:
                return json.loads(text + "]", parse_float=Decimal)
            except (ValueError, RecursionError):
                pass
        raise CorruptRecord(where, getattr(exc, "pos", None), f"not a JSON trace ({exc})") from None


def _parse_ours(document: dict[str, Any], where: str) -> ParsedTimeline:
    meta = document["metadata"]
    node_id, rank, framework = str(meta.get("node_id")), int(meta.get("rank", 0)), str(meta.get("framework"))
    rows, bad = [], 0
    for event in document.get("traceEvents", []):
        if not isinstance(event, dict) or event.get("ph") != "X":
            continue
        try:
            args = _plain_numbers(dict(event.get("args") or {}))
            step, mode, phase = int(args.pop("step")), str(args.pop("mode")), str(args.pop("phase", event.get("cat")))
            rows.append(_row(node_id, rank, framework, mode, step, phase, str(event["name"]), event["ts"], event["dur"], args or None))
        except (KeyError, TypeError, ValueError):
            bad += 1
    if bad:
        logger.warning("%s: %d malformed timeline events skipped", where, bad)
    start = meta.get("writer_start_ns")
    return ParsedTimeline(rows, int(start) if isinstance(start, int) else None)


def _parse_legacy(events: Iterable[Any], node_id: str, where: str) -> list[dict[str, Any]]:
    base_us: Any = 0
    for event in events:
        if isinstance(event, dict) and event.get("ph") == "M":
            start = (event.get("args") or {}).get("start_time_since_epoch_in_micros")
            if start is not None:
                base_us = start
    rows, bad = [], 0
    for event in events:
        if not isinstance(event, dict) or event.get("ph") != "X":
            continue
        match = _LEGACY_STEP_RE.match(str(event.get("name", "")))
        if not match:
            continue  # operator-level events belong to trace analysis, not the step timeline
        try:
            args = event.get("args") or {}
            ts = event["ts"]
            if ts < _RELATIVE_TS_LIMIT_US:
                ts += base_us
            step = int(args.get("step_num", args.get("step", -1)))
            rows.append(_row(node_id, -1, "unknown", match.group(1), step, "step", str(event["name"]), ts, event.get("dur", 0), None))
        except (KeyError, TypeError, ValueError):
            bad += 1
    if bad:
        logger.warning("%s: %d malformed timeline events skipped", where, bad)
    return rows


def _row(node_id: str, rank: int, framework: str, mode: str, step: int, phase: str, name: str, ts_us: Any, dur_us: Any, args: Any) -> dict[str, Any]:
    start_ns = _us_as_ns(ts_us)
    duration_ns = max(0, _us_as_ns(dur_us))
    return {
        "node_id": node_id,
        "rank": rank,
        "framework": framework,
        "mode": mode,
        "step": step,
        "phase": phase,
        "name": name,
        "start_ns": start_ns,
        "end_ns": start_ns + duration_ns,
        "duration_ms": duration_ns / 1e6,
        "args": args,
    }


__all__ = [
    "LEGACY_TIMELINE_DIR", "SCHEMA", "SCHEMA_VERSION", "STEP_PHASES", "STEP_TIMELINE_DIR", "TIMELINE_COLUMNS", "TIMELINE_PHASES",
    "ParsedTimeline", "TimelineConfig", "TimelineWriter", "encode_timeline", "is_timeline_key", "parse_timeline",
    "timeline_key",
]
