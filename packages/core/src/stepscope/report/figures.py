"""Figures for the report, drawn with matplotlib (Agg, no display) into SVG markup that is
inlined in the HTML: text stays text (small, sharp in print), no external resource."""

from __future__ import annotations

import functools
import io
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from .. import chart_scales

MAX_POINTS = 2000  # a line holds at most this many points; more would only add bytes
_COLORS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf")


_STYLE: Any = {"svg.fonttype": "none", "font.size": 9, "axes.spines.top": False, "axes.spines.right": False}


def _figure(width: float, height: float):
    """A matplotlib Figure without pyplot (no global figure registry, no GUI backend)."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), layout="constrained")
    return fig, fig.subplots()


def _styled(draw: Callable[..., str]) -> Callable[..., str]:
    """Run a chart function under the report's matplotlib style (text sizes are fixed when
    artists are made, so the whole drawing runs inside the style)."""

    @functools.wraps(draw)
    def styled(*args: Any, **kwargs: Any) -> str:
        import matplotlib

        with matplotlib.rc_context(_STYLE):
            return draw(*args, **kwargs)

    return styled


def _thin(x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    if len(x) <= MAX_POINTS:
        return x, y
    keep = np.linspace(0, len(x) - 1, MAX_POINTS).astype(int)
    return x[keep], y[keep]


def _svg(fig) -> str:
    buffer = io.StringIO()
    # Constrained layout instead of bbox_inches="tight": one draw instead of two.
    fig.savefig(buffer, format="svg")
    text = buffer.getvalue()
    # Keep only the <svg> element: the XML prolog and DOCTYPE are not valid inside HTML.
    text = text[text.index("<svg") :]
    # matplotlib's ids repeat across figures ("patch_1"...); make them unique per figure.
    prefix = f"f{next(_ids)}_"
    text = re.sub(r'id="([^"]+)"', lambda m: f'id="{prefix}{m.group(1)}"', text)
    return re.sub(r'(url\(#|href="#)([^)"]+)', lambda m: f"{m.group(1)}{prefix}{m.group(2)}", text)


def _counter():
    n = 0
    while True:
        n += 1
        yield n


_ids = _counter()


@_styled
def line_chart(
    series: Mapping[str, tuple[Sequence[float], Sequence[float]]], *, xlabel: str, ylabel: str,
    marks: Iterable[tuple[float, str]] = (), logy: bool = False, width: float = 7.5, height: float = 2.6,
    flagged: Iterable[str] = (), legend_max: int = chart_scales.LEGEND_MAX, criterion: str = "max",
) -> str:
    """Lines (label -> (x, y)); `marks` are vertical lines (x, label) such as fired steps.

    The legend sits right of the plot, never over the data; beyond `legend_max` series only the
    top ones by `criterion` (and every `flagged` one, the tensors a rule named) are coloured and
    named, the others drawn thin and grey, and the legend's title says so. A log axis shows
    zeros and denormals (a weight that did not move) at a linear band below the smallest
    positive value (symlog) instead of dropping them."""
    fig, ax = _figure(width, height)
    named, cap = chart_scales.top_series({k: list(v[1]) for k, v in series.items()}, legend_max, keep=flagged, criterion=criterion)
    shown = set(named)
    colour = 0
    for label, (x, y) in series.items():
        xs, ys = _thin(np.asarray(x, dtype=float), np.asarray(y, dtype=float))
        if label in shown:
            ax.plot(xs, ys, label=label, color=_COLORS[colour % len(_COLORS)], linewidth=1.2, marker="o" if len(xs) < 40 else None, markersize=2.5 if len(xs) > 1 else 5)
            colour += 1
        else:
            ax.plot(xs, ys, color="#bbbbbb", linewidth=0.6, zorder=0)
    labelled = set()
    for at, mark in marks:
        ax.axvline(at, color="#d62728", linestyle="--", linewidth=0.9, alpha=0.8, label=None if mark in labelled else mark)
        labelled.add(mark)
    if logy:
        values = np.concatenate([np.asarray(y, dtype=float).reshape(-1) for _, y in series.values()] or [np.zeros(0)])
        values = values[np.isfinite(values)]
        positive = values[values > chart_scales.TINY]
        if len(values) and (len(positive) < len(values)):
            ax.set_yscale("symlog", linthresh=float(positive.min()) if len(positive) else 1.0, linscale=0.3)
        elif len(positive):
            ax.set_yscale("log")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    if len(series) > 1 or labelled:
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0, frameon=False,
                  title=cap or None, title_fontsize=7, ncol=1)
    return _svg(fig)


@_styled
def histogram(values: Sequence[float], *, xlabel: str, bins: int = 40, width: float = 7.5, height: float = 2.4) -> str:
    fig, ax = _figure(width, height)
    ax.hist(np.asarray(values, dtype=float), bins=bins, color=_COLORS[0])
    ax.set_xlabel(xlabel)
    ax.set_ylabel("count")
    ax.grid(alpha=0.3)
    return _svg(fig)
