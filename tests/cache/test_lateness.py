"""The lookup budget's timer, set early by a margin steered by how many lookups waited
past the budget."""

from __future__ import annotations

import random

import pytest

from cache.lateness import Lateness


def test_an_idle_loop_leaves_the_whole_budget() -> None:
    lateness = Lateness(0.05)
    assert lateness.timer_s == 0.05
    lateness.ended(0.03)  # done in time
    assert lateness.timer_s == 0.05


def test_each_wait_past_the_budget_sets_the_timer_a_step_earlier() -> None:
    lateness = Lateness(0.05, step_s=0.002)
    lateness.ended(0.056)  # 6 ms past the budget
    assert lateness.timer_s == pytest.approx(0.048)
    lateness.ended(0.0505)  # 0.5 ms past
    assert lateness.timer_s == pytest.approx(0.046)


def test_waits_within_the_budget_bring_the_timer_back() -> None:
    lateness = Lateness(0.05, share=0.01, step_s=0.002)
    lateness.ended(0.051)
    assert lateness.timer_s == pytest.approx(0.048)
    # A wait late against the timer (48 ms) but within the budget counts as in time.
    lateness.ended(0.049)
    for _ in range(98):  # 99 in time for one past: back where it began
        lateness.ended(0.02)
    assert lateness.timer_s == pytest.approx(0.05)
    lateness.ended(0.02)
    assert lateness.timer_s == 0.05  # never later than the budget


def test_a_burst_past_the_budget_moves_it_at_once_and_an_idle_spell_keeps_it() -> None:
    lateness = Lateness(0.05, step_s=0.001)
    for _ in range(12):  # one burst's timers, fired together and resumed late
        lateness.ended(0.06)
    assert lateness.timer_s == pytest.approx(0.038)  # however long nothing comes


def test_never_less_than_half_the_budget() -> None:
    lateness = Lateness(0.05, step_s=0.01)
    for _ in range(5):
        lateness.ended(0.3)  # 250 ms stalls
    assert lateness.timer_s == 0.025


def test_it_settles_where_the_share_asked_for_waits_past_the_budget() -> None:
    """A loop that resumes 1 in 5 lookups up to 15 ms after their timer: with the whole
    budget all those would wait past it; steered, about `share` of all lookups do, at a
    margin of about 14 ms (0.2 x (15 - margin) / 15 = 0.01)."""
    draw = random.Random(7)
    lateness = Lateness(0.05, share=0.01)
    past = 0
    lookups = 100_000
    for _ in range(lookups):
        late = draw.random() < 0.2
        waited = lateness.timer_s + draw.uniform(0.0, 0.015) if late else draw.uniform(0.001, 0.03)
        past += waited > 0.05
        lateness.ended(waited)
    assert 0.005 < past / lookups < 0.015
    assert 0.012 < lateness.margin_s < 0.0155


def test_bad_settings_are_refused() -> None:
    with pytest.raises(ValueError):
        Lateness(0.0)
    with pytest.raises(ValueError):
        Lateness(0.05, share=0.0)
    with pytest.raises(ValueError):
        Lateness(0.05, step_s=0.0)
