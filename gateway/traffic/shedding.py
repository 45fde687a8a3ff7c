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
from collections.abc import Callable

from common.window import WindowSums

RETRY_AFTER_FLOOR_S = 1.0  # `Retry-After` is whole seconds; below one means "now", which it is not
RETRY_AFTER_CEILING_S = 60.0  # an estimate far out is a guess; do not park clients on it
# Admit only when the expected wait fits in this fraction of the time left. Under overload a
# tenant's line sits right at its admission limit, so without a margin every time the
# estimate errs short (higher-class arrivals come in bursts, other tenants' arrivals take
# their fair turns, service times vary) the requests admitted at the limit end up dropped
# later: refused after a long wait instead of at once. Measured (bench/overload.py, 5x),
# share of refusals that came after a wait: 4% at the deadline, ~1.9 s late, with no
# margin and no re-check; 40% (re-checked, dropped after 0.3 to 0.7 s) with no margin;
# 3% at 0.85; none at 0.6 or 0.5. Half the deadline still queues far more than it takes to
# keep every slot busy (goodput unchanged).
ADMIT_WAIT_FRACTION = 0.5


def expected_wait_s(
    ahead: int,
    in_flight: int,
    max_concurrency: int,
    mean_service_s: float,
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
    return (ahead - free + 1) * mean_service_s / max(1, max_concurrency)


def should_shed(now: float, deadline: float, wait_s: float, fraction: float = 1.0) -> bool:
    """True when the expected wait exceeds `fraction` of the time left before the deadline
    (or none is left): 1.0 for "would be dispatched after its deadline"."""
    return deadline <= now or wait_s > fraction * (deadline - now)


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


class ClassLoad:
    """How much of the backend's capacity each class took lately: its dispatches in a
    sliding window times the mean service time, over the slot-time of the window.

    A lower class only gets what the higher ones leave, so its expected wait stretches by
    1 / (1 - their load). Time-based, not a share of recent dispatches: a share of a few
    dozen dispatches swings by a third between one moment and the next, and every swing
    becomes an error in the wait of the requests admitted at that moment.
    """

    def __init__(self, window_s: float = 3.0) -> None:
        if window_s <= 0:
            raise ValueError("window_s must be > 0")
        self._dispatches: WindowSums[int] = WindowSums(window_s)  # by class rank

    def record(self, now: float, rank: int) -> None:
        self._dispatches.add(now, rank)
        self._dispatches.expire(now)

    def above(
        self, rank: int, now: float, mean_service_s: Callable[[int], float], slots: int
    ) -> float:
        """The share (0 to 1) of `slots` that classes ranked before `rank` kept busy, each
        class's dispatches weighed by its own mean service time (`mean_service_s(rank)`):
        with one mean for all, short interactive answers counted as long as batch ones,
        the estimate of what they leave swung with every burst of them, and batch waiters
        admitted at one moment were dropped as slipped at the next."""
        dispatches = self._dispatches
        dispatches.expire(now)
        if slots <= 0:
            return 0.0
        busy = sum(dispatches.get(r) * mean_service_s(r) for r in dispatches if r < rank)
        return min(1.0, busy / (slots * dispatches.window_s))

    def recent(self, rank: int, now: float) -> bool:
        """Whether the class dispatched anything in the window."""
        self._dispatches.expire(now)
        return self._dispatches.get(rank) > 0


# A measured drain rate needs this many of the class's requests finished in the window:
# below it, the rate says more about when the window began than about the backlog.
MIN_DRAIN_SAMPLES = 5


class DrainRate:
    """How fast each class's, and each tenant's, requests finished lately (per second over
    a sliding window of the time the scheduler had work): the pace at which a line really
    drains, measured rather than modelled from a limit and a mean service time.

    Why: the model (`expected_wait_s`) counts the limit's slots at a service time measured
    at a lower load, and a line's whole class as its own, so when overload begins (more in
    flight, each request slower, the pace of lower classes bounded, a light tenant's
    arrivals going first) it expected the noisy tenant's line to drain three to four times
    as fast as it did. bench/capacity.py, full run, the first 3 s of load 5: the noisy
    tenant had 156 requests admitted that waited up to 19.4 s of their 20, and 10 answered
    504 (engine metrics); 185, 29 answered 504 and 76 refused 15 to 19 s late (latency
    alone). With this: 65 and 68 admitted, none waited over 9.4 s, none late, no 504. A
    rate of finished requests already holds the engine's saturation, the higher classes'
    share and the other tenants' turns.

    Time while the scheduler has nothing queued or in flight (`idle` to `busy`) does not
    count: after a quiet spell the rates are those of the last busy seconds, not none,
    which left the model alone to admit the first burst of an overload.
    """

    def __init__(self, started: float, window_s: float = 5.0) -> None:
        if window_s <= 0:
            raise ValueError("window_s must be > 0")
        self._window_s = window_s
        self._started = started
        self._idle_s = 0.0  # idle time so far, taken off the clock
        self._idle_since: float | None = started  # idle until the first request
        # Completions on the busy clock, by class and by (class, tenant).
        self._by_class: WindowSums[int] = WindowSums(window_s)
        self._by_tenant: WindowSums[tuple[int, str]] = WindowSums(window_s)
        self._weights: dict[tuple[int, str], float] = {}

    @property
    def window_s(self) -> float:
        return self._window_s

    def idle(self, now: float) -> None:
        """Nothing queued or in flight from `now`: the window stops."""
        if self._idle_since is None:
            self._idle_since = now

    def busy(self, now: float) -> None:
        """Work again: the window goes on from where it stopped."""
        if self._idle_since is not None:
            self._idle_s += now - self._idle_since
            self._idle_since = None

    def record(self, now: float, rank: int, tenant: str, weight: float) -> None:
        at = self._busy_clock(now)
        self._by_class.add(at, rank)
        self._by_tenant.add(at, (rank, tenant))
        self._weights[(rank, tenant)] = weight
        self._expire(at)

    def rates(self, rank: int, tenant: str, now: float) -> tuple[float, float] | None:
        """(the class's, the tenant's) finished requests per second, or None while the
        class finished fewer than MIN_DRAIN_SAMPLES in the window."""
        at = self._busy_clock(now)
        self._expire(at)
        finished = self._by_class.get(rank)
        span = min(self._window_s, at)
        if finished < MIN_DRAIN_SAMPLES or span <= 0:
            return None
        return finished / span, self._by_tenant.get((rank, tenant)) / span

    def weights(self, rank: int, now: float) -> dict[str, float]:
        """The weights of the tenants of a class that finished requests in the window:
        those whose arrivals will take turns in its line too."""
        self._expire(self._busy_clock(now))
        return {tenant: self._weights[(r, tenant)] for r, tenant in self._by_tenant if r == rank}

    def _busy_clock(self, now: float) -> float:
        """Seconds of work since the start: `now` less the time spent idle."""
        idle = self._idle_s + (now - self._idle_since if self._idle_since is not None else 0.0)
        return now - self._started - idle

    def _expire(self, at: float) -> None:
        self._by_class.expire(at)
        for key in self._by_tenant.expire(at):
            del self._weights[key]


def measured_wait_s(own: int, class_rate: float, tenant_rate: float, share: float) -> float:
    """Seconds until a newcomer with `own` of its tenant's requests ahead of it would be
    dispatched, at the measured pace: its tenant's line drains at the rate its requests
    finished lately, or at its fair `share` (its weight over that of the tenants taking
    turns in the class) of the class's rate if that is faster. The share is for a line
    that was not backlogged through the window, whose rate is its arrivals, not what the
    fair queue would give it; pass 0 for one that was: its rate is then what the fair
    queue gives it, which is less than its share while another tenant spends a lead in
    the virtual counters.
    Pessimistic when overload begins (the rates are those of the lighter load).
    """
    rate = max(tenant_rate, share * class_rate)
    return math.inf if rate <= 0 else (own + 1) / rate
