"""How a chart shows its values, decided once for the report and the app: which values are
drawn apart from a histogram's range (a compile step of 8.3 s among 10 ms steps would put
every other step into one bin), when an axis is logarithmic (values spanning decades), and
which series a capped legend keeps.

Read side only; numpy only."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

# A value is drawn apart when it lies beyond Tukey's "far out" fence (3 interquartile ranges
# past the quartile) AND at least FAR_RATIO times the median away (above: > 2 x median;
# below: < median / 2): with near-identical steps the interquartile range is ~0 and the fence
# alone would set apart a step 1 % slower.
FAR_IQR = 3.0
FAR_RATIO = 2.0
# Only a few values are drawn apart: when many lie out there, the distribution has two modes
# and the histogram should show both.
MAX_APART_SHARE = 0.05
MIN_VALUES = 5

# A logarithmic axis when the positive values span more than this ratio (two decades).
LOG_SPAN = 100.0
# Values at or below this are zero on a log axis (float32 denormals and exact zeros: a
# zero-initialised LayerNorm bias gives update ratios of 1e7 and of 0).
TINY = float(np.finfo(np.float32).tiny)

LEGEND_MAX = 8


@dataclass(frozen=True)
class Apart:
    """The split of a histogram's values: `keep` marks those inside [low, high], the drawn
    range; the others are listed (index, value) and stated next to the chart."""

    keep: np.ndarray
    low: float
    high: float
    apart: list[tuple[int, float]] = field(default_factory=list)

    def statement(self, unit: str = "ms", what: str = "value", names: Sequence[str] | None = None) -> str:
        """One line saying what was left out of the range and why ('' when nothing was)."""
        if not self.apart:
            return ""
        shown = [(human_ms(v) if unit == "ms" else f"{_short(v)} {unit}") + (f" ({names[i]})" if names is not None else "") for i, v in self.apart[:5]]
        more = f" and {len(self.apart) - 5} more" if len(self.apart) > 5 else ""
        n = len(self.apart)
        return (f"{n} {what}{'s' if n != 1 else ''} drawn apart, outside the histogram's range: {', '.join(shown)}{more} "
                f"(beyond {FAR_IQR:g} interquartile ranges and {FAR_RATIO:g}x the median)")


def split_far(values: Sequence[float] | np.ndarray) -> Apart:
    """Which of `values` (finite ones; NaN/inf are never kept) a histogram leaves out of its
    range: the few far-out ones (see FAR_IQR, FAR_RATIO, MAX_APART_SHARE)."""
    v = np.asarray(values, dtype=float).reshape(-1)
    finite = np.isfinite(v)
    if finite.sum() < MIN_VALUES:
        kept = v[finite]
        return Apart(finite, float(kept.min()) if len(kept) else float("nan"), float(kept.max()) if len(kept) else float("nan"))
    body = v[finite]
    q1, median, q3 = np.percentile(body, [25, 50, 75])
    iqr = q3 - q1
    high = q3 + FAR_IQR * iqr
    low = q1 - FAR_IQR * iqr
    if median > 0:
        high = max(high, FAR_RATIO * median)
        low = min(low, median / FAR_RATIO)
    elif median < 0:
        low = min(low, FAR_RATIO * median)
        high = max(high, median / FAR_RATIO)
    out = finite & ((v > high) | (v < low))
    if out.sum() > max(1, int(MAX_APART_SHARE * finite.sum())):
        out[:] = False
    keep = finite & ~out
    order = np.flatnonzero(out)
    apart = sorted(((int(i), float(v[i])) for i in order), key=lambda p: -abs(p[1] - median))
    return Apart(keep, float(v[keep].min()), float(v[keep].max()), apart)


def wants_log(values: Iterable[float] | np.ndarray) -> bool:
    """A log axis when the positive, finite values span more than LOG_SPAN."""
    v = np.asarray(list(values) if not isinstance(values, np.ndarray) else values, dtype=float).reshape(-1)
    v = v[np.isfinite(v) & (v > TINY)]
    return bool(len(v) >= 2 and v.max() / v.min() > LOG_SPAN)


def for_log(values: Sequence[float | None] | np.ndarray) -> tuple[list[float | None], int]:
    """Values for a log axis: zeros, negatives and denormals become None (not drawn) and are
    counted, so the chart can say how many it left out."""
    out: list[float | None] = []
    dropped = 0
    for value in values:
        if value is None or not np.isfinite(value):
            out.append(None)
        elif value <= TINY:
            out.append(None)
            dropped += 1
        else:
            out.append(float(value))
    return out, dropped


def top_series(series: Mapping[str, Sequence[float | None]], n: int = LEGEND_MAX, *, keep: Iterable[str] = (),
               criterion: str = "max") -> tuple[list[str], str]:
    """The names of at most `n` series for a chart with a legend, ranked by `criterion`
    ("max", "last" or "mean" of each series' finite values), with every name in `keep` (the
    tensors a rule flagged) always among them; and the caption saying so ('' when all fit)."""
    def score(values: Sequence[float | None]) -> float:
        finite = [float(x) for x in values if x is not None and np.isfinite(x)]
        if not finite:
            return -np.inf
        return {"max": max(finite), "last": finite[-1], "mean": float(np.mean(finite))}[criterion]

    names = list(series)
    if len(names) <= n:
        return names, ""
    forced = [name for name in names if name in set(keep)]
    ranked = sorted((name for name in names if name not in set(forced)), key=lambda name: -score(series[name]))
    chosen = forced + ranked[: max(0, n - len(forced))]
    chosen = [name for name in names if name in set(chosen)]  # the input's order
    caption = f"top {len(chosen)} of {len(names)} by {criterion}" + (f", with the {len(forced)} a rule flagged" if forced else "")
    return chosen, caption


def human_ms(ms: float) -> str:
    """A duration in milliseconds as a person reads it: 8.3 s, 12.5 ms, 340 µs, 2 min 5 s."""
    if not np.isfinite(ms):
        return str(ms)
    if abs(ms) >= 60_000:
        minutes, seconds = divmod(ms / 1000, 60)
        return f"{int(minutes)} min {seconds:.0f} s"
    if abs(ms) >= 1000:
        return f"{ms / 1000:.3g} s"
    if abs(ms) >= 1 or ms == 0:
        return f"{ms:.3g} ms"
    return f"{ms * 1000:.3g} µs"


def _short(value: float) -> str:
    return f"{value:.4g}"
