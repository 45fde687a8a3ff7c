"""The benchmarks' shared measurement helpers (bench/measure.py)."""

from __future__ import annotations

import math
import random

from bench.measure import percentile, ratio_interval


def samples(n: int, mean: float, seed: int) -> list[float]:
    rng = random.Random(seed)
    return [rng.expovariate(1 / mean) for _ in range(n)]


def test_the_same_distribution_twice_gives_an_interval_around_one() -> None:
    low, high = ratio_interval(samples(150, 30, 1), samples(150, 30, 2))
    assert low < 1.0 < high
    # A window of 150 requests: its p99 is its second-largest sample, hence the width.
    assert high - low > 0.2


def test_a_shift_far_beyond_the_noise_excludes_one() -> None:
    base = samples(150, 30, 3)
    low, high = ratio_interval([5 * x for x in samples(150, 30, 4)], base)
    assert 1.5 < low < high


def test_constant_samples_give_their_exact_ratio() -> None:
    assert ratio_interval([20.0] * 50, [10.0] * 40) == (2.0, 2.0)


def test_the_interval_holds_the_point_ratio_and_repeats_with_its_seed() -> None:
    top, bottom = samples(120, 40, 5), samples(120, 25, 6)
    point = percentile(top, 99) / percentile(bottom, 99)
    low, high = ratio_interval(top, bottom, seed=7)
    assert low <= point <= high
    assert ratio_interval(top, bottom, seed=7) == (low, high)


def test_an_empty_sample_gives_no_interval() -> None:
    assert all(math.isnan(v) for v in ratio_interval([], [1.0]))
    assert all(math.isnan(v) for v in ratio_interval([1.0], []))
