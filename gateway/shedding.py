"""Load-shedding decisions: how long a newcomer would wait, and whether that is too long.

Pure functions of numbers the scheduler already has (queue position, requests in flight,
concurrency, a recent mean service time), plus the small estimator of that mean. The
scheduler applies them; nothing here reads a clock.

Why refuse early: a request that cannot be dispatched before its deadline would only hold a
queue place, push everyone behind it back, and end as a client-side timeout. Refusing it at
once with 503 and `Retry-After` costs it nothing and gives its place to a request that can
still make it.
"""

from __future__ import annotations

import math

RETRY_AFTER_FLOOR_S = 1.0  # `Retry-After` is whole seconds; below one means "now", which it is not
RETRY_AFTER_CEILING_S = 60.0  # an estimate far out is a guess; do not park clients on it


def expected_wait_s(
    ahead: int, in_flight: int, max_concurrency: int, mean_service_s: float
) -> float:
    """Seconds until a newcomer would be dispatched.

    `ahead` counts the waiters that go before it or interleave with it: all of its own
    class and of higher classes, since the fair queue may serve any of them first. With
    every slot busy, slots free up at `max_concurrency / mean_service_s` per second and
    the newcomer needs the one after those `ahead` take.
    """
    free = max_concurrency - in_flight
    if free > ahead:
        return 0.0
    return (ahead - free + 1) * mean_service_s / max_concurrency


def should_shed(now: float, deadline: float, wait_s: float) -> bool:
    """True when the request would be dispatched after its deadline (or has none left)."""
    return deadline <= now or now + wait_s > deadline


def retry_after_s(wait_s: float) -> float:
    """When to come back: once the queue ahead has drained, within sane bounds."""
    return min(RETRY_AFTER_CEILING_S, max(RETRY_AFTER_FLOOR_S, wait_s))


class ServiceTimeEstimator:
    """Exponentially weighted mean of recent service times (seconds per request).

    The first sample replaces the initial guess outright: a guess should not outweigh a
    measurement. `alpha` 0.2 follows a change within about five requests.
    """

    def __init__(self, initial_s: float = 1.0, alpha: float = 0.2) -> None:
        if initial_s <= 0 or not 0 < alpha <= 1:
            raise ValueError("initial_s must be > 0 and alpha in (0, 1]")
        self.mean_s = initial_s
        self.samples = 0
        self._alpha = alpha

    def observe(self, seconds: float) -> None:
        if not math.isfinite(seconds) or seconds < 0:
            return
        if self.samples == 0:
            self.mean_s = seconds
        else:
            self.mean_s += self._alpha * (seconds - self.mean_s)
        self.samples += 1
