"""Which answers send a batch line again, and after how long."""

from __future__ import annotations

import pytest

from common.backoff import Backoff
from gateway.batches.execution import RECORD_BACKOFF
from gateway.batches.policy import backoff_s, retryable


@pytest.mark.parametrize(
    ("status", "headers", "again"),
    [
        (503, {"retry-after": "1"}, True),  # shed, overloaded, cold start too slow
        (503, {}, True),  # an upstream that is down for a moment
        (429, {"retry-after": "3"}, True),  # a quota window; the upstream's own limit
        (429, {}, False),  # larger than a quota on its own: it would never pass
        (200, {}, False),
        (400, {}, False),
        (502, {}, False),
        (504, {}, False),
    ],
)
def test_what_is_sent_again(status: int, headers: dict[str, str], again: bool) -> None:
    assert retryable(status, headers) is again


@pytest.mark.parametrize(
    ("attempt", "retry_after_s", "draw", "wait_s"),
    [
        (1, None, 0.5, 0.5),  # full jitter below base * 2**0
        (3, None, 0.5, 2.0),  # below base * 2**2
        (10, None, 0.99, 9.9),  # capped
        (1000, None, 1.0, 10.0),  # far past the cap: still finite
        (1, 7.0, 0.5, 7.0),  # never sooner than Retry-After
        (1, 3600.0, 0.5, 3600.0),  # a day's quota: the job's window bounds it, not the cap
        (2, 0.0, 0.5, 1.0),  # a date already past
    ],
)
def test_backoff(attempt: int, retry_after_s: float | None, draw: float, wait_s: float) -> None:
    assert backoff_s(attempt, retry_after_s, Backoff(1.0, 10.0), draw) == pytest.approx(wait_s)


def test_a_result_not_recorded_is_written_again_after_growing_waits() -> None:
    delays_s = [RECORD_BACKOFF.delay_s(attempt) for attempt in range(1, 7)]
    assert delays_s == [min(5.0, 0.2 * 2**attempt) for attempt in range(1, 7)]
    assert delays_s == [0.4, 0.8, 1.6, 3.2, 5.0, 5.0]
