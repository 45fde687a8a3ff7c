"""Restart backoff: a pure function of the failure count."""

from __future__ import annotations

import pytest

from backends.providers.restart_policy import (
    RestartBackoff,
    consecutive_failures,
    restart_delay,
)

BACKOFF = RestartBackoff(initial_s=1, factor=2, max_s=10, reset_after_s=60)


@pytest.mark.parametrize(
    ("failures", "delay"), [(1, 1), (2, 2), (3, 4), (4, 8), (5, 10), (10_000, 10)]
)
def test_delay_doubles_up_to_the_cap(failures: int, delay: float) -> None:
    assert restart_delay(failures, BACKOFF) == delay


@pytest.mark.parametrize(
    ("previous", "ready_for_s", "after"),
    [
        (0, None, 1),  # never got ready
        (3, None, 4),
        (3, 5.0, 4),  # ready briefly: still a crash loop
        (3, 60.0, 1),  # a healthy run forgives the past
    ],
)
def test_a_long_healthy_run_resets_the_count(
    previous: int, ready_for_s: float | None, after: int
) -> None:
    assert consecutive_failures(previous, ready_for_s, BACKOFF) == after
