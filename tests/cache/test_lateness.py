"""The lookup budget's timer, set early by how late a busy loop lately resumed lookups."""

from __future__ import annotations

import pytest

from cache.lateness import Lateness


def test_an_idle_loop_leaves_the_whole_budget() -> None:
    lateness = Lateness(0.05)
    assert lateness.timer_s(100.0) == 0.05
    lateness.ended(started=100.0, timer_s=0.05, now=100.03)  # done in time: not late
    assert lateness.timer_s(100.1) == 0.05


def test_the_timer_is_early_by_the_largest_recent_lateness() -> None:
    lateness = Lateness(0.05)
    lateness.ended(started=100.0, timer_s=0.05, now=100.06)  # 10 ms late
    lateness.ended(started=100.1, timer_s=0.05, now=100.154)  # 4 ms late
    assert lateness.timer_s(100.2) == pytest.approx(0.04)
    # Measured against the timer set, not the budget: at 40 ms, 3 ms late is 3 ms.
    lateness.ended(started=100.2, timer_s=0.04, now=100.243)
    assert lateness.timer_s(100.3) == pytest.approx(0.04)


def test_never_less_than_half_the_budget() -> None:
    lateness = Lateness(0.05)
    lateness.ended(started=100.0, timer_s=0.05, now=100.3)  # a 250 ms stall
    assert lateness.timer_s(100.4) == 0.025


def test_old_and_crowded_out_lateness_is_forgotten() -> None:
    lateness = Lateness(0.05, kept=2, max_age_s=10.0)
    lateness.ended(started=100.0, timer_s=0.05, now=100.07)  # 20 ms late
    assert lateness.timer_s(109.0) == pytest.approx(0.03)
    assert lateness.timer_s(110.1) == 0.05  # older than 10 s
    lateness.ended(started=200.0, timer_s=0.05, now=200.07)  # 20 ms
    lateness.ended(started=201.0, timer_s=0.05, now=201.051)  # 1 ms
    lateness.ended(started=202.0, timer_s=0.05, now=202.052)  # 2 ms: the 20 ms one is out
    assert lateness.timer_s(202.1) == pytest.approx(0.048)


def test_bad_settings_are_refused() -> None:
    with pytest.raises(ValueError):
        Lateness(0.0)
    with pytest.raises(ValueError):
        Lateness(0.05, kept=0)
