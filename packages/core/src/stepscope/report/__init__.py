"""The job report: one self-contained HTML file (optionally a PDF) presenting what the rules,
the system monitor, the step timeline and the trace engine computed, section by section.
See docs/report.md."""

from __future__ import annotations

from .build import REPORT_NAME, WrittenReport, build_report, write_report
from .findings import Finding
from .html import render_html
from .model import Callout, Figure, Paragraph, Report, Section, Table

__all__ = [
    "REPORT_NAME", "WrittenReport", "build_report", "write_report", "render_html", "Finding",
    "Report", "Section", "Table", "Figure", "Paragraph", "Callout",
]
