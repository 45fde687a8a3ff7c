"""What a batch line's answer means for the job, and how long to wait before sending a
line again: pure functions, tested with tables.

A line refused for load is retried, never failed: 503 (shed from the fair queue,
overloaded, a cold start too slow for the deadline, the state store away) and 429 with
`Retry-After` (a quota window, or the upstream's own rate limit). A 429 without one (a
request larger than a quota on its own) and every other answer are the line's result.
"""

from __future__ import annotations

from collections.abc import Mapping

from common.backoff import Backoff


def retryable(status: int, headers: Mapping[str, str]) -> bool:
    if status == 503:
        return True
    return status == 429 and "retry-after" in headers


def backoff_s(attempt: int, retry_after_s: float | None, backoff: Backoff, draw: float) -> float:
    """Seconds before attempt `attempt + 1` (`attempt` >= 1): `backoff`'s delay (full
    jitter, so that lines refused together do not come back together), and never
    sooner than the answer's `Retry-After` (`retry_after_s`, as gateway/traffic/retry.py
    `parse_retry_after` reads it; a quota's day can be hours away: the job's window bounds
    that wait, not the cap). `draw` is uniform in [0, 1)."""
    return max(backoff.delay_s(attempt, rand=draw), retry_after_s or 0.0)
