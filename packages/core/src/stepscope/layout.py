"""Where each file of a job lives, relative to the job's root: every folder and file kind
stepscope writes or reads is named here, once, and writers and readers alike take the name
from here (docs/format.md describes each). The tensor part is smdebug's layout, unchanged."""

from __future__ import annotations

import re

# --- the tensor part (smdebug-compatible) -------------------------------------------------
EVENTS_DIR = "events"
INDEX_DIR = "index"
COLLECTIONS_DIR = "collections/000000000"
END_MARKER = "training_job_end.ts"

# --- stepscope's own folders --------------------------------------------------------------
STATUS_DIR = "stepscope-status"  # a worker's health (<worker>.json), claim (.lock), evidence
STEP_TABLE_DIR = "stepscope-index"  # step tables: many steps' index entries in one file
STEPS_PER_TABLE = 1000
CONTROL_DIR = "stepscope-control"  # requests to the training (a rule's stop)
STOP_KEY = f"{CONTROL_DIR}/stop_training.json"
REQUEST_KEY = f"{CONTROL_DIR}/request.json"  # an on-demand request (a memory snapshot, a black box)
RESPONSE_DIR = f"{CONTROL_DIR}/responses"  # each worker's answer: <request id>/<worker>.json
COST_DIR = "stepscope-cost"  # the hooks' own cost, per worker
COST_WINDOWS_DIR = f"{COST_DIR}/profiler-windows"  # the profiling windows' cost
TRACE_TABLE_DIR = "stepscope-traces"  # the trace engine's per-trace event tables (parquet)
TRACE_SUMMARY_DIR = "stepscope-summaries"  # its compact per-rank summaries, with a manifest
BLACKBOX_DIR = "stepscope-blackbox"  # what a worker wrote when training failed (<worker>/record.json)
REPORT_NAME = "stepscope-report.html"  # `stepscope report`'s default output, beside the job
# A name starting with this is stepscope's, never a user's traces.
OWN_DIR_PREFIX = "stepscope-"

# --- profiler data (SageMaker's layout, plus our step timeline) ---------------------------
PROFILER_DIR = "profiler-output"
SYSTEM_METRICS_DIR = f"{PROFILER_DIR}/system/incremental"
FRAMEWORK_DIR = f"{PROFILER_DIR}/framework"
STEP_TIMELINE_DIR = f"{FRAMEWORK_DIR}/steps"  # our step/phase timeline
LEGACY_TIMELINE_DIR = f"{FRAMEWORK_DIR}/pevents"  # smdebug's python timeline files
PYTHON_PROFILE_DIR = f"{FRAMEWORK_DIR}/python"  # cProfile / pyinstrument windows
MEMORY_SNAPSHOT_DIR = f"{FRAMEWORK_DIR}/pytorch/memory"  # CUDA allocator snapshots of the windows
DETAILED_FRAMEWORKS = ("pytorch", "tensorflow")  # the frameworks whose detailed traces we write

# --- rule output ----------------------------------------------------------------------------
RULE_OUTPUT_DIR = "rule-output"
RULE_SUMMARY_KEY = f"{RULE_OUTPUT_DIR}/summary.json"  # `stepscope check`'s table of every rule

# The top-level names whose presence makes a folder a job (a tree of jobs is walked to them).
JOB_MARKERS = frozenset({INDEX_DIR, COLLECTIONS_DIR.split("/")[0], EVENTS_DIR, PROFILER_DIR, STEP_TABLE_DIR, END_MARKER})

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


HELD_TABLE_SUFFIX = ".held.json"


def held_table_key(worker: str, first_step: int, last_step: int) -> str:
    """A held table: the index entries of one held batch of scalar steps (the losses of a
    hundred steps), published instead of their index files but the last one's (whose
    `meta.step_table` names it). Its name is not a step table's (`table_span` does not
    read it): a worker's step tables cover every step it published up to the last one's
    end, which a reader opening the job relies on, while between two held tables lie the
    steps that saved tensors, in index files of their own."""
    return f"{STEP_TABLE_DIR}/{worker}/{first_step:012d}_{last_step:012d}{HELD_TABLE_SUFFIX}"


def safe_file_name(name: str, max_length: int = 120) -> str:
    """`name` as one file name inside a folder: characters other than letters, digits and
    `_.=+@-` become `_`, no leading dot, bounded length (names come from config files)."""
    safe = _UNSAFE_NAME.sub("_", str(name)).lstrip(".")[:max_length]
    return safe or "_"


def rule_output_key(rule_name: str) -> str:
    return f"{RULE_OUTPUT_DIR}/{safe_file_name(rule_name)}.json"


def status_key(worker: str) -> str:
    return f"{STATUS_DIR}/{worker}.json"


def detailed_dir(framework: str) -> str:
    """Where a framework's detailed traces go (one folder per rank below it)."""
    return f"{FRAMEWORK_DIR}/{framework}/detailed"


def cost_key(worker: str) -> str:
    return f"{COST_DIR}/{worker}.json"


def parse_index_key(key: str) -> tuple[int, str] | None:
    """(step, worker) of an index key, or None for anything else."""
    match = INDEX_KEY_RE.match(key)
    if not match:
        return None
    return int(match.group(2)), match.group(3)


def worker_name(rank: int | None) -> str:
    return f"worker_{rank or 0}"
