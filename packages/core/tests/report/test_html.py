"""The HTML renderer: self-contained, escaped, every block kind, print stylesheet."""

from __future__ import annotations

import re

import pytest

from stepscope.report import Callout, Figure, Paragraph, Report, Section, Table, render_html
from stepscope.report.figures import line_chart
from stepscope.report.html import format_value


def test_blocks_are_rendered_and_escaped():
    section = Section("s", "A <section>")
    section.add(
        Paragraph("x < y & z"),
        Callout("bad", "<b>fired</b>", "text", ("do <this>",)),
        Table(("name", "value"), (("<script>alert(1)</script>", 1.5), ("n", 2)), caption="cap", key="t"),
        Figure(line_chart({"a": ([0, 1, 2], [3.0, 2.0, 1.0])}, xlabel="step", ylabel="loss", marks=[(1, "rule fired")]), caption="fig", key="f"),
    )
    section.missing.append("save <more>")
    html = render_html(Report("title", "/job", 0.0, [section]))
    assert "<script>" not in html and "&lt;script&gt;" in html and "do &lt;this&gt;" in html
    assert '<td class=num>1.5</td>' in html and '<p class="missing" data-missing="s">save &lt;more&gt;</p>' in html
    assert html.count("<svg") == 1 and "<?xml" not in html and "http://www.w3.org/2000/svg" in html
    assert "@media print" in html and "break-before:page" in html
    # Nothing is fetched: no src/href other than in-page anchors, and a CSP that forbids it.
    assert not re.search(r'(src|href)="(?!#)', html.replace('xmlns:xlink="http://www.w3.org/1999/xlink"', ""))
    assert "default-src 'none'" in html


def test_figure_ids_are_unique_across_figures():
    first = line_chart({"a": ([0, 1], [1, 2])}, xlabel="x", ylabel="y")
    second = line_chart({"a": ([0, 1], [1, 2])}, xlabel="x", ylabel="y")
    ids = re.findall(r'id="([^"]+)"', first) + re.findall(r'id="([^"]+)"', second)
    assert ids and len(ids) == len(set(ids))


def test_long_series_are_thinned():
    svg = line_chart({"a": (list(range(100_000)), [float(i % 7) for i in range(100_000)])}, xlabel="x", ylabel="y")
    assert len(svg) < 400_000


def test_format_value_and_table_validation():
    assert [format_value(v) for v in (1.0, 0.123456789, 3, None, float("nan"), "a")] == ["1.0", "0.1235", "3", "", "nan", "a"]
    with pytest.raises(ValueError, match="expected 2"):
        Table(("a", "b"), ((1,),), key="bad")
    with pytest.raises(ValueError, match="level"):
        Callout("red", "x")
