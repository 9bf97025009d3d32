"""Static SVG charts, drawn from Python so that a page needs no script, no CDN and no network.

Every chart is a self-contained <svg> element with a viewBox (it scales with the page) and a
<title> for screen readers. Every piece of text that reaches the SVG goes through markupsafe's
escape: labels come from records (benchmark and framework names, versions) and must stay inert.
Numbers are formatted here, so no value from a record is ever written unescaped.

The chart kinds are the few the site needs:
  hbar_chart   horizontal bars with optional whiskers (throughput with its CI, first-iteration
               time, energy per sample, ratio of a comparison)
  box_chart    iteration-time distributions: box = quartiles, whiskers = min/max, dots = medians
               of the repeats (the independent units)
  line_chart   y against x per series, with optional error bars (scaling with batch size)
  time_chart   a telemetry series over a run's repeats laid side by side, measured windows and
               throttle episodes shaded
  date_chart   a history series over dates, change points marked
"""

from __future__ import annotations

import functools
import itertools
import math
from dataclasses import dataclass, field
from datetime import datetime
from typing import Sequence

import numpy as np
from markupsafe import Markup, escape

# Colour-blind-safe categorical palette (Okabe & Ito), assigned to names in sorted order.
PALETTE = ("#0072B2", "#E69F00", "#009E73", "#CC79A7", "#56B4E9", "#D55E00", "#F0E442", "#000000")

FONT = 12  # px in viewBox units; charts are drawn at their natural width, so this stays legible
CHAR_W = 6.6  # approximate width of one character at FONT, for laying out labels


def colour_for(name: str, names: Sequence[str]) -> str:
    """The same name gets the same colour on every chart of a page (names: all names on the page)."""
    ordered = sorted(set(names))
    return PALETTE[ordered.index(name) % len(PALETTE)] if name in ordered else PALETTE[-1]


def fmt(value: float | None, digits: int = 3) -> str:
    """A number for a label: `digits` significant digits, thousands grouped, no exponent below 1e9."""
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "–"
    if value == 0:
        return "0"
    magnitude = math.floor(math.log10(abs(value)))
    decimals = max(0, digits - 1 - magnitude)
    if abs(value) >= 1e9:
        return f"{value:.{digits - 1}e}"
    return f"{value:,.{decimals}f}"


def fmt_tick(value: float) -> str:
    """A tick label: as many digits as the tick has and no more (0.2, 1, 1,500)."""
    text = fmt(value, 6)
    if "." in text and "e" not in text:
        text = text.rstrip("0").rstrip(".")
    return text


def nice_ticks(lo: float, hi: float, count: int = 5) -> list[float]:
    """Round tick values covering [lo, hi]: steps of 1, 2 or 5 times a power of ten."""
    if not (math.isfinite(lo) and math.isfinite(hi)):
        return [0.0]
    if hi <= lo:
        hi = lo + (abs(lo) or 1.0)
    raw = (hi - lo) / max(count, 1)
    power = 10 ** math.floor(math.log10(raw))
    step = next(m * power for m in (1, 2, 5, 10) if m * power >= raw)
    first = math.floor(lo / step) * step
    ticks = []
    t = first
    while t <= hi + step * 1e-9:
        ticks.append(round(t, 12))
        t += step
    if ticks[-1] < hi:
        ticks.append(round(t, 12))
    return ticks


def log_ticks(lo: float, hi: float) -> list[float]:
    """Powers of ten (and 2x, 5x between them when the range is short) covering [lo, hi] > 0."""
    start, stop = math.floor(math.log10(lo)), math.ceil(math.log10(hi))
    multipliers = (1, 2, 5) if stop - start <= 2 else (1,)
    ticks = [m * 10**e for e in range(start, stop + 1) for m in multipliers]
    inside = [t for t in ticks if lo <= t <= hi]
    below = [t for t in ticks if t < lo]
    above = [t for t in ticks if t > hi]
    return ([below[-1]] if below else []) + inside + ([above[0]] if above else [])


@dataclass
class Scale:
    """Maps data values to pixels on one axis, linearly or logarithmically."""

    lo: float
    hi: float
    px_lo: float
    px_hi: float
    log: bool = False

    def __call__(self, v: float) -> float:
        if self.log:
            v, lo, hi = math.log10(max(v, 1e-300)), math.log10(self.lo), math.log10(self.hi)
        else:
            lo, hi = self.lo, self.hi
        span = (hi - lo) or 1.0
        return self.px_lo + (v - lo) / span * (self.px_hi - self.px_lo)


def value_scale(values: Sequence[float], px_lo: float, px_hi: float, zero: bool = True,
                log: bool | None = None) -> tuple[Scale, list[float]]:
    """A scale and its ticks for positive-or-any values; log when asked, or (log=None) when the
    values span more than 30x (iteration times of different frameworks often do)."""
    finite = [v for v in values if v is not None and math.isfinite(v)]
    if not finite:
        finite = [0.0, 1.0]
    lo, hi = min(finite), max(finite)
    if log is None:
        log = lo > 0 and hi / lo > 30
    if log and lo > 0:
        ticks = log_ticks(lo, hi)
        return Scale(ticks[0], ticks[-1], px_lo, px_hi, log=True), ticks
    if zero:
        lo = min(lo, 0.0)
    ticks = nice_ticks(lo, hi)
    return Scale(ticks[0], ticks[-1], px_lo, px_hi), ticks


def _svg(width: float, height: float, title: str, body: list[str], css_class: str = "chart") -> Markup:
    label = escape(title)
    return Markup(
        f'<svg class="{css_class}" viewBox="0 0 {width:.0f} {height:.0f}" width="{width:.0f}" '
        f'role="img" aria-label="{label}" xmlns="http://www.w3.org/2000/svg">'
        f"<title>{label}</title>{''.join(body)}</svg>"
    )


def _text(x: float, y: float, content: str, anchor: str = "start", css: str = "", size: int = FONT) -> str:
    cls = f' class="{css}"' if css else ""
    return (f'<text x="{x:.1f}" y="{y:.1f}" font-size="{size}" text-anchor="{anchor}"{cls}>'
            f"{escape(content)}</text>")


def _y_label(middle: float, content: str) -> str:
    """The y axis's label, written upwards along the left edge, centred on `middle` (pixels)."""
    return (f'<text x="12" y="{middle:.1f}" font-size="{FONT}" text-anchor="middle" class="axis" '
            f'transform="rotate(-90 12 {middle:.1f})">{escape(content)}</text>')


def _truncate(label: str, chars: int) -> str:
    return label if len(label) <= chars else label[: max(chars - 1, 1)] + "…"


def empty_chart(message: str, width: float = 640, height: float = 48) -> Markup:
    """A visible placeholder that says why there is nothing to draw."""
    return _svg(width, height, message, [
        f'<rect x="0.5" y="0.5" width="{width - 1:.0f}" height="{height - 1:.0f}" class="frame"/>',
        _text(width / 2, height / 2 + 4, message, "middle", "muted"),
    ], "chart empty")


# ------------------------------------------------------------------ horizontal bars


@dataclass
class Bar:
    label: str
    value: float | None
    low: float | None = None  # whisker, e.g. the lower end of a confidence interval
    high: float | None = None
    colour: str = PALETTE[0]
    note: str = ""  # printed after the value (e.g. "±3%", "failed")


def hbar_chart(bars: list[Bar], title: str, unit: str, reference: float | None = None,
               width: float = 640) -> Markup:
    """One bar per item, value printed at the right; whiskers from low to high where given;
    `reference` draws a vertical line (e.g. ratio 1.0)."""
    if not bars:
        return empty_chart(f"{title}: nothing measured")
    row, top, bottom = 22, 8, 30
    label_w = min(max(CHAR_W * max(len(b.label) for b in bars) + 12, 80), 240)
    value_w = 150
    plot_l, plot_r = label_w, width - value_w
    height = top + row * len(bars) + bottom
    values = [v for b in bars for v in (b.value, b.high, reference) if v is not None]
    scale, ticks = value_scale(values or [0.0, 1.0], plot_l, plot_r, zero=True, log=False)
    body = [f'<rect x="{plot_l:.1f}" y="{top}" width="{plot_r - plot_l:.1f}" height="{row * len(bars)}" class="plot"/>']
    for t in ticks:
        x = scale(t)
        body.append(f'<line x1="{x:.1f}" y1="{top}" x2="{x:.1f}" y2="{top + row * len(bars)}" class="grid"/>')
        body.append(_text(x, height - bottom + 15, fmt_tick(t), "middle", "tick"))
    body.append(_text((plot_l + plot_r) / 2, height - 4, unit, "middle", "axis"))
    for i, b in enumerate(bars):
        y = top + i * row
        body.append(_text(label_w - 6, y + row / 2 + 4, _truncate(b.label, int((label_w - 12) / CHAR_W)), "end"))
        if b.value is None:
            body.append(_text(plot_l + 4, y + row / 2 + 4, b.note or "not measured", "start", "muted"))
            continue
        x0, x1 = scale(max(scale.lo, 0.0)), scale(b.value)
        body.append(f'<rect x="{min(x0, x1):.1f}" y="{y + 4}" width="{max(abs(x1 - x0), 1):.1f}" '
                    f'height="{row - 8}" fill="{b.colour}" class="bar"/>')
        if b.low is not None and b.high is not None:
            lo, hi, mid = scale(b.low), scale(b.high), y + row / 2
            body.append(f'<path d="M{lo:.1f},{mid:.1f}H{hi:.1f}M{lo:.1f},{mid - 5:.1f}V{mid + 5:.1f}'
                        f'M{hi:.1f},{mid - 5:.1f}V{mid + 5:.1f}" class="whisker"/>')
        text = fmt(b.value) + (f" {b.note}" if b.note else "")
        body.append(_text(plot_r + 6, y + row / 2 + 4, text, "start", "value"))
    if reference is not None:
        x = scale(reference)
        body.append(f'<line x1="{x:.1f}" y1="{top - 4}" x2="{x:.1f}" y2="{top + row * len(bars) + 4}" class="reference"/>')
    return _svg(width, height, title, body)


# ------------------------------------------------------------------ distributions


@dataclass
class Box:
    label: str
    minimum: float
    q1: float
    median: float
    q3: float
    maximum: float
    points: list[float] = field(default_factory=list)  # drawn as dots (repeat medians)
    colour: str = PALETTE[0]


def box_chart(boxes: list[Box], title: str, unit: str, width: float = 640) -> Markup:
    if not boxes:
        return empty_chart(f"{title}: nothing measured")
    row, top, bottom = 26, 8, 30
    label_w = min(max(CHAR_W * max(len(b.label) for b in boxes) + 12, 80), 240)
    plot_l, plot_r = label_w, width - 90
    height = top + row * len(boxes) + bottom
    values = [v for b in boxes for v in (b.minimum, b.maximum)]
    scale, ticks = value_scale(values, plot_l, plot_r, zero=False)
    body = [f'<rect x="{plot_l:.1f}" y="{top}" width="{plot_r - plot_l:.1f}" height="{row * len(boxes)}" class="plot"/>']
    for t in ticks:
        x = scale(t)
        body.append(f'<line x1="{x:.1f}" y1="{top}" x2="{x:.1f}" y2="{top + row * len(boxes)}" class="grid"/>')
        body.append(_text(x, height - bottom + 15, fmt_tick(t), "middle", "tick"))
    body.append(_text((plot_l + plot_r) / 2, height - 4, unit + (" (log scale)" if scale.log else ""), "middle", "axis"))
    for i, b in enumerate(boxes):
        y, mid = top + i * row, top + i * row + row / 2
        lo, q1, med, q3, hi = (scale(v) for v in (b.minimum, b.q1, b.median, b.q3, b.maximum))
        body.append(_text(label_w - 6, mid + 4, _truncate(b.label, int((label_w - 12) / CHAR_W)), "end"))
        body.append(f'<path d="M{lo:.1f},{mid:.1f}H{q1:.1f}M{q3:.1f},{mid:.1f}H{hi:.1f}'
                    f'M{lo:.1f},{mid - 4:.1f}V{mid + 4:.1f}M{hi:.1f},{mid - 4:.1f}V{mid + 4:.1f}" class="whisker"/>')
        body.append(f'<rect x="{q1:.1f}" y="{y + 5}" width="{max(q3 - q1, 1):.1f}" height="{row - 10}" '
                    f'fill="{b.colour}" class="box"/>')
        body.append(f'<line x1="{med:.1f}" y1="{y + 3}" x2="{med:.1f}" y2="{y + row - 3}" class="median"/>')
        for p in b.points:
            body.append(f'<circle cx="{scale(p):.1f}" cy="{mid:.1f}" r="2.6" class="point"/>')
        body.append(_text(plot_r + 6, mid + 4, fmt(b.median), "start", "value"))
    return _svg(width, height, title, body)


# ------------------------------------------------------------------ lines


@dataclass
class Point:
    x: float
    y: float
    low: float | None = None
    high: float | None = None


@dataclass
class Series:
    name: str
    points: list[Point]
    colour: str = PALETTE[0]


def _legend(series: list[Series], x: float, y: float) -> list[str]:
    body = []
    for s in series:
        body.append(f'<rect x="{x:.1f}" y="{y - 9:.1f}" width="10" height="10" fill="{s.colour}"/>')
        label = _truncate(s.name, 28)
        body.append(_text(x + 14, y, label))
        x += 14 + CHAR_W * len(label) + 16
    return body


def _y_grid(left: float, right_x: float, top: float, bottom_y: float, y_scale, y_ticks) -> list[str]:
    """The plot area from (left, top) to (right_x, bottom_y), and a grid line labelled at each y tick."""
    body = [f'<rect x="{left}" y="{top}" width="{right_x - left}" height="{bottom_y - top}" class="plot"/>']
    for t in y_ticks:
        y = y_scale(t)
        body.append(f'<line x1="{left}" y1="{y:.1f}" x2="{right_x}" y2="{y:.1f}" class="grid"/>')
        body.append(_text(left - 5, y + 4, fmt_tick(t), "end", "tick"))
    return body


def _x_grid(ticks: list[tuple[float, str]], top: float, bottom_y: float) -> list[str]:
    """A grid line at each (x, label), labelled under the plot."""
    body = []
    for x, label in ticks:
        body.append(f'<line x1="{x:.1f}" y1="{top}" x2="{x:.1f}" y2="{bottom_y}" class="grid"/>')
        body.append(_text(x, bottom_y + 15, label, "middle", "tick"))
    return body


def _series_lines(series: list[Series], x_of, y_scale) -> list[str]:
    """Each series as a line through its points in x order, a marker at each, and an error bar
    where a point has its low and high."""
    body = []
    for s in series:
        pts = sorted(s.points, key=lambda p: p.x)
        coords = " ".join(f"{x_of(p.x):.1f},{y_scale(p.y):.1f}" for p in pts)
        if len(pts) > 1:
            body.append(f'<polyline points="{coords}" fill="none" stroke="{s.colour}" class="line"/>')
        for p in pts:
            x, y = x_of(p.x), y_scale(p.y)
            if p.low is not None and p.high is not None:
                lo, hi = y_scale(p.low), y_scale(p.high)
                body.append(f'<path d="M{x:.1f},{lo:.1f}V{hi:.1f}M{x - 4:.1f},{lo:.1f}H{x + 4:.1f}'
                            f'M{x - 4:.1f},{hi:.1f}H{x + 4:.1f}" stroke="{s.colour}" class="errorbar"/>')
            body.append(f'<circle cx="{x:.1f}" cy="{y:.1f}" r="3.2" fill="{s.colour}" class="marker"/>')
    return body


def line_chart(series: list[Series], title: str, x_label: str, y_label: str, log_x: bool = False,
               width: float = 640, height: float = 280) -> Markup:
    points = [p for s in series for p in s.points]
    if not points:
        return empty_chart(f"{title}: nothing measured")
    left, right, top, bottom = 64, 16, 28, 40
    xs = [p.x for p in points]
    if log_x and min(xs) > 0:
        lo, hi = min(xs), max(xs)
        if lo == hi:
            lo, hi = lo / 2, hi * 2
        x_ticks = [2.0 ** e for e in range(math.floor(math.log2(lo)), math.ceil(math.log2(hi)) + 1)]
        if len(x_ticks) > 10:
            x_ticks = x_ticks[::math.ceil(len(x_ticks) / 10)]
        xs_scale = Scale(min(x_ticks[0], lo), max(x_ticks[-1], hi), left, width - right, log=True)
    else:
        xs_scale, x_ticks = value_scale(xs, left, width - right, zero=False, log=False)
    ys = [v for p in points for v in (p.y, p.high, p.low) if v is not None]
    y_scale, y_ticks = value_scale(ys, height - bottom, top, zero=True, log=False)
    body = _y_grid(left, width - right, top, height - bottom, y_scale, y_ticks)
    body += _x_grid([(xs_scale(t), fmt_tick(t)) for t in x_ticks], top, height - bottom)
    body.append(_text((left + width - right) / 2, height - 6, x_label, "middle", "axis"))
    body.append(_y_label((top + height - bottom) / 2, y_label))
    body += _series_lines(series, xs_scale, y_scale)
    body.extend(_legend(series, left, 16))
    return _svg(width, height, title, body)


def percentile_chart(series: list[Series], title: str, y_label: str, width: float = 640,
                     height: float = 260) -> Markup:
    """Latency against percentile (LoadGen's 50th ... 99.9th), one line per series; the percentiles
    sit at even steps (their labels name them), the latency axis turns logarithmic past a 30x span."""
    percentiles = sorted({p.x for s in series for p in s.points})
    if not percentiles:
        return empty_chart(f"{title}: nothing measured")
    left, right, top, bottom = 64, 16, 28, 40
    step = (width - left - right) / max(len(percentiles) - 1, 1)
    x_of = {pct: left + (i * step if len(percentiles) > 1 else (width - left - right) / 2)
            for i, pct in enumerate(percentiles)}
    y_scale, y_ticks = value_scale([p.y for s in series for p in s.points], height - bottom, top, zero=True)
    body = _y_grid(left, width - right, top, height - bottom, y_scale, y_ticks)
    body += _x_grid([(x, f"p{fmt_tick(pct)}") for pct, x in x_of.items()], top, height - bottom)
    body.append(_text((left + width - right) / 2, height - 6, "percentile of LoadGen's per-sample latencies",
                      "middle", "axis"))
    body.append(_y_label((top + height - bottom) / 2, y_label))
    body += _series_lines(series, x_of.__getitem__, y_scale)
    body.extend(_legend(series, left, 16))
    return _svg(width, height, title, body)


# ------------------------------------------------------------------ telemetry over time


@dataclass
class Segment:
    """One repeat's stretch of telemetry: seconds since its first sample and, per line, one value
    per sample (None = a gap, where the line breaks)."""

    label: str
    t_s: Sequence[float] | np.ndarray
    lines: dict[str, Sequence[float | None] | np.ndarray]
    windows: list[tuple[float, float]] = field(default_factory=list)  # measured windows, shaded
    episodes: list[tuple[float, float]] = field(default_factory=list)  # throttle episodes, shaded


POINTS_PER_PX = 1.0  # min and max of each bucket of ~2 px: as much as a screen shows, spikes kept


def thin(t: np.ndarray, v: np.ndarray, buckets: int) -> tuple[np.ndarray, np.ndarray]:
    """At most 2 * buckets points: each bucket's minimum and maximum, in time order, so that a
    one-sample spike survives; an all-gap bucket stays a gap (NaN)."""
    n = t.size
    if n <= 2 * buckets:
        return t, v
    size = math.ceil(n / buckets)
    pad = size * buckets - n
    tt = np.concatenate([t, np.full(pad, t[-1])]).reshape(buckets, size)
    vv = np.concatenate([v, np.full(pad, np.nan)]).reshape(buckets, size)
    empty = np.all(np.isnan(vv), axis=1)
    filled = np.where(np.isnan(vv), 0.0, vv)
    lo_i = np.argmin(np.where(np.isnan(vv), np.inf, filled), axis=1)
    hi_i = np.argmax(np.where(np.isnan(vv), -np.inf, filled), axis=1)
    first, second = np.minimum(lo_i, hi_i), np.maximum(lo_i, hi_i)
    rows = np.arange(buckets)
    out_t = np.column_stack([tt[rows, first], tt[rows, second]]).ravel()
    out_v = np.column_stack([vv[rows, first], vv[rows, second]]).ravel()
    out_v[np.repeat(empty, 2)] = np.nan
    return out_t, out_v


def _line_path(x: np.ndarray, y: np.ndarray, bounds: list[int], colour: str) -> list[str]:
    """One <path> for a whole line (px coordinates) drawn over several segments, x[bounds[i]:
    bounds[i + 1]] being one repeat's: a moveto per stretch without gaps (NaN) within a segment,
    whose further coordinate pairs are implicit linetos; a lone sample between gaps is a dot.
    The segments are converted together, in a few numpy calls whatever their number."""
    finite = ~np.isnan(y)
    xy = np.empty(2 * y.size, dtype=np.int64)
    if finite.all():
        xy[0::2], xy[1::2] = np.rint(x * 10), np.rint(y * 10)
        return _path_text(xy.tolist(), _whole(bounds), colour)
    if not finite.any():
        return []
    stretches = []
    for a, b in zip(bounds, bounds[1:]):
        edges = np.flatnonzero(np.diff(np.concatenate([[0], finite[a:b].astype(np.int8), [0]]))).tolist()
        stretches += [(a + e0, a + e1) for e0, e1 in zip(edges[::2], edges[1::2])]
    xy[0::2], xy[1::2] = np.rint(np.where(finite, x, 0) * 10), np.rint(np.where(finite, y, 0) * 10)
    return _path_text(xy.tolist(), stretches, colour)


def _whole(bounds: list[int]) -> list[tuple[int, int]]:
    return [(a, b) for a, b in zip(bounds, bounds[1:]) if b > a]


def _path_text(xy: list[int], stretches: list[tuple[int, int]], colour: str) -> list[str]:
    """The <path> (and dots) of a line from its coordinates in tenths of a px, x and y interleaved.

    Coordinates are written as integers in tenths of a unit under transform="scale(.1)" (the
    stroke keeps its width: vector-effect in the stylesheet): ints turn into text several times
    faster than floats, and telemetry pages have many lines."""
    parts, dots = [], []
    for a, b in stretches:
        if b - a == 1:
            dots.append(f'<circle cx="{xy[2 * a] / 10:.1f}" cy="{xy[2 * a + 1] / 10:.1f}" r="2" fill="{colour}"/>')
        else:
            pairs = xy[2 * a:2 * b]  # "x,y,x,y,...": %-formatting is ~2x faster than str(list)
            parts.append("M" + ("%d," * len(pairs))[:-1] % tuple(pairs))
    path = [f'<path d="{" ".join(parts)}" transform="scale(.1)" fill="none" stroke="{colour}" class="line"/>'] if parts else []
    return path + dots


def _column(values) -> np.ndarray:
    if type(values) is np.ndarray and values.dtype == np.float64:
        return values  # as the telemetry panels pass them
    return np.asarray(values, dtype=float)  # None reads as NaN: a gap


@dataclass
class Track:
    """One repeat on a shared time axis: its sample times, measured windows and throttle episodes."""

    label: str
    t_s: Sequence[float] | np.ndarray
    windows: list[tuple[float, float]] = field(default_factory=list)
    episodes: list[tuple[float, float]] = field(default_factory=list)


@dataclass
class Panel:
    """One quantity over the tracks: line name -> values per track (None where a repeat lacks it)."""

    title: str
    unit: str
    lines: dict[str, list]
    colours: dict[str, str]


def time_chart(segments: list[Segment], title: str, unit: str, colours: dict[str, str] | str = PALETTE[0],
               width: float = 640, height: float = 150, gap_s: float | None = None,
               x_label: str = "seconds from each repeat's first sample") -> Markup:
    """Segments side by side on one time axis (each starts after the previous one ends); several
    lines share the axes when a segment has several (named in a legend)."""
    names = list(dict.fromkeys(name for seg in segments for name in seg.lines))
    colour = colours if isinstance(colours, dict) else {n: colours for n in names}
    tracks = [Track(seg.label, seg.t_s, seg.windows, seg.episodes) for seg in segments]
    panel = Panel("", unit, {n: [seg.lines.get(n) for seg in segments] for n in names}, colour)
    return time_panels(tracks, [panel], title, width, height - 40, gap_s, x_label)


def time_panels(tracks: list[Track], panels: list[Panel], title: str, width: float = 640,
                panel_height: float = 110, gap_s: float | None = None,
                x_label: str = "seconds from each repeat's first sample") -> Markup:
    """Panels stacked on one time axis: the repeats side by side (each starts after the previous
    one ends), the measured windows and throttle episodes shaded across every panel, so that a
    clock drop lines up with the power and temperature around it. The layout of the axis is
    computed once for all panels."""
    columns = [[{name: None if vals[k] is None else _column(vals[k]) for name, vals in p.lines.items()}
                for k in range(len(tracks))] for p in panels]
    ranges = [_finite_range([c for per_track in cols for c in per_track.values() if c is not None]) for cols in columns]
    drawn = [i for i, r in enumerate(ranges) if r is not None]
    if not drawn:
        return empty_chart(f"{title}: no samples")
    panels, columns, ranges = [panels[i] for i in drawn], [columns[i] for i in drawn], [ranges[i] for i in drawn]
    left, right = 64, 16
    titled = len(panels) > 1
    times = [np.asarray(t.t_s, dtype=float) for t in tracks]
    spans = [float(t[-1] - t[0]) if len(t) > 1 else 0.0 for t in times]
    gap = gap_s if gap_s is not None else max(sum(spans) * 0.02, 0.05)
    offsets, total = [], 0.0
    for span in spans:
        offsets.append(total)
        total += span + gap
    total -= gap
    x_scale = Scale(0.0, total or 1.0, left, width - right)
    px_per_s = (width - left - right) / (total or 1.0)
    # shared by every panel: x positions of the shading, the separators, the repeats' labels and the data
    shading = []
    for track, t, offset in zip(tracks, times, offsets):
        t0 = float(t[0]) if len(t) else 0.0
        for css, spans_ in (("window", track.windows), ("throttle", track.episodes)):
            for a, b in spans_:
                xa = min(max(x_scale(offset + a - t0), left), width - right)
                xb = min(max(x_scale(offset + b - t0), left), width - right)
                shading.append((css, xa, max(xb - xa, 1.5)))
    separators = [x_scale(offset - gap / 2) for offset in offsets[1:]]
    # what every panel draws alike but at its own height, as format strings of its top and bottom:
    # behind the ticks the plot area and the shading, over them the separators and repeat labels
    behind = "".join([f'<rect x="{left}" y="{{top}}" width="{width - left - right}" height="{panel_height}" class="plot"/>',
                      *(f'<rect x="{xa:.1f}" y="{{top}}" width="{w:.1f}" height="{panel_height}" class="{css}"/>'
                        for css, xa, w in shading)])
    between = "".join([*(f'<line x1="{x:.1f}" y1="{{top}}" x2="{x:.1f}" y2="{{bottom}}" class="separator"/>'
                         for x in separators),
                       *(f'<text x="{x_scale(offset) + 3:.1f}" y="{{label}}" font-size="{FONT}" text-anchor="start" '
                         f'class="tick">{_braces(escape(track.label))}</text>' for track, offset in zip(tracks, offsets))])
    x_of = [left + (offset + (t - t[0])) * px_per_s if len(t) else t for t, offset in zip(times, offsets)]
    buckets = [max(8, int(span * px_per_s * POINTS_PER_PX / 2)) for span in spans]

    # the frame of each panel and where its lines go
    frames, lines = [], []
    y0 = 0.0
    for panel, cols, (lo, hi) in zip(panels, columns, ranges):
        names = list(panel.lines)
        header = 16 if titled or len(names) > 1 else 0
        top, plot_h = y0 + header + 6, panel_height
        frame = []
        if titled:
            frame.append(_text(left, y0 + 14, panel.title, "start", "panel-title"))
        if len(names) > 1:
            legend_x = left + (CHAR_W * (len(panel.title) + 3) if titled else 0)
            frame.extend(_legend([Series(n, [], panel.colours.get(n, PALETTE[0])) for n in names], legend_x, y0 + 14))
        y_scale, y_ticks = value_scale([lo, hi], top + plot_h, top, zero=True, log=False)
        y_factor = (y_scale.px_hi - y_scale.px_lo) / ((y_scale.hi - y_scale.lo) or 1.0)
        edges = {"top": f"{top:.1f}", "bottom": f"{top + plot_h:.1f}", "label": f"{top + 12:.1f}"}
        frame.append(behind.format_map(edges))
        for t in y_ticks:
            y = y_scale(t)
            frame.append(f'<line x1="{left}" y1="{y:.1f}" x2="{width - right}" y2="{y:.1f}" class="grid"/>'
                         f'<text x="{left - 5:.1f}" y="{y + 4:.1f}" font-size="{FONT}" text-anchor="end" '
                         f'class="tick">{_tick_label(t)}</text>')
        frame.append(between.format_map(edges))
        frames.append((frame, _y_label(top + plot_h / 2, panel.unit)))
        lines.append([(cols, name, panel.colours.get(name, PALETTE[0]), y_scale.px_lo, y_scale.lo, y_factor)
                      for name in names])
        y0 = top + plot_h + 8
    drawn_lines = _draw_lines(lines, times, x_of, buckets)

    body: list[str] = []
    for (frame, unit_label), panel_lines in zip(frames, drawn_lines):
        body.extend(frame)
        for svg in panel_lines:
            body.extend(svg)
        body.append(unit_label)
    height = y0 + 18
    body.append(_text(width - right, height - 4, x_label, "end", "axis"))
    return _svg(width, height, title, body)


def _braces(text: str) -> str:
    """Text for a str.format template, shown as it is."""
    return text.replace("{", "{{").replace("}", "}}")


def _finite_range(columns: list[np.ndarray]) -> tuple[float, float] | None:
    """(min, max) over the columns' values that are not NaN; None when there is none."""
    if not columns:
        return None
    values = np.concatenate(columns) if len(columns) > 1 else columns[0]
    lo = np.fmin.reduce(values) if values.size else np.nan  # fmin, fmax: NaN only where every value is
    return None if np.isnan(lo) else (float(lo), float(np.fmax.reduce(values)))


@functools.lru_cache(maxsize=4096, typed=True)
def _tick_label(value: float) -> str:
    return str(escape(fmt_tick(value)))


def _draw_lines(lines: list[list[tuple]], times: list[np.ndarray], x_of: list[np.ndarray],
                buckets: list[int]) -> list[list[list[str]]]:
    """The SVG of every line of every panel, in order: lines[panel] = [(columns per track, name,
    colour, px_lo, lo, factor)], y in px being px_lo + (value - lo) * factor.

    A telemetry chart has a dozen lines over the same few repeats, and most are sampled in full,
    with no gap and no need of thinning: those are converted to text together, as the rows of one
    array (a few numpy calls for the chart, not per line); the others one by one."""
    full = [len(t) for t in times]
    thinned = [n > 2 * b for n, b in zip(full, buckets)]
    bounds = [0, *itertools.accumulate(full)]
    out = [[[] for _ in panel] for panel in lines]
    together = []  # (panel, line, values)
    for i, panel in enumerate(lines):
        for j, (cols, name, colour, px_lo, lo, factor) in enumerate(panel):
            values = [cols[k].get(name) for k in range(len(times))]
            if not any(thinned) and all(v is not None and len(v) == n for v, n in zip(values, full)) and bounds[-1]:
                together.append((i, j, values))
                continue
            xs, ys = [], []  # per repeat: the line breaks between repeats
            for k, t in enumerate(times):
                v = values[k]
                if v is None or not len(t) or len(v) != len(t):
                    continue
                tt, vv = thin(x_of[k], v, buckets[k])
                xs.append(tt)
                ys.append(vv)
            if xs:
                x, y = (np.concatenate(xs), np.concatenate(ys)) if len(xs) > 1 else (xs[0], ys[0])
                out[i][j] = _line_path(x, px_lo + (y - lo) * factor, [0, *itertools.accumulate(len(v) for v in ys)],
                                       colour)
    if together:
        x = np.concatenate(x_of) if len(x_of) > 1 else x_of[0]
        y = np.empty((len(together), bounds[-1]))
        for row, (i, j, values) in enumerate(together):
            for k, v in enumerate(values):
                y[row, bounds[k]:bounds[k + 1]] = v
        _, _, _, px_lo, lo, factor = zip(*(lines[i][j] for i, j, _ in together))
        y = np.array(px_lo)[:, None] + (y - np.array(lo)[:, None]) * np.array(factor)[:, None]
        gaps = np.isnan(y).any(axis=1)
        xy = np.empty((len(together), 2 * bounds[-1]), dtype=np.int64)
        xy[:, 0::2] = np.rint(x * 10)
        xy[:, 1::2] = np.rint(np.where(gaps[:, None], 0, y) * 10)
        stretches = _whole(bounds)
        for (i, j, _), row, xy_row, gap in zip(together, y, xy.tolist(), gaps.tolist()):
            colour = lines[i][j][2]
            out[i][j] = _line_path(x, row, bounds, colour) if gap else _path_text(xy_row, stretches, colour)
    return out


# ------------------------------------------------------------------ history over dates


@dataclass
class DatedPoint:
    when: datetime
    value: float
    label: str = ""  # e.g. the framework version, shown where it changes


@dataclass
class ChangeMark:
    when: datetime
    text: str  # e.g. "-9.8%"


def date_chart(points: list[DatedPoint], marks: list[ChangeMark], title: str, unit: str,
               colour: str = PALETTE[0], width: float = 640, height: float = 180) -> Markup:
    if not points:
        return empty_chart(f"{title}: no successful run")
    left, right, top, bottom = 64, 16, 22, 34
    points = sorted(points, key=lambda p: p.when)
    times = [p.when.timestamp() for p in points]
    lo, hi = min(times), max(times)
    if hi == lo:
        lo, hi = lo - 43200, hi + 43200
    pad = (hi - lo) * 0.03
    x_scale = Scale(lo - pad, hi + pad, left, width - right)
    y_scale, y_ticks = value_scale([p.value for p in points], height - bottom, top, zero=True, log=False)
    plot_h = height - top - bottom
    body = _y_grid(left, width - right, top, height - bottom, y_scale, y_ticks)
    for frac, anchor in ((0.0, "start"), (0.5, "middle"), (1.0, "end")):
        when = lo + (hi - lo) * frac
        label = datetime.fromtimestamp(when, tz=points[0].when.tzinfo).strftime("%Y-%m-%d")
        body.append(_text(x_scale(when), height - bottom + 15, label, anchor, "tick"))
    for m in marks:
        x = x_scale(m.when.timestamp())
        body.append(f'<line x1="{x:.1f}" y1="{top}" x2="{x:.1f}" y2="{top + plot_h}" class="change"/>')
        body.append(_text(x + 3, top - 6, m.text, "start", "change-label"))
    coords = " ".join(f"{x_scale(t):.1f},{y_scale(p.value):.1f}" for t, p in zip(times, points))
    if len(points) > 1:
        body.append(f'<polyline points="{coords}" fill="none" stroke="{colour}" class="line"/>')
    previous = None
    for t, p in zip(times, points):
        x, y = x_scale(t), y_scale(p.value)
        body.append(f'<circle cx="{x:.1f}" cy="{y:.1f}" r="2.6" fill="{colour}" class="marker"/>')
        if p.label and p.label != previous:
            body.append(_text(x, height - bottom - 4, p.label, "start", "version"))
        previous = p.label
    body.append(_y_label(top + plot_h / 2, unit))
    return _svg(width, height, title, body)
