"""Small statistics for the reports: nearest-rank percentiles, fixed-edge histograms."""

from __future__ import annotations

import math
from collections.abc import Sequence
from datetime import UTC, datetime


def percentile(values: Sequence[float], p: float) -> float | None:
    """The nearest-rank percentile: a value that occurred (None for no values)."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, math.ceil(p / 100 * len(ordered)))
    return ordered[rank - 1]


def summary(
    values: Sequence[float], points: Sequence[int] = (50, 95, 99)
) -> dict[str, float | None]:
    return {f"p{p}": _round(percentile(values, p)) for p in points}


def histogram(values: Sequence[float], edges: Sequence[float]) -> list[int]:
    """Counts per bucket [edges[i], edges[i+1]); values outside fall into the end buckets."""
    counts = [0] * (len(edges) - 1)
    for value in values:
        index = 0
        while index < len(counts) - 1 and value >= edges[index + 1]:
            index += 1
        counts[index] += 1
    return counts


def rate(part: int, whole: int) -> float | None:
    return round(part / whole, 4) if whole else None


def mean(values: Sequence[float]) -> float | None:
    return _round(sum(values) / len(values)) if values else None


def iso(ts: float) -> str:
    moment = datetime.fromtimestamp(ts, UTC).isoformat(timespec="seconds")
    return moment.replace("+00:00", "Z")


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 3)
