"""Plots as inline SVG strings: a line over volume bars, paired histograms, stacked bars.

Pure drawing: numbers and already formatted words in, markup out, nothing read from a
report here. Every data mark carries class `mark` and an SVG `<title>` (the browser's own
tooltip, so the page needs no JavaScript); every text is escaped here. A plot with
nothing to draw returns None and the caller writes "no data" in its place. Value axes
tick at round steps (1, 2 or 5 x 10^n, see `ticks`) and end at the first tick at or above
the largest value.
"""

from __future__ import annotations

import html
import math
from collections.abc import Sequence
from dataclasses import dataclass

W, H = 640, 230  # one viewBox for every plot; CSS scales it to the column
LEFT, RIGHT, TOP, BOTTOM = 54, 14, 30, 44
LABEL_W = 170  # room for row labels in horizontal bars
LABEL_CHARS = 22  # what fits in it at 12px (longer labels lose their middle)
ROW_H = 26
DEFAULT_COLOR = "#4c78a8"
VOLUME_COLOR = "#98a2b3"


@dataclass(frozen=True)
class Segment:
    """One piece of a stacked bar: its length and its tooltip."""

    value: float
    tip: str


@dataclass(frozen=True)
class Row:
    """One stacked horizontal bar; `total` is written after it."""

    label: str
    segments: Sequence[Segment]
    total: str


@dataclass(frozen=True)
class Point:
    """One time bucket: a rate (None where nothing happened) over a volume bar."""

    label: str
    rate: float | None
    volume: float
    tip: str


@dataclass(frozen=True)
class Series:
    """Counts per bucket for one group of a histogram."""

    name: str
    color: str
    counts: Sequence[float]


def line_plot(plot_id: str, points: Sequence[Point], color: str) -> str | None:
    """A 0-100% line (broken where a bucket has no rate) drawn over faint volume bars."""
    if all(point.rate is None for point in points):
        return None
    plot_w, plot_h = W - LEFT - RIGHT, H - TOP - BOTTOM
    slot, busiest = plot_w / len(points), max(p.volume for p in points) or 1
    bars, dots, path, pen_down = [], [], [], False
    for i, point in enumerate(points):
        x, bar_h = LEFT + (i + 0.5) * slot, point.volume / busiest * plot_h
        top_y = TOP + plot_h - bar_h
        bars.append(
            _rect(x - slot * 0.4, top_y, slot * 0.8, bar_h, VOLUME_COLOR, point.tip, "volume")
        )
        if point.rate is None:
            pen_down = False
            continue
        y = TOP + (1 - point.rate) * plot_h
        path.append(f"{'L' if pen_down else 'M'}{x:.1f},{y:.1f}")
        pen_down = True
        dots.append(
            f'<circle class="mark point" cx="{x:.1f}" cy="{y:.1f}" r="3.5" fill="{color}">'
            f"<title>{_e(point.tip)}</title></circle>"
        )
    line = (
        f'<path class="mark line" d="{" ".join(path)}" fill="none" stroke="{color}" '
        'stroke-width="2.5" stroke-linejoin="round"/>'
    )
    scale = ticks(1.0)
    grid = _y_grid([(f, _percent(f, scale[1])) for f in scale])
    labels = _x_labels([p.label for p in points], slot, 5)
    legend = _legend([("hit rate", color), ("requests", VOLUME_COLOR)], 16)
    return _svg(plot_id, W, H, grid + "".join(bars) + line + "".join(dots) + labels + legend)


def histogram(
    plot_id: str, labels: Sequence[str], series: Sequence[Series], unit: str
) -> str | None:
    """Side-by-side bars per bucket, each group as shares of its own total (so a small
    group's shape stays readable next to a large one)."""
    if not any(sum(s.counts) for s in series):
        return None
    shares = [[c / (sum(s.counts) or 1) for c in s.counts] for s in series]
    scale = ticks(max(max(group, default=0) for group in shares))
    top = scale[-1]
    plot_w, plot_h = W - LEFT - RIGHT, H - TOP - BOTTOM
    slot = plot_w / len(labels)
    bar_w = slot * 0.8 / len(series)
    marks = []
    for s, group in enumerate(series):
        for i, (count, share) in enumerate(zip(group.counts, shares[s], strict=False)):
            if count <= 0 or i >= len(labels):
                continue
            x, bar_h = LEFT + i * slot + slot * 0.1 + s * bar_w, share / top * plot_h
            tip = f"{group.name}, {labels[i]} {unit}: {round(count):,} ({share:.1%})"
            marks.append(_rect(x, TOP + plot_h - bar_h, bar_w, bar_h, group.color, tip))
    step = scale[1] - scale[0]
    grid = _y_grid([(v / top, _percent(v, step)) for v in scale])
    axis = _text(W - RIGHT, H - 6, unit, "axis", "end")
    legend = _legend([(s.name, s.color) for s in series], 16)
    body = grid + "".join(marks) + _x_labels(labels, slot) + axis + legend
    return _svg(plot_id, W, H, body)


def hbars(
    plot_id: str, rows: Sequence[Row], legend: Sequence[tuple[str, str]], width: int = W
) -> str | None:
    """Stacked horizontal bars on one scale; segment colours follow the legend's order."""
    rows = [row for row in rows if sum(s.value for s in row.segments) > 0]
    if not rows:
        return None
    room = 90  # for the total written after the longest bar
    scale = (width - LABEL_W - RIGHT - room) / max(sum(s.value for s in r.segments) for r in rows)
    marks = []
    for i, row in enumerate(rows):
        y, x = TOP + i * ROW_H, float(LABEL_W)
        marks.append(_row_label(LABEL_W - 8, y + 16, row.label))
        for j, segment in enumerate(row.segments):
            color = legend[j % len(legend)][1] if legend else DEFAULT_COLOR
            if segment.value > 0:
                marks.append(_rect(x, y + 3, segment.value * scale, ROW_H - 6, color, segment.tip))
            x += segment.value * scale
        marks.append(_text(x + 6, y + 16, row.total, "label", "start"))
    height = TOP + len(rows) * ROW_H + 8
    return _svg(plot_id, width, height, _legend(legend, 16) + "".join(marks))


def ticks(high: float, most: int = 5) -> list[float]:
    """Round ticks from 0 to the first one at or above `high`: steps of 1, 2 or 5 x 10^n,
    the smallest that needs at most `most` steps."""
    if not high > 0:
        return [0.0, 1.0]
    power = 10.0 ** math.floor(math.log10(high / most))
    step = next(m * power for m in (1, 2, 5, 10) if m * power * most >= high * (1 - 1e-9))
    count = math.ceil(high / step * (1 - 1e-9))
    return [round(i * step, 12) for i in range(count + 1)]


def _percent(fraction: float, step: float) -> str:
    """A tick as a percentage with the decimals its step needs (0.5%, 2%, 20%)."""
    decimals = max(0, -math.floor(math.log10(step * 100) + 1e-9))
    return f"{fraction * 100:.{decimals}f}%"


def _e(text: str) -> str:
    return html.escape(text, quote=True)


def _svg(plot_id: str, width: int, height: float, inner: str) -> str:
    return (
        f'<svg data-plot="{_e(plot_id)}" viewBox="0 0 {width} {height:.0f}" role="img" '
        f'xmlns="http://www.w3.org/2000/svg">{inner}</svg>'
    )


def _text(x: float, y: float, text: str, cls: str = "axis", anchor: str = "middle") -> str:
    return f'<text class="{cls}" x="{x:.1f}" y="{y:.1f}" text-anchor="{anchor}">{_e(text)}</text>'


def _row_label(x: float, y: float, label: str) -> str:
    """A bar's label, cut in the middle to fit (a model name's ends tell it apart best);
    the whole label is its tooltip."""
    if len(label) <= LABEL_CHARS:
        return _text(x, y, label, "label", "end")
    head = (LABEL_CHARS - 1) // 2
    short = label[:head] + "\u2026" + label[head + 1 - LABEL_CHARS :]
    return (
        f'<text class="label" x="{x:.1f}" y="{y:.1f}" text-anchor="end">{_e(short)}'
        f"<title>{_e(label)}</title></text>"
    )


def _rect(x: float, y: float, w: float, h: float, color: str, tip: str, cls: str = "mark") -> str:
    return (
        f'<rect class="{cls}" x="{x:.1f}" y="{y:.1f}" width="{max(w, 0):.1f}" '
        f'height="{max(h, 0):.1f}" fill="{color}"><title>{_e(tip)}</title></rect>'
    )


def _legend(entries: Sequence[tuple[str, str]], y: float) -> str:
    parts, x = [], float(LEFT)
    for name, color in entries:
        parts.append(
            f'<rect class="key" x="{x:.1f}" y="{y - 9:.1f}" width="10" height="10" fill="{color}"/>'
        )
        parts.append(_text(x + 14, y, name, "legend", "start"))
        x += 30 + 7 * len(name)
    return "".join(parts)


def _y_grid(levels: Sequence[tuple[float, str]]) -> str:
    """Horizontal grid lines at (fraction of the plot height, label)."""
    plot_h = H - TOP - BOTTOM
    lines = []
    for fraction, label in levels:
        y = TOP + (1 - fraction) * plot_h
        lines.append(f'<line class="grid" x1="{LEFT}" x2="{W - RIGHT}" y1="{y:.1f}" y2="{y:.1f}"/>')
        lines.append(_text(LEFT - 6, y + 4, label, "axis y-tick", "end"))
    return "".join(lines)


def _x_labels(labels: Sequence[str], slot: float, limit: int = 8) -> str:
    every = max(1, math.ceil(len(labels) / limit))
    return "".join(
        _text(LEFT + (i + 0.5) * slot, H - BOTTOM + 16, label, "axis x-tick")
        for i, label in enumerate(labels)
        if i % every == 0
    )
