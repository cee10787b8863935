"""Where each file of a job lives, relative to the job's root (smdebug-compatible)."""

from __future__ import annotations

import re

EVENTS_DIR = "events"
INDEX_DIR = "index"
COLLECTIONS_DIR = "collections/000000000"
END_MARKER = "training_job_end.ts"
STATUS_DIR = "stepscope-status"
STEP_TABLE_DIR = "stepscope-index"
STEPS_PER_TABLE = 1000
CONTROL_DIR = "stepscope-control"
PROFILER_DIR = "profiler-output"
SYSTEM_METRICS_DIR = f"{PROFILER_DIR}/system/incremental"
FRAMEWORK_DIR = f"{PROFILER_DIR}/framework"
RULE_OUTPUT_DIR = "rule-output"

INDEX_KEY_RE = re.compile(r"^index/(\d{9})/(\d{12})_([^/]+)\.json$")
_UNSAFE_NAME = re.compile(r"[^A-Za-z0-9_.=+@-]")


def event_file_key(step: int, worker: str) -> str:
    return f"{EVENTS_DIR}/{step:012d}/{step:012d}_{worker}.tfevents"


def index_file_key(step: int, worker: str) -> str:
    return f"{INDEX_DIR}/{step // 1000:09d}/{step:012d}_{worker}.json"


def collections_key(worker: str) -> str:
    return f"{COLLECTIONS_DIR}/{worker}_collections.json"


def step_table_key(worker: str, first_step: int, last_step: int) -> str:
    """A step table: the index entries of many steps of one worker in one file."""
    return f"{STEP_TABLE_DIR}/{worker}/{first_step:012d}_{last_step:012d}.json"


def safe_file_name(name: str, max_length: int = 120) -> str:
    """`name` as one file name inside a folder: characters other than letters, digits and
    `_.=+@-` become `_`, no leading dot, bounded length (names come from config files)."""
    safe = _UNSAFE_NAME.sub("_", str(name)).lstrip(".")[:max_length]
    return safe or "_"


def rule_output_key(rule_name: str) -> str:
    return f"{RULE_OUTPUT_DIR}/{safe_file_name(rule_name)}.json"


def status_key(worker: str) -> str:
    return f"{STATUS_DIR}/{worker}.json"


def parse_index_key(key: str) -> tuple[int, str] | None:
    """(step, worker) of an index key, or None for anything else."""
    match = INDEX_KEY_RE.match(key)
    if not match:
        return None
    return int(match.group(2)), match.group(3)


def worker_name(rank: int | None) -> str:
    return f"worker_{rank or 0}"
