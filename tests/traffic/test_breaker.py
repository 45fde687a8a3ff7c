"""The circuit breaker: scenarios of results and calls over time, on pure transitions and
on the class with a fake clock."""

from __future__ import annotations

import pytest

from gateway.traffic.breaker import (
    BreakerConfig,
    BreakerCounts,
    BreakerState,
    CircuitBreaker,
    admit,
    counts_as_failure,
    mode_at,
    record,
)
from gateway.traffic.retry import AttemptOutcome


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.mark.parametrize(
    ("outcome", "failure"),
    [
        ("connect_error", True),
        ("timeout", True),
        ("protocol_error", True),
        (500, True),
        (502, True),
        (503, True),
        (504, True),
        (429, False),  # busy, not broken
        (400, False),  # the request was bad; the replica answered
        (404, False),
        (200, False),
    ],
)
def test_what_counts_as_a_failure(outcome: AttemptOutcome, failure: bool) -> None:
    assert counts_as_failure(outcome) is failure


# A scenario is a list of steps at times: ("ok" | "fail", t) records a result;
# ("allow", t, expected) asks; ("state", t, expected) looks.
Step = tuple[str, float] | tuple[str, float, object]

SCENARIOS: dict[str, list[Step]] = {
    "opens after 5 consecutive failures": [
        *[("fail", 0.0)] * 4,
        ("state", 0.0, "closed"),
        ("fail", 0.0),
        ("state", 0.0, "open"),
        ("allow", 1.0, False),
    ],
    "a success resets the consecutive count": [
        *[("fail", 0.0)] * 4,
        ("ok", 0.0),
        *[("fail", 0.0)] * 4,
        ("state", 0.0, "closed"),
    ],
    "opens at a 50% failure rate over a full window of 20": [
        *[step for _ in range(9) for step in (("fail", 0.0), ("ok", 0.0))],
        ("fail", 0.0),
        ("state", 0.0, "closed"),  # 10 failures, but only 19 results so far
        ("ok", 0.0),
        ("state", 0.0, "open"),
    ],
    "stays closed below the rate": [
        *[step for _ in range(30) for step in (("fail", 0.0), ("ok", 0.0), ("ok", 0.0))],
        ("state", 0.0, "closed"),
    ],
    "half-open after open_s lets one probe through": [
        *[("fail", 0.0)] * 5,
        ("allow", 4.9, False),
        ("state", 5.0, "half_open"),
        ("allow", 5.0, True),
        ("allow", 5.1, False),
    ],
    "a good probe closes it": [
        *[("fail", 0.0)] * 5,
        ("allow", 5.0, True),
        ("ok", 5.5),
        ("state", 5.5, "closed"),
        ("allow", 5.6, True),
        *[("fail", 6.0)] * 4,
        ("state", 6.0, "closed"),  # counts start afresh
    ],
    "a bad probe opens it again for open_s": [
        *[("fail", 0.0)] * 5,
        ("allow", 5.0, True),
        ("fail", 5.5),
        ("state", 5.5, "open"),
        ("allow", 10.4, False),
        ("allow", 10.5, True),
    ],
    "a probe that never reports stops blocking after open_s": [
        *[("fail", 0.0)] * 5,
        ("allow", 5.0, True),
        ("allow", 9.9, False),
        ("allow", 10.0, True),
    ],
    "late results while open change nothing": [
        *[("fail", 0.0)] * 5,
        ("ok", 1.0),
        ("fail", 6.0),  # after open_s, but no probe was let through
        ("state", 6.0, "half_open"),
        ("allow", 6.0, True),
    ],
}


@pytest.mark.parametrize("steps", SCENARIOS.values(), ids=SCENARIOS.keys())
def test_breaker_scenarios(steps: list[Step]) -> None:
    clock = FakeClock()
    start = clock.now
    breaker = CircuitBreaker(clock=clock)
    for step in steps:
        clock.now = start + step[1]
        if step[0] in ("ok", "fail"):
            breaker.record(step[0] == "ok")
        elif step[0] == "allow":
            assert breaker.allow() is step[2], step
        else:
            assert breaker.state == step[2], step


def test_several_probes_must_all_succeed() -> None:
    config = BreakerConfig(half_open_probes=2)
    state = BreakerState(mode="open", opened_at=0.0)
    allowed: list[bool] = []
    for now in (5.0, 5.0, 5.0):
        ok, state = admit(state, now, config)
        allowed.append(ok)
    assert allowed == [True, True, False]
    state = record(state, failed=False, now=5.1, config=config)
    assert mode_at(state, 5.1, config) == "half_open"
    state = record(state, failed=False, now=5.2, config=config)
    assert mode_at(state, 5.2, config) == "closed"


def test_counters_for_metrics_are_shared_by_a_backends_breakers() -> None:
    clock, counts = FakeClock(), BreakerCounts()
    breaker = CircuitBreaker(failure_threshold=2, open_s=1.0, clock=clock, counts=counts)
    breaker.record(False)
    breaker.record(False)
    assert not breaker.allow()
    clock.now += 1.0
    assert breaker.allow()
    breaker.record(False)  # the probe failed: opened a second time
    assert (counts.opened, counts.rejected, breaker.state) == (2, 1, "open")
    other = CircuitBreaker(failure_threshold=1, clock=clock, counts=counts)
    other.record(False)
    assert (counts.opened, counts.rejected) == (3, 1)
