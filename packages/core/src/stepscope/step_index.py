"""What a trial knows about each step: which workers published it and where their tensors
sit, from their index files or, until those are read, from step tables; and what the
names of step tables and index files tell a reader before it reads them. The Trial keeps
one StepInfo per global step."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from . import job_files, layout
from .modes import ModeKeys


class Entries:
    """Where each tensor of one step of one worker sits: name -> (start, length). Built from
    an index file, or from a step table where steps share one name -> position map."""

    __slots__ = ("positions", "starts", "lengths")

    def __init__(self, positions: dict[str, int], starts: Sequence[int], lengths: Sequence[int]):
        self.positions, self.starts, self.lengths = positions, starts, lengths

    def __contains__(self, name: str) -> bool:
        return name in self.positions

    def __iter__(self):
        return iter(self.positions)

    def location(self, name: str) -> tuple[int, int]:
        i = self.positions[name]
        return self.starts[i], self.lengths[i]


class TableSteps:
    """The steps one worker's step table describes, as the trial holds them: the parsed
    table and the name -> position maps of its layouts. A step's tensor locations are made
    from its row when the step is read, so opening a long job costs one dict entry per
    step and worker, not one object."""

    __slots__ = ("table", "positions")

    def __init__(self, table: job_files.StepTable, positions: list[dict[str, int]]):
        self.table, self.positions = table, positions

    def entries(self, step: int) -> Entries:
        _, _, number, starts, lengths, _ = self.table.rows[step]
        return Entries(self.positions[number], starts, lengths)

    def has(self, step: int, name: str) -> bool:
        return name in self.positions[self.table.rows[step][2]]

    def shapes(self, step: int) -> Mapping[str, tuple[int, ...]]:
        return self.table.rows[step][5]


@dataclass
class StepInfo:
    """One global step as its workers published it. A worker is known either from its
    index file (`index_keys`, `payload`, `shapes`, `event_keys`) or, until that file is
    read, from its step table (`tables`); never from both."""

    step: int
    mode: ModeKeys
    mode_step: int
    index_keys: dict[str, str] = field(default_factory=dict)  # worker -> index key
    event_keys: dict[str, str] = field(default_factory=dict)  # worker -> event file key
    payload: dict[str, Entries] = field(default_factory=dict)  # worker -> tensor locations
    shapes: dict[str, dict[str, tuple[int, ...]]] = field(default_factory=dict)  # worker -> name -> shape
    tables: dict[str, TableSteps] = field(default_factory=dict)  # worker -> its step table

    def worker_count(self) -> int:
        return len(self.index_keys) + len(self.tables)

    def workers(self) -> list[str]:
        return [*self.index_keys, *self.tables]

    def entries(self, worker: str) -> Entries | None:
        """Where `worker`'s tensors of this step sit; None when it did not publish it."""
        found = self.payload.get(worker)
        if found is None and worker in self.tables:
            found = self.tables[worker].entries(self.step)
        return found

    def workers_with(self, name: str) -> list[str]:
        step = self.step
        return [w for w, p in self.payload.items() if name in p] + [w for w, t in self.tables.items() if t.has(step, name)]

    def has(self, name: str) -> bool:
        step = self.step
        return any(name in p for p in self.payload.values()) or any(t.has(step, name) for t in self.tables.values())

    def shapes_of(self, name: str) -> dict[str, tuple[int, ...]]:
        """{worker: shape} of `name` where a shape was saved."""
        found = {w: s[name] for w, s in self.shapes.items() if name in s}
        for worker, table in self.tables.items():
            shapes = table.shapes(self.step)
            if name in shapes:
                found[worker] = shapes[name]
        return found

    def has_shape(self, name: str) -> bool:
        step = self.step
        return any(name in s for s in self.shapes.values()) or any(name in t.shapes(step) for t in self.tables.values())


def table_span(key: str) -> tuple[str, int, int] | None:
    """(worker, first step, last step) a step table's key names
    (`<dir>/<worker>/<first>_<last>.json`); None for a key of another shape."""
    parts = key.split("/")
    first_last = parts[-1].removesuffix(".json").split("_")
    if len(parts) != 3 or len(first_last) != 2 or not all(p.isdigit() for p in first_last):
        return None
    return parts[1], int(first_last[0]), int(first_last[1])


def table_covers(key: str, wanted: Mapping[str, list[int]]) -> bool:
    """Whether the step table at `key` may hold one of the `wanted` steps of its worker; a
    key of another shape is read to find out."""
    span = table_span(key)
    return span is None or any(span[1] <= step <= span[2] for step in wanted.get(span[0], ()))


def tables_floor(table_keys: list[str]) -> int | None:
    """The last step that the tables of every worker with tables reach, by their names."""
    last: dict[str, int] = {}
    for key in table_keys:
        span = table_span(key)
        if span is not None:
            last[span[0]] = max(last.get(span[0], -1), span[2])
    return min(last.values()) if last else None


def index_floor_key(step: int) -> str:
    """A key that sorts after every index key of `step` and below those of later steps."""
    return f"{layout.INDEX_DIR}/{step // 1000:09d}/{step:012d}_~"


__all__ = ["Entries", "TableSteps", "StepInfo", "table_span", "table_covers", "tables_floor", "index_floor_key"]
