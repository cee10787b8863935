"""Rendering a Report as one self-contained HTML file: inline CSS (screen and print),
inline SVG figures, no script, no external resource, so it opens offline and prints to
clean pages (each section starts a page; figures and table rows are not split)."""

from __future__ import annotations

import datetime as _dt
import math
from html import escape
from typing import Any

from .model import Callout, Figure, Paragraph, Report, Section, Table

_CSS = """
:root { --bad:#b3261e; --warn:#b26a00; --ok:#1e7b34; --info:#3d5a80; --line:#d8dde3; }
* { box-sizing: border-box; }
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; color:#1d232b; margin:0; background:#f6f7f9; }
header { background:#1d2b3a; color:#fff; padding:18px 32px; }
header h1 { margin:0 0 4px; font-size:22px; }
header p { margin:0; opacity:.85; font-size:13px; }
nav { padding:8px 32px; background:#fff; border-bottom:1px solid var(--line); font-size:13px; }
nav a { margin-right:14px; color:#3d5a80; text-decoration:none; }
main { max-width:1100px; margin:0 auto; padding:16px 32px 48px; }
section { background:#fff; border:1px solid var(--line); border-radius:6px; padding:14px 20px; margin:16px 0; }
h2 { margin:2px 0 10px; font-size:18px; }
table { border-collapse:collapse; width:100%; margin:8px 0 14px; font-size:12.5px; }
caption { text-align:left; font-weight:600; padding:4px 0; }
th, td { border-bottom:1px solid var(--line); padding:4px 8px; text-align:left; vertical-align:top; overflow-wrap:break-word; }
th { background:#f0f2f5; }
td.num { text-align:right; font-variant-numeric: tabular-nums; }
.wide { overflow-x:auto; }
.wide table { font-size:11.5px; }
figure { margin:8px 0 16px; }
figure svg { max-width:100%; height:auto; }
figcaption { font-size:12px; color:#555; }
.callout { border-left:4px solid var(--info); background:#f4f7fb; padding:8px 12px; margin:8px 0; }
.callout.bad { border-color:var(--bad); background:#fdf1f0; }
.callout.warn { border-color:var(--warn); background:#fdf6ec; }
.callout.ok { border-color:var(--ok); background:#eef8f0; }
.callout strong { display:block; }
.missing { color:#5b6470; font-style:italic; border:1px dashed var(--line); padding:8px 12px; margin:8px 0; }
@page { size: A4; margin: 14mm 12mm; }
@media print {
  body { background:#fff; font-size:11px; }
  header { background:none; color:#000; padding:0 0 6px; border-bottom:2px solid #000; }
  nav { display:none; }
  main { max-width:none; padding:0; }
  section { border:none; padding:0; margin:0; break-before:page; }
  section:first-of-type { break-before:auto; }
  figure, tr, .callout, .missing { break-inside:avoid; }
  .wide { overflow:visible; }
  .wide table { font-size:8.5px; }
  th, td { padding:2px 4px; }
  thead { display:table-header-group; }
  a { color:inherit; text-decoration:none; }
}
"""


def render_html(report: Report) -> str:
    when = _dt.datetime.fromtimestamp(report.generated_at, _dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        # No network, ever: a policy the browser enforces, not only a habit of this file.
        "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; style-src 'unsafe-inline'; img-src data:\">",
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>{escape(report.title)}</title><style>{_CSS}</style></head><body>",
        f"<header><h1>{escape(report.title)}</h1><p>{escape(report.source)} &middot; generated {when}</p></header>",
        "<nav>" + "".join(f'<a href="#{s.key}">{escape(s.title)}</a>' for s in report.sections) + "</nav>",
        "<main>",
    ]
    parts += [_section(s) for s in report.sections]
    parts.append("</main></body></html>")
    return "\n".join(parts)


def _section(section: Section) -> str:
    out = [f'<section id="{section.key}" data-section="{section.key}"><h2>{escape(section.title)}</h2>']
    for block in section.blocks:
        out.append(_block(block))
    for text in section.missing:
        out.append(f'<p class="missing" data-missing="{section.key}">{escape(text)}</p>')
    out.append("</section>")
    return "\n".join(out)


def _block(block: Any) -> str:
    if isinstance(block, Paragraph):
        return f"<p>{escape(block.text)}</p>"
    if isinstance(block, Callout):
        items = "".join(f"<li>{escape(i)}</li>" for i in block.items)
        return (
            f'<div class="callout {block.level}" data-level="{block.level}"><strong>{escape(block.title)}</strong>'
            f"{escape(block.text)}{f'<ul>{items}</ul>' if items else ''}</div>"
        )
    if isinstance(block, Table):
        head = "".join(f"<th>{escape(str(c))}</th>" for c in block.columns)
        body = "".join("<tr>" + "".join(_cell(v) for v in row) + "</tr>" for row in block.rows)
        caption = f"<caption>{escape(block.caption)}</caption>" if block.caption else ""
        table = f'<table data-table="{escape(block.key)}">{caption}<thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'
        table = f'<div class="wide">{table}</div>' if len(block.columns) > 7 else table
        if block.collapsed:
            return f"<details><summary>{escape(block.caption)}</summary>{table}</details>"
        return table
    if isinstance(block, Figure):
        caption = f"<figcaption>{escape(block.caption)}</figcaption>" if block.caption else ""
        return f'<figure data-figure="{escape(block.key)}">{block.svg}{caption}</figure>'
    raise TypeError(f"unknown report block {type(block).__name__}")


def format_value(value: Any) -> str:
    """How a cell shows a value; tests use the same function to compare."""
    if isinstance(value, bool) or value is None:
        return "" if value is None else str(value)
    if isinstance(value, float):
        if math.isnan(value) or math.isinf(value):
            return str(value)
        if value == int(value) and abs(value) < 1e15:
            return f"{value:.1f}"
        return f"{value:.4g}"  # four significant digits: 0.7356 ms, 313.4 ms, 5.88e+13
    return str(value)


def _cell(value: Any) -> str:
    numeric = isinstance(value, (int, float)) and not isinstance(value, bool)
    return f'<td{" class=num" if numeric else ""}>{escape(format_value(value))}</td>'
