"""What a report is made of, independent of how it is rendered: sections holding tables,
figures, paragraphs and callouts. Section builders fill these from the public APIs of the
trial, the profiler reader, the rules and the trace engine; the HTML renderer only draws them."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Paragraph:
    text: str


@dataclass(frozen=True)
class Callout:
    """A highlighted line: `level` is "bad" (a fired rule), "warn", "ok" or "info"."""

    level: str
    title: str
    text: str = ""
    items: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.level not in ("bad", "warn", "ok", "info"):
            raise ValueError(f"Callout.level must be bad, warn, ok or info, got {self.level!r}")


@dataclass(frozen=True)
class Table:
    columns: tuple[str, ...]
    rows: tuple[tuple[Any, ...], ...]
    caption: str = ""
    key: str = ""  # a stable id (data-table attribute) so tests and readers can find it
    collapsed: bool = False  # shown folded under its caption (secondary detail a reader opens)

    def __post_init__(self) -> None:
        for row in self.rows:
            if len(row) != len(self.columns):
                raise ValueError(f"table {self.key or self.caption!r}: row {row!r} has {len(row)} cells, expected {len(self.columns)}")


@dataclass(frozen=True)
class Figure:
    """A rendered figure: inline SVG markup (from matplotlib)."""

    svg: str
    caption: str = ""
    key: str = ""


Block = Paragraph | Callout | Table | Figure


@dataclass
class Section:
    """One part of the report. `missing` says what to save to fill it when its data is absent."""

    key: str
    title: str
    blocks: list[Block] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)

    def add(self, *blocks: Block) -> Section:
        self.blocks.extend(blocks)
        return self

    def table(self, key: str) -> Table | None:
        return next((b for b in self.blocks if isinstance(b, Table) and b.key == key), None)


@dataclass
class Report:
    title: str
    source: str
    generated_at: float
    sections: list[Section] = field(default_factory=list)

    def section(self, key: str) -> Section:
        for section in self.sections:
            if section.key == key:
                return section
        raise KeyError(f"no section {key!r}; sections: {', '.join(s.key for s in self.sections)}")
