"""Circuit breaker per backend replica: stop sending to a replica that keeps failing.

    closed ──(failure_threshold consecutive failures, or failure_rate over a full window)──► open
    open ──(open_s elapsed)──► half_open: lets `half_open_probes` requests through
    half_open ──(every probe succeeded)──► closed;  ──(a probe failed)──► open again

Routing skips a replica whose `allow()` is False.

What counts as a failure is the caller's to report, through `counts_as_failure`: no
connection, a timeout, a broken answer, or HTTP 5xx. A 429 is a success: the replica is
busy, not broken, and opening the breaker on it would move its load onto the others and
take a working replica out of the pool. Other 4xx are successes too (the request was bad,
the replica answered).

The transitions are pure functions of a frozen `BreakerState` and `now`; `CircuitBreaker`
holds the state and reads the clock. A backend's breakers share one `BreakerCounts`
(exported as `gateway_breaker_opened_total` and `gateway_breaker_rejected_total`): its
replicas come and go, its counters must only go up.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Literal

from gateway.traffic.retry import AttemptOutcome

Mode = Literal["closed", "open", "half_open"]


@dataclass(frozen=True)
class BreakerConfig:
    failure_threshold: int = 5
    failure_rate: float = 0.5
    window: int = 20
    open_s: float = 5.0
    half_open_probes: int = 1


@dataclass(frozen=True)
class BreakerState:
    mode: Mode = "closed"
    consecutive_failures: int = 0
    recent: tuple[bool, ...] = ()  # last `window` results while closed; True = failure
    opened_at: float = 0.0
    probes: tuple[float, ...] = ()  # start times of probes in flight
    probe_successes: int = 0


@dataclass
class BreakerCounts:
    opened: int = 0  # times a circuit opened (again, after a failed probe)
    # Attempts turned away: every replica's circuit open (`ReplicaSet.pick`), or a
    # half-open one's probes all out (`allow`).
    rejected: int = 0


def counts_as_failure(outcome: AttemptOutcome) -> bool:
    if isinstance(outcome, str):
        return True
    return outcome >= 500


def mode_at(state: BreakerState, now: float, config: BreakerConfig) -> Mode:
    if state.mode == "open" and now >= state.opened_at + config.open_s:
        return "half_open"
    return state.mode


def admit(state: BreakerState, now: float, config: BreakerConfig) -> tuple[bool, BreakerState]:
    """Whether a request may go to the replica now, and the state after saying so."""
    mode = mode_at(state, now, config)
    if mode == "closed":
        return True, state
    if mode == "open":
        return False, state
    if state.mode == "open":
        state = BreakerState(mode="half_open", opened_at=state.opened_at)
    # A probe whose result never came (its request was cancelled) must not hold the
    # replica half-open forever: after open_s it no longer counts.
    live = tuple(t for t in state.probes if now - t < config.open_s)
    if len(live) >= config.half_open_probes:
        return False, replace(state, probes=live)
    return True, replace(state, probes=(*live, now))


def record(state: BreakerState, failed: bool, now: float, config: BreakerConfig) -> BreakerState:
    """The state after a result from the replica."""
    if state.mode == "closed":
        return _record_closed(state, failed, now, config)
    if state.mode == "open" or not state.probes:
        return state  # from a request let through before the breaker opened
    if failed:
        return _opened(now)
    successes = state.probe_successes + 1
    if successes >= config.half_open_probes:
        return BreakerState()
    return replace(state, probes=state.probes[1:], probe_successes=successes)


def _record_closed(
    state: BreakerState, failed: bool, now: float, config: BreakerConfig
) -> BreakerState:
    if not failed and len(state.recent) == config.window and True not in state.recent:
        return state  # a success after a full window of them changes nothing (the usual)
    consecutive = state.consecutive_failures + 1 if failed else 0
    recent = (*state.recent, failed)[-config.window :]
    full = len(recent) == config.window
    if consecutive >= config.failure_threshold or (
        full and sum(recent) >= config.failure_rate * config.window
    ):
        return _opened(now)
    return replace(state, consecutive_failures=consecutive, recent=recent)


def _opened(now: float) -> BreakerState:
    return BreakerState(mode="open", opened_at=now)


class CircuitBreaker:
    """One replica's breaker. Call `record` once for each `allow()` that returned True."""

    def __init__(
        self,
        failure_threshold: int = 5,
        failure_rate: float = 0.5,
        window: int = 20,
        open_s: float = 5.0,
        half_open_probes: int = 1,
        clock: Callable[[], float] = time.monotonic,
        counts: BreakerCounts | None = None,
    ) -> None:
        self.config = BreakerConfig(
            failure_threshold, failure_rate, window, open_s, half_open_probes
        )
        self._clock = clock
        self._state = BreakerState()
        self.counts = counts if counts is not None else BreakerCounts()

    @property
    def state(self) -> Mode:
        return mode_at(self._state, self._clock(), self.config)

    def allow(self) -> bool:
        allowed, self._state = admit(self._state, self._clock(), self.config)
        if not allowed:
            self.counts.rejected += 1
        return allowed

    def record(self, success: bool) -> None:
        """`success` is `not counts_as_failure(outcome)`: a 429 is a success."""
        was_open = self._state.mode == "open"
        self._state = record(self._state, not success, self._clock(), self.config)
        if self._state.mode == "open" and not was_open:
            self.counts.opened += 1
