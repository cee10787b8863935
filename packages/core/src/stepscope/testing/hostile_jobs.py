"""Malformed and hostile job folders, for testing every read-side entry point (the trial,
`stepscope check`, the report, the app) against them. Each case starts from a small valid
job and breaks one thing; `build(case, root)` returns the job's folder and what a reader
must do with it. Nothing here needs a framework.

A reader given any of these must: raise nothing but StepscopeError (or skip and say so),
finish in bounded time, and read or write nothing outside the job (`root/outside/` holds
a canary file a reader must never return and must never write into)."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .. import layout
from ..capture.writer import Writer
from ..modes import ModeKeys

STEPS = 3
CANARY = b"canary: a reader left the job"


@dataclass(frozen=True)
class HostileJob:
    name: str
    job: Path  # the job's folder
    outside: Path  # a folder beside it a reader must not touch
    unreadable: bool  # a reader must report some file as unreadable (check exits 2)
    intact_steps: tuple[int, ...]  # steps whose values must still read back exactly


def expected_value(step: int) -> np.ndarray:
    return np.arange(4, dtype=np.float32) + step


def _base_job(job: Path) -> None:
    with Writer(str(job)) as writer:
        writer.write_collections(json.dumps({"collections": {"weights": {"name": "weights", "include_regex": ["weight"]}}, "_meta": {"num_workers": 1, "writer": "stepscope test"}}).encode())
        for step in range(STEPS):
            writer.write_step(step, ModeKeys.TRAIN, step, {"fc.weight": expected_value(step), "loss": np.float32(1.0 / (step + 1))})


def _json(path: Path, body) -> None:
    path.write_text(json.dumps(body) if not isinstance(body, str) else body)


def _collections(job: Path) -> Path:
    return job / layout.collections_key("worker_0")


def _table(job: Path) -> Path:
    return job / layout.step_table_key("worker_0", 0, STEPS - 1)


def _index(job: Path, step: int = 1) -> Path:
    return job / layout.index_file_key(step, "worker_0")


def _edit_table(job: Path, edit: Callable[[dict], None]) -> None:
    body = json.loads(_table(job).read_text())
    edit(body)
    _json(_table(job), body)


def _edit_index(job: Path, edit: Callable[[dict], None], step: int = 1) -> None:
    body = json.loads(_index(job, step).read_text())
    edit(body)
    _json(_index(job, step), body)
    _table(job).unlink()  # so that the reader reads the index file itself


def _set_payload(key: str, value) -> Callable[[dict], None]:
    def edit(body: dict) -> None:
        body["tensor_payload"][0][key] = value

    return edit


def _fifo_index(job: Path, outside: Path) -> None:
    folder = job / "index/000000000"
    os.mkfifo(folder / "000000000007_worker_0.json")


def _symlinked_event_file(job: Path, outside: Path) -> None:
    event = job / layout.event_file_key(1, "worker_0")
    (outside / "stolen.tfevents").write_bytes(event.read_bytes())
    event.unlink()
    event.symlink_to(outside / "stolen.tfevents")


def _symlinked_events_folder(job: Path, outside: Path) -> None:
    folder = job / "events/000000000001"
    target = outside / "events-elsewhere"
    folder.rename(target)
    folder.symlink_to(target, target_is_directory=True)


def _symlinked_index(job: Path, outside: Path) -> None:
    (outside / "index.json").write_bytes(_index(job, 2).read_bytes())
    _index(job, 2).unlink()
    _index(job, 2).symlink_to(outside / "index.json")
    _table(job).unlink()


def _escape_event_file_name(name: str) -> Callable[[Path, Path], None]:
    def mutate(job: Path, outside: Path) -> None:
        _edit_index(job, lambda body: body["meta"].__setitem__("event_file_name", name))

    return mutate


def _huge_index(job: Path, outside: Path) -> None:
    from ..job_files import MAX_INDEX_BYTES

    # As large as an index listing millions of tensors; sparse, so cheap to make.
    with open(_index(job, 2), "r+b") as handle:
        handle.truncate(MAX_INDEX_BYTES + 1)
    _table(job).unlink()


def _deep_index(job: Path, outside: Path) -> None:
    _json(_index(job, 2), "[" * 100_000 + "]" * 100_000)
    _table(job).unlink()


def _disagreeing_table(job: Path, outside: Path) -> None:
    def edit(body: dict) -> None:
        for entry in body["steps"]:
            entry["starts"] = [s + 7 for s in entry["starts"]]

    _edit_table(job, edit)


def _truncated_event(job: Path, outside: Path) -> None:
    event = job / layout.event_file_key(1, "worker_0")
    event.write_bytes(event.read_bytes()[:-9])


def _flipped_byte(job: Path, outside: Path) -> None:
    event = job / layout.event_file_key(1, "worker_0")
    data = bytearray(event.read_bytes())
    data[-6] ^= 0xFF
    event.write_bytes(bytes(data))


def _fifo_event_file(job: Path, outside: Path) -> None:
    event = job / layout.event_file_key(1, "worker_0")
    event.unlink()
    os.mkfifo(event)  # opening it for reading would block without O_NONBLOCK


def _deep_collections(job: Path, outside: Path) -> None:
    _json(_collections(job), '{"collections": ' + "[" * 50_000 + "]" * 50_000 + "}")


def _bad_system_metrics(job: Path, outside: Path) -> None:
    from ..capture.monitor import system_metrics_key

    path = job / system_metrics_key(1_700_000_000, "node-1")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text('{"Timestamp": "soon", "Name": 5, "Value": [1]}\nnot json at all\n{"Dimension": {}}\n')


def _bad_step_timeline(job: Path, outside: Path) -> None:
    from ..profiler.timeline import timeline_key

    path = job / timeline_key(1_700_000_000_000_000_000, "node-1", 0, 1, 0)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text('{"traceEvents": [{"ph": "X", "ts": "x", "dur": -5, "args": [1]}, 7, null]}')


def _catastrophic_regex(job: Path, outside: Path) -> None:
    body = json.loads(_collections(job).read_text())
    body["collections"]["evil"] = {"name": "evil", "include_regex": ["^(a|aa)+$"]}
    _json(_collections(job), body)
    with Writer(str(job), worker="worker_0") as writer:
        writer.write_step(STEPS, ModeKeys.TRAIN, STEPS, {"a" * 41 + "!": np.zeros(1, np.float32)})


# name -> (mutation, unreadable, intact steps)
def _index_not_json(job: Path, out: Path) -> None:
    _json(_index(job, 2), "\x00\xff not json")
    _table(job).unlink()  # so the reader has to parse the index file


def _status_file_garbage(job: Path, out: Path) -> None:
    (job / layout.STATUS_DIR).mkdir()
    _json(job / layout.status_key("worker_0"), "[" * 50_000)


_CASES: dict[str, tuple[Callable[[Path, Path], None], bool, tuple[int, ...]]] = {
    "collections_top_level_list": (lambda job, out: _json(_collections(job), [1, 2]), True, (0, 1, 2)),
    "collections_num_workers_text": (lambda job, out: _json(_collections(job), {"_meta": {"num_workers": "two"}, "collections": {}}), True, (0, 1, 2)),
    "collections_as_list": (lambda job, out: _json(_collections(job), {"collections": [{"name": "x"}]}), True, (0, 1, 2)),
    "collections_huge_num_workers": (lambda job, out: _json(_collections(job), {"_meta": {"num_workers": 10**12}}), True, (0, 1, 2)),
    "collections_not_json": (lambda job, out: _json(_collections(job), "{nope"), True, (0, 1, 2)),
    "collections_catastrophic_regex": (_catastrophic_regex, False, (0, 1, 2)),
    "step_table_layout_out_of_range": (lambda job, out: _edit_table(job, lambda b: b["steps"][1].__setitem__("layout", 99)), True, (0, 1, 2)),
    "step_table_missing_key": (lambda job, out: _edit_table(job, lambda b: b["steps"][1].pop("starts")), True, (0, 1, 2)),
    "step_table_steps_is_a_number": (lambda job, out: _edit_table(job, lambda b: b.__setitem__("steps", 5)), True, (0, 1, 2)),
    "step_table_unknown_mode": (lambda job, out: _edit_table(job, lambda b: b["steps"][1].__setitem__("mode", "DANCE")), True, (0, 1, 2)),
    "step_table_wrong_worker": (lambda job, out: _edit_table(job, lambda b: b.__setitem__("worker", "../../x")), True, (0, 1, 2)),
    "step_table_disagrees_with_index": (_disagreeing_table, False, (0, 1, 2)),
    "index_length_terabyte": (lambda job, out: _edit_index(job, _set_payload("length", 10**12)), False, (0, 2)),
    "index_start_negative": (lambda job, out: _edit_index(job, _set_payload("start_idx", -5)), True, (0, 2)),
    "index_length_text": (lambda job, out: _edit_index(job, _set_payload("length", "many")), True, (0, 2)),
    "index_name_not_text": (lambda job, out: _edit_index(job, _set_payload("tensorname", {"a": 1})), True, (0, 2)),
    "index_meta_is_a_list": (lambda job, out: _edit_index(job, lambda b: b.__setitem__("meta", [])), True, (0, 2)),
    "index_unknown_mode": (lambda job, out: _edit_index(job, lambda b: b["meta"].__setitem__("mode", "NOPE")), True, (0, 2)),
    "index_negative_shape": (lambda job, out: _edit_index(job, lambda b: b.__setitem__("shape_payload", [{"tensorname": "x", "shape": [-1]}])), True, (0, 2)),
    "index_not_json": (_index_not_json, True, (0, 1)),
    "index_deeply_nested": (_deep_index, True, (0, 1)),
    "index_huge": (_huge_index, True, (0, 1)),
    "index_fifo": (_fifo_index, False, (0, 1, 2)),  # not a regular file: never listed
    "index_symlink": (_symlinked_index, False, (0, 1)),
    "event_file_name_escapes": (_escape_event_file_name("../../../outside/stolen.tfevents"), True, (0, 2)),
    "event_file_name_absolute": (_escape_event_file_name("/etc/hostname"), False, (0, 2)),
    "event_file_name_dots": (_escape_event_file_name("../../..../etc/hostname"), True, (0, 2)),
    "event_file_symlink": (_symlinked_event_file, False, (0, 2)),
    "events_folder_symlink": (_symlinked_events_folder, False, (0, 2)),
    "event_file_truncated": (_truncated_event, False, (0, 2)),
    "event_file_fifo": (_fifo_event_file, False, (0, 2)),
    "collections_deeply_nested": (_deep_collections, True, (0, 1, 2)),
    "profiler_bad_system_metrics": (_bad_system_metrics, False, (0, 1, 2)),
    "status_file_garbage": (_status_file_garbage, False, (0, 1, 2)),
    "profiler_bad_step_timeline": (_bad_step_timeline, False, (0, 1, 2)),
    "event_file_flipped_byte": (_flipped_byte, False, (0, 2)),
}

CASES = tuple(_CASES)


def build(case: str, root: str | os.PathLike[str]) -> HostileJob:
    """Make the job of `case` under `root` (root/job), with root/outside/canary beside it."""
    mutate, unreadable, intact = _CASES[case]
    root = Path(root)
    job, outside = root / "job", root / "outside"
    outside.mkdir(parents=True, exist_ok=True)
    (outside / "canary").write_bytes(CANARY)
    _base_job(job)
    mutate(job, outside)
    return HostileJob(case, job, outside, unreadable, intact)


def outside_snapshot(job: HostileJob) -> dict[str, int]:
    """Names and sizes of what lies outside the job: compare before and after a reader."""
    out = {}
    for base in (job.outside, job.job.parent):
        for path in sorted(base.rglob("*") if base == job.outside else base.iterdir()):
            if base != job.outside and path in (job.job, job.outside):
                continue
            out[str(path)] = path.lstat().st_size
    return out


__all__ = ["HostileJob", "CASES", "build", "expected_value", "outside_snapshot", "CANARY", "STEPS"]
