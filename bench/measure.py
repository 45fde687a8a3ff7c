"""Measurement helpers the benchmarks share: percentiles (with a bootstrap interval for a
ratio of two), and a process's CPU time."""

from __future__ import annotations

import os
import random
from pathlib import Path


def percentile(values: list[float], q: float) -> float:
    """Linear interpolation between closest ranks (q in [0, 100])."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100.0
    low = int(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def ratio_interval(
    numerator: list[float],
    denominator: list[float],
    q: float = 99.0,
    confidence: float = 0.9,
    draws: int = 1000,
    seed: int = 0,
) -> tuple[float, float]:
    """A percentile bootstrap interval of percentile(numerator, q) / percentile(denominator,
    q): both samples resampled with replacement `draws` times (seeded, so a run repeats).
    Why: the p99 of a window of ~100-200 requests is its second-largest sample, so one
    quick run's TTFT ratio moves by 2x between runs of the same code (bench/capacity.py:
    1.9 and 4.8 for two variants that may not differ at all); the interval says how far
    a single figure can be read. (nan, nan) when either sample is empty."""
    if not numerator or not denominator:
        return float("nan"), float("nan")
    rng = random.Random(seed)
    ratios = []
    for _ in range(draws):
        top = percentile(rng.choices(numerator, k=len(numerator)), q)
        bottom = percentile(rng.choices(denominator, k=len(denominator)), q)
        if bottom > 0:
            ratios.append(top / bottom)
    tail = (1.0 - confidence) / 2.0 * 100.0
    return percentile(ratios, tail), percentile(ratios, 100.0 - tail)


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process (all its threads), from /proc/PID/stat."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
