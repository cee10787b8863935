"""The job report: one self-contained HTML file (optionally a PDF) presenting what the rules,
the system monitor, the step timeline and the trace engine computed, section by section.
See docs/report.md.

Names load on first use: `stepscope --help` and every other command import this package
(for `report`'s arguments) and must not pay for pandas, matplotlib and the rules."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._lazy import lazy_getattr

if TYPE_CHECKING:
    from .build import REPORT_NAME, WrittenReport, build_report, write_report
    from .findings import Finding
    from .html import render_html
    from .model import Callout, Figure, Paragraph, Report, Section, Table

_LAZY = {
    "REPORT_NAME": "build", "WrittenReport": "build", "build_report": "build", "write_report": "build",
    "Finding": "findings", "render_html": "html",
    "Report": "model", "Section": "model", "Table": "model", "Figure": "model", "Paragraph": "model", "Callout": "model",
}
__getattr__ = lazy_getattr(__name__, _LAZY)

__all__ = [
    "REPORT_NAME", "WrittenReport", "build_report", "write_report", "render_html", "Finding",
    "Report", "Section", "Table", "Figure", "Paragraph", "Callout",
]
