"""bench/proxy_overhead.py's per-round spread of the gateway-to-skeleton ratio."""

from __future__ import annotations

import pytest

from bench.proxy_overhead import round_ratios


def test_round_ratios_pair_rounds_in_order_and_sort_the_ratios() -> None:
    # Round 1: 600/1000, round 2: 900/1500 ... each gateway round over the skeleton
    # round that followed it, not over the pooled skeleton figure.
    assert round_ratios([600.0, 900.0, 700.0], [1000.0, 1500.0, 875.0]) == [0.6, 0.6, 0.8]


def test_round_ratios_skip_a_skeleton_round_that_served_nothing() -> None:
    assert round_ratios([500.0, 400.0], [0.0, 800.0]) == [0.5]


def test_round_ratios_refuse_unpaired_rounds() -> None:
    with pytest.raises(ValueError):
        round_ratios([1.0, 2.0], [1.0])
