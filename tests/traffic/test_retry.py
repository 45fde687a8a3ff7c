"""Retry decisions in tables; the budget with a fake clock; a simulation of a failing pool."""

from __future__ import annotations

import random
from datetime import UTC, datetime
from email.utils import format_datetime

import pytest

from gateway.traffic.retry import (
    AttemptOutcome,
    RetryBudget,
    UpstreamRetryPolicy,
    parse_retry_after,
    should_retry,
)


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def top() -> float:
    return 1.0  # the largest jitter: delays at their ceiling


@pytest.mark.parametrize(
    ("attempt", "outcome", "retry_after", "remaining", "retry", "delay", "reason"),
    [
        (1, "connect_error", None, 30.0, True, 0.05, "connect_error"),
        (1, 502, None, 30.0, True, 0.05, "status_502"),
        (1, 503, None, 30.0, True, 0.05, "status_503"),
        (1, 504, None, 30.0, True, 0.05, "status_504"),
        (1, 429, None, 30.0, True, 0.05, "status_429"),
        (2, 503, None, 30.0, True, 0.1, "status_503"),
        (3, 503, None, 30.0, False, 0.0, "attempts_exhausted"),
        (1, 500, None, 30.0, False, 0.0, "not_retryable"),
        (1, 400, None, 30.0, False, 0.0, "not_retryable"),
        (1, 200, None, 30.0, False, 0.0, "not_retryable"),
        (1, "timeout", None, 30.0, False, 0.0, "not_retryable"),  # the work may be done
        (1, "protocol_error", None, 30.0, False, 0.0, "not_retryable"),
        (1, 429, 2.0, 30.0, True, 2.0, "status_429"),  # Retry-After is a floor
        (1, 503, 0.0, 30.0, True, 0.05, "status_503"),
        (1, 429, 40.0, 30.0, False, 0.0, "retry_after_beyond_deadline"),
        (1, 429, 30.0, 30.0, False, 0.0, "retry_after_beyond_deadline"),
        (1, 503, None, 0.01, False, 0.0, "deadline"),
        (1, 503, None, 0.0, False, 0.0, "deadline"),
    ],
)
def test_should_retry(
    attempt: int,
    outcome: AttemptOutcome,
    retry_after: float | None,
    remaining: float,
    retry: bool,
    delay: float,
    reason: str,
) -> None:
    decision = should_retry(attempt, outcome, retry_after, remaining, rng=top)
    assert (decision.retry, decision.reason) == (retry, reason)
    assert decision.delay_s == pytest.approx(delay)


@pytest.mark.parametrize(
    ("attempt", "jitter", "expected"),
    [
        (1, 1.0, 0.05),
        (2, 1.0, 0.1),
        (3, 1.0, 0.2),
        (7, 1.0, 2.0),  # 3.2 s capped
        (30, 1.0, 2.0),
        (2, 0.5, 0.05),
        (2, 0.0, 0.0),  # full jitter reaches zero
    ],
)
def test_full_jitter_backoff(attempt: int, jitter: float, expected: float) -> None:
    delay_s = UpstreamRetryPolicy().backoff.delay_s(attempt, rand=jitter)
    assert delay_s == pytest.approx(expected)


def test_backoff_spreads_retries_of_requests_that_failed_together() -> None:
    rng = random.Random(7)
    backoff = UpstreamRetryPolicy().backoff
    delays = [backoff.delay_s(3, rand=rng.random()) for _ in range(1000)]
    assert 0.0 <= min(delays) < 0.01
    assert 0.19 < max(delays) < 0.2


@pytest.mark.parametrize(
    ("header", "expected"),
    [
        (None, None),
        ("3", 3.0),
        (" 120 ", 120.0),
        ("soon", None),
        ("-1", None),
        (format_datetime(datetime.fromtimestamp(1_000_010, UTC), usegmt=True), 10.0),
        (format_datetime(datetime.fromtimestamp(999_990, UTC), usegmt=True), 0.0),
    ],
)
def test_parse_retry_after(header: str | None, expected: float | None) -> None:
    assert parse_retry_after(header, now_epoch_s=1_000_000) == expected


def test_budget_allows_a_share_of_requests_then_refuses_and_counts() -> None:
    clock = FakeClock()
    budget = RetryBudget(ratio=0.2, min_per_s=0.0, clock=clock)
    for _ in range(10):
        budget.on_request()
    assert [budget.try_spend() for _ in range(3)] == [True, True, False]
    snap = budget.snapshot()
    assert (snap.requests, snap.retries, snap.exhausted) == (10, 2, 1)


def test_budget_keeps_a_minimum_for_light_traffic_refilled_over_time() -> None:
    clock = FakeClock()
    budget = RetryBudget(ratio=0.2, min_per_s=3.0, clock=clock)
    budget.on_request()
    assert [budget.try_spend() for _ in range(4)] == [True, True, True, False]
    clock.now += 1 / 3
    assert [budget.try_spend() for _ in range(2)] == [True, False]
    clock.now += 100.0  # the reserve does not pile up while idle
    assert [budget.try_spend() for _ in range(4)] == [True, True, True, False]


def test_budget_caps_credit_saved_while_healthy() -> None:
    budget = RetryBudget(ratio=0.2, min_per_s=0.0, max_tokens=10.0, clock=FakeClock())
    for _ in range(1000):
        budget.on_request()
    assert sum(budget.try_spend() for _ in range(50)) == 10


def test_budget_refuses_bad_settings() -> None:
    with pytest.raises(ValueError, match="ratio"):
        RetryBudget(ratio=-0.1)


def simulate(failure_rate: float, requests: int = 20_000, per_s: float = 1000.0) -> float:
    """Attempts per incoming request against a pool failing `failure_rate` of attempts
    with 503, each request retried as `should_retry` and the budget allow."""
    rng = random.Random(1234)
    clock = FakeClock()
    budget = RetryBudget(ratio=0.2, min_per_s=3.0, clock=clock)
    attempts = 0
    for _ in range(requests):
        clock.now += 1 / per_s
        budget.on_request()
        attempt = 1
        while True:
            attempts += 1
            if rng.random() >= failure_rate:
                break
            decision = should_retry(attempt, 503, None, 30.0, rng=rng.random)
            if not decision.retry or not budget.try_spend():
                break
            attempt += 1
    return attempts / requests


def test_a_dead_pool_gets_barely_more_attempts_than_requests() -> None:
    # 1 + ratio, plus the 3/s reserve over 20 s of 1000 req/s (0.003).
    assert 1.19 < simulate(1.0) <= 1.2 + 0.01


def test_a_flaky_pool_gets_every_retry_it_needs() -> None:
    # 10% of attempts fail: 1 + 0.1 + 0.01 attempts per request, nothing refused.
    assert simulate(0.1) == pytest.approx(1.11, abs=0.01)


def test_without_a_budget_a_dead_pool_would_triple_the_load() -> None:
    budget = RetryBudget(ratio=1e9, max_tokens=1e9, clock=FakeClock())
    attempts = 0
    for _ in range(100):
        budget.on_request()
        attempt = 1
        while True:
            attempts += 1
            if not should_retry(attempt, 503, None, 30.0).retry or not budget.try_spend():
                break
            attempt += 1
    assert attempts == 300  # what the budget prevents: max_attempts x incoming
