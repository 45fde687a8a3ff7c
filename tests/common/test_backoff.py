"""The backoff policy in tables: growth, the cap, each jitter, attempts far past the cap."""

from __future__ import annotations

import random

import pytest

from common.backoff import Backoff

DOUBLING = Backoff(base_s=0.5, cap_s=10.0, jitter="none")


@pytest.mark.parametrize(
    ("attempt", "delay_s"),
    [
        (0, 0.5),  # before any failure counts as the first
        (1, 0.5),
        (2, 1.0),
        (3, 2.0),
        (5, 8.0),
        (6, 10.0),  # 16 s capped
        (1100, 10.0),  # 2**1099 is past any float: the cap, no OverflowError
        (10**400, 10.0),  # an exponent past any float as well
    ],
)
def test_no_jitter_grows_to_the_cap(attempt: int, delay_s: float) -> None:
    assert DOUBLING.delay_s(attempt) == delay_s
    assert DOUBLING.delay_s(attempt, rand=0.1) == delay_s  # rand is ignored


@pytest.mark.parametrize(
    ("attempt", "rand", "delay_s"),
    [
        (1, 0.0, 0.0),  # full jitter reaches zero
        (1, 0.5, 0.25),
        (3, 0.5, 1.0),
        (3, 0.999, 1.998),
        (40, 0.25, 2.5),  # a quarter of the cap
        (10**6, 0.5, 5.0),
    ],
)
def test_full_jitter_is_uniform_below_the_ceiling(
    attempt: int, rand: float, delay_s: float
) -> None:
    backoff = Backoff(base_s=0.5, cap_s=10.0)
    assert backoff.delay_s(attempt, rand=rand) == pytest.approx(delay_s)


def test_full_jitter_spreads_clients_that_failed_together() -> None:
    backoff, rng = Backoff(base_s=0.05, cap_s=2.0), random.Random(7)
    delays = [backoff.delay_s(3, rand=rng.random()) for _ in range(1000)]
    assert 0.0 <= min(delays) < 0.01
    assert 0.19 < max(delays) < 0.2


def test_full_jitter_needs_a_random_number() -> None:
    with pytest.raises(ValueError, match="rand"):
        Backoff(base_s=1.0, cap_s=2.0).delay_s(1)


@pytest.mark.parametrize(
    ("backoff", "delays_s"),
    [
        (Backoff(1.0, 1000.0, factor=3.0, jitter="none"), [1.0, 3.0, 9.0, 27.0]),
        (Backoff(1.0, 1000.0, factor=1.0, jitter="none"), [1.0, 1.0, 1.0, 1.0]),
        (Backoff(0.0, 2.0, jitter="none"), [0.0, 0.0, 0.0, 0.0]),  # retries at once
        (Backoff(0.05, 0.0, jitter="none"), [0.0, 0.0, 0.0, 0.0]),  # a cap of zero wins
    ],
)
def test_factor_base_and_cap(backoff: Backoff, delays_s: list[float]) -> None:
    assert [backoff.delay_s(n) for n in (1, 2, 3, 4)] == delays_s


@pytest.mark.parametrize("attempt", [1100, 10**400])
def test_nothing_grows_from_zero_or_by_one_however_many_attempts(attempt: int) -> None:
    assert Backoff(0.0, 2.0, jitter="none").delay_s(attempt) == 0.0
    assert Backoff(1.0, 2.0, factor=1.0, jitter="none").delay_s(attempt) == 1.0


@pytest.mark.parametrize(
    ("base_s", "cap_s", "factor"),
    [(-1.0, 1.0, 2.0), (1.0, -1.0, 2.0), (1.0, 2.0, 0.5)],
)
def test_rejects_a_backoff_that_is_not_one(base_s: float, cap_s: float, factor: float) -> None:
    with pytest.raises(ValueError, match=">= "):
        Backoff(base_s, cap_s, factor)
