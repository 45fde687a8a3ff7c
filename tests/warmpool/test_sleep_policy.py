"""The sleep tier in the scaling policy, as scenario tables: warm -> asleep after idle_s,
asleep -> stopped after sleep_s, a wake on demand; the clock passed in."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from warmpool.autoscale import ScalePolicy, ScaleSnapshot, desired_replicas

NOW = 1000.0
SLEEPY = ScalePolicy(
    max_replicas=3, idle_s=60, last_replica_idle_s=300, sleep_s=600, stable_window_s=60
)
QUIET = tuple((NOW - ago, 0) for ago in range(60, -1, -1))
ASKED = (*QUIET[:-1], (NOW, 1))  # one request now, after a quiet minute
BUSY = tuple((NOW - ago, 5) for ago in range(60, -1, -1))  # 5 in flight for a minute


def snap(**kw: Any) -> ScaleSnapshot:
    kw.setdefault("demand_samples", QUIET)
    return ScaleSnapshot(now=NOW, **kw)


def ago(seconds: float, *replicas: str) -> dict[str, float]:
    return dict.fromkeys(replicas, NOW - seconds)


# (name, snapshot, policy, target, sleep, wake, stop, reason starts with)
SCENARIOS: list[tuple[Any, ...]] = [
    (
        "the last replica idle for idle_s sleeps (where it would wait last_replica_idle_s)",
        snap(ready=("a",), last_active_by_replica=ago(60, "a")),
        SLEEPY,
        0,
        ("a",),
        (),
        (),
        "sleep: a",
    ),
    (
        "not before idle_s",
        snap(ready=("a",), last_active_by_replica=ago(59, "a")),
        SLEEPY,
        1,
        (),
        (),
        (),
        "hold",
    ),
    (
        "nor while it serves",
        snap(ready=("a",), last_active_by_replica=ago(90, "a"), in_flight_by_replica={"a": 1}),
        SLEEPY,
        1,
        (),
        (),
        (),
        "hold",
    ),
    (
        "nor with min_replicas 1: asleep replicas are not warm",
        snap(ready=("a",), last_active_by_replica=ago(10_000, "a")),
        ScalePolicy(min_replicas=1, idle_s=60, sleep_s=600),
        1,
        (),
        (),
        (),
        "steady",
    ),
    (
        "n -> n-1 still stops: only the last replica sleeps",
        snap(ready=("a", "b"), last_active_by_replica=ago(60, "a", "b")),
        SLEEPY,
        1,
        (),
        (),
        ("b",),
        "scale down",
    ),
    (
        "asleep, within sleep_s: nothing to do",
        snap(asleep=ago(599, "a")),
        SLEEPY,
        0,
        (),
        (),
        (),
        "steady",
    ),
    (
        "asleep with no work for sleep_s (from its last work): stopped",
        snap(asleep=ago(600, "a")),
        SLEEPY,
        0,
        (),
        (),
        ("a",),
        "steady; stop a: asleep",
    ),
    (
        "a recent request for the backend keeps it asleep, not stopped",
        snap(asleep=ago(900, "a"), last_request_at=NOW - 10),
        SLEEPY,
        0,
        (),
        (),
        (),
        "steady",
    ),
    (
        "demand with every replica asleep wakes one, now, rather than starting one",
        snap(demand_samples=ASKED, asleep=ago(100, "a")),
        SLEEPY,
        1,
        (),
        ("a",),
        (),
        "wake",
    ),
    (
        "demand wakes even one asleep past sleep_s, and stops none",
        snap(demand_samples=ASKED, asleep=ago(5000, "a")),
        SLEEPY,
        1,
        (),
        ("a",),
        (),
        "wake",
    ),
    (
        "of two asleep, the one busy last wakes",
        snap(demand_samples=ASKED, asleep={"a": NOW - 300, "b": NOW - 100}),
        SLEEPY,
        1,
        (),
        ("b",),
        (),
        "wake",
    ),
    (
        "a wake under way (counted as starting) is not asked for twice",
        snap(demand_samples=ASKED, starting=1),
        SLEEPY,
        1,
        (),
        (),
        (),
        "steady",
    ),
    (
        "scale-up wakes an asleep replica before it starts one",
        snap(ready=("a",), demand_samples=BUSY, asleep=ago(100, "b")),
        SLEEPY,
        3,
        (),
        ("b",),
        (),
        "wake 1: scale up 1 -> 3",
    ),
    (
        "min_replicas wakes an asleep replica",
        snap(asleep=ago(100, "a")),
        ScalePolicy(min_replicas=1, idle_s=60, sleep_s=600),
        1,
        (),
        ("a",),
        (),
        "wake",
    ),
    (
        "without a sleep tier the last replica stops after last_replica_idle_s, as before",
        snap(ready=("a",), last_active_by_replica=ago(300, "a")),
        ScalePolicy(idle_s=60, last_replica_idle_s=300),
        0,
        (),
        (),
        ("a",),
        "scale to zero",
    ),
]


@pytest.mark.parametrize(
    ("snapshot", "policy", "target", "sleep", "wake", "stop", "reason"),
    [pytest.param(*row[1:], id=row[0]) for row in SCENARIOS],
)
def test_scenarios(
    snapshot: ScaleSnapshot,
    policy: ScalePolicy,
    target: int,
    sleep: tuple[str, ...],
    wake: tuple[str, ...],
    stop: tuple[str, ...],
    reason: str,
) -> None:
    decision = desired_replicas(snapshot, policy)
    assert (decision.target, decision.sleep, decision.wake, decision.stop) == (
        target,
        sleep,
        wake,
        stop,
    ), decision.reason
    assert decision.reason.startswith(reason), decision.reason


@pytest.mark.parametrize("sleep_s", [60, 30])
def test_sleep_s_must_be_longer_than_idle_s(sleep_s: float) -> None:
    with pytest.raises(ValueError, match="sleep_s"):
        ScalePolicy(idle_s=60, sleep_s=sleep_s)


ids = st.sampled_from("abcdef")


@given(
    ready=st.lists(ids, unique=True, max_size=3),
    asleep=st.dictionaries(ids, st.floats(0, 2000), max_size=3),
    busy=st.sets(ids),
    idle=st.floats(0, 2000),
    wanted=st.integers(0, 8),
    min_replicas=st.integers(0, 1),
)
def test_invariants(
    ready: list[str],
    asleep: dict[str, float],
    busy: set[str],
    idle: float,
    wanted: int,
    min_replicas: int,
) -> None:
    asleep = {r: NOW - t for r, t in asleep.items() if r not in ready}
    policy = ScalePolicy(min_replicas=min_replicas, max_replicas=4, idle_s=60, sleep_s=600)
    snapshot = snap(
        ready=tuple(ready),
        asleep=asleep,
        demand_samples=(*QUIET[:-1], (NOW, wanted)),
        in_flight_by_replica={r: 1 for r in busy},
        last_active_by_replica=ago(idle, *ready),
    )
    decision = desired_replicas(snapshot, policy)
    assert set(decision.sleep) <= set(ready) - busy and len(decision.sleep) <= 1
    assert set(decision.wake) <= set(asleep)
    assert not set(decision.stop) & set(decision.wake)
    if decision.sleep:  # only the last replica, only at zero demand, never below the floor
        assert len(ready) == 1 and wanted == 0 and min_replicas == 0
    for replica in set(decision.stop) & set(asleep):
        assert wanted == 0 and NOW - asleep[replica] >= 600
    if wanted and not ready and asleep:
        assert decision.wake  # demand with nothing warm wakes one
