"""The scaling policy as scenario tables: a snapshot in, a decision out, the clock passed in."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from warmpool.autoscale import Decision, ScalePolicy, ScaleSnapshot, desired_replicas

NOW = 1000.0
POLICY = ScalePolicy(
    min_replicas=0,
    max_replicas=4,
    target_queue_per_replica=2.0,
    stable_window_s=60,
    panic_window_s=6,
    panic_threshold=2.0,
    idle_s=60,
    last_replica_idle_s=300,
)


def demand(*spans: tuple[float, float, int]) -> tuple[tuple[float, int], ...]:
    """One sample a second: (from seconds ago, to seconds ago, value), oldest span first."""
    samples = []
    for start, stop, value in spans:
        samples += [(NOW - ago, value) for ago in range(int(start), int(stop) - 1, -1)]
    return tuple(samples)


def snap(**kw: Any) -> ScaleSnapshot:
    ready = kw.pop("ready", ())
    kw.setdefault("last_active_by_replica", dict.fromkeys(ready, NOW))
    return ScaleSnapshot(now=NOW, ready=ready, **kw)


def idle_for(seconds: float, *replicas: str) -> dict[str, float]:
    return dict.fromkeys(replicas, NOW - seconds)


QUIET = demand((60, 0, 0))
SCENARIOS: list[tuple[str, ScaleSnapshot, ScalePolicy, int, tuple[str, ...], str]] = [
    # (name, snapshot, policy, target, stop, reason starts with)
    ("nothing to do at zero", snap(demand_samples=QUIET), POLICY, 0, (), "steady"),
    ("no samples yet", snap(), POLICY, 0, (), "steady"),
    (
        "cold start: one request with nothing running starts one now",
        snap(demand_samples=(*QUIET, (NOW, 1))),
        POLICY,
        1,
        (),
        "cold start",
    ),
    (
        "cold start never exceeds max",
        snap(demand_samples=demand((10, 0, 20))),
        ScalePolicy(max_replicas=1),
        1,
        (),
        "cold start",
    ),
    (
        "a replica already starting is not started twice",
        snap(starting=1, demand_samples=(*QUIET, (NOW, 1))),
        POLICY,
        1,
        (),
        "steady",
    ),
    (
        "sustained queue above target per replica scales up over the stable window",
        snap(ready=("a",), demand_samples=demand((60, 0, 3))),
        POLICY,
        2,
        (),
        "scale up 1 -> 2",
    ),
    (
        "a short spike below panic level does not scale (hysteresis)",
        snap(ready=("a",), demand_samples=demand((60, 3, 1), (2, 0, 3))),
        POLICY,
        1,
        (),
        "steady",
    ),
    (
        "a burst of 2x capacity in the panic window scales to it at once",
        snap(ready=("a",), demand_samples=demand((60, 6, 0), (5, 0, 10))),
        POLICY,
        4,
        (),
        "panic: scale up 1 -> 4",
    ),
    (
        "panic holds: no scale-down within a stable window of the last panic",
        snap(
            ready=("a", "b", "c"),
            demand_samples=QUIET,
            last_active_by_replica=idle_for(120, "a", "b", "c"),
            last_panic_at=NOW - 59,
        ),
        POLICY,
        3,
        (),
        "panic: holding",
    ),
    (
        "after the panic expires idle replicas go, one at a time",
        snap(
            ready=("a", "b", "c"),
            demand_samples=QUIET,
            last_active_by_replica=idle_for(120, "a", "b", "c"),
            last_panic_at=NOW - 61,
        ),
        POLICY,
        2,
        ("c",),
        "scale down: c",
    ),
    (
        "never above max",
        snap(ready=("a", "b"), demand_samples=demand((60, 0, 100))),
        POLICY,
        4,
        (),
        "panic",
    ),
    (
        "min_replicas is started without demand",
        snap(),
        ScalePolicy(min_replicas=2, max_replicas=3),
        2,
        (),
        "min_replicas",
    ),
    (
        "warm pool: one extra above min",
        snap(ready=("a",), demand_samples=QUIET),
        ScalePolicy(min_replicas=1, max_replicas=3, warm_pool=1),
        2,
        (),
        "scale up 1 -> 2",
    ),
    (
        "warm pool: one extra above demand",
        snap(ready=("a",), demand_samples=demand((60, 0, 2))),
        ScalePolicy(max_replicas=3, warm_pool=1),
        2,
        (),
        "scale up",
    ),
    (
        "warm pool is bounded by max",
        snap(ready=("a",), demand_samples=demand((60, 0, 2))),
        ScalePolicy(max_replicas=1, warm_pool=2),
        1,
        (),
        "steady",
    ),
    (
        "warm pool lets go when the backend is idle and min is 0",
        snap(
            ready=("a", "b"),
            demand_samples=QUIET,
            last_active_by_replica=idle_for(61, "a", "b"),
        ),
        ScalePolicy(max_replicas=3, warm_pool=1),
        1,
        ("b",),
        "scale down",
    ),
    (
        "scale down stops the replica idle longest, after idle_s",
        snap(
            ready=("a", "b"),
            demand_samples=QUIET,
            last_active_by_replica={"a": NOW - 61, "b": NOW - 90},
        ),
        POLICY,
        1,
        ("b",),
        "scale down: b",
    ),
    (
        "no scale-down before idle_s",
        snap(
            ready=("a", "b"),
            demand_samples=QUIET,
            last_active_by_replica=idle_for(59, "a", "b"),
        ),
        POLICY,
        2,
        (),
        "hold 2 (want 0): no replica idle for 60 s",
    ),
    (
        "a replica with requests in flight is never stopped",
        snap(
            ready=("a", "b"),
            demand_samples=QUIET,
            in_flight_by_replica={"a": 1},
            last_active_by_replica={"a": NOW - 500, "b": NOW - 10},
        ),
        POLICY,
        2,
        (),
        "hold",
    ),
    (
        "nothing is counted down while a replica is starting (loading)",
        snap(
            ready=("a",),
            starting=1,
            demand_samples=QUIET,
            last_active_by_replica=idle_for(1000, "a"),
        ),
        POLICY,
        2,
        (),
        "hold 2 (want 0): a replica is still starting",
    ),
    (
        "the last replica waits last_replica_idle_s, not idle_s",
        snap(ready=("a",), demand_samples=QUIET, last_active_by_replica=idle_for(299, "a")),
        POLICY,
        1,
        (),
        "hold 1 (want 0): no replica idle for 300 s",
    ),
    (
        "1 -> 0 after last_replica_idle_s",
        snap(ready=("a",), demand_samples=QUIET, last_active_by_replica=idle_for(300, "a")),
        POLICY,
        0,
        ("a",),
        "scale to zero: a",
    ),
    (
        "a recent request for the backend keeps the last replica",
        snap(
            ready=("a",),
            demand_samples=QUIET,
            last_active_by_replica=idle_for(400, "a"),
            last_request_at=NOW - 200,
        ),
        POLICY,
        1,
        (),
        "hold",
    ),
    (
        "min_replicas 1 never goes to zero",
        snap(ready=("a",), demand_samples=QUIET, last_active_by_replica=idle_for(9999, "a")),
        ScalePolicy(min_replicas=1),
        1,
        (),
        "steady",
    ),
    (
        "any demand within the stable window keeps one replica",
        snap(
            ready=("a",),
            demand_samples=demand((60, 50, 0), (49, 49, 1), (48, 0, 0)),
            last_active_by_replica=idle_for(9999, "a"),
        ),
        POLICY,
        1,
        (),
        "steady",
    ),
    (
        "a replica the driver has no activity for is not stopped",
        snap(
            ready=("a", "b"),
            demand_samples=QUIET,
            in_flight_by_replica={"a": 1},
            last_active_by_replica={"a": NOW},
        ),
        ScalePolicy(max_replicas=2, idle_s=0),
        2,
        (),
        "hold",
    ),
]


@pytest.mark.parametrize(
    ("snapshot", "policy", "target", "stop", "reason"),
    [pytest.param(*row[1:], id=row[0]) for row in SCENARIOS],
)
def test_scenarios(
    snapshot: ScaleSnapshot, policy: ScalePolicy, target: int, stop: tuple[str, ...], reason: str
) -> None:
    decision = desired_replicas(snapshot, policy)
    assert (decision.target, decision.stop) == (target, stop), decision.reason
    assert decision.reason.startswith(reason), decision.reason


def test_panic_is_remembered_through_the_decision() -> None:
    burst = snap(ready=("a",), demand_samples=demand((60, 6, 0), (5, 0, 10)))
    decision = desired_replicas(burst, POLICY)
    assert decision.panic_at == NOW and decision.panicking(NOW + 59, POLICY)
    assert not decision.panicking(NOW + 60, POLICY)
    calm = snap(ready=("a",), demand_samples=QUIET, last_panic_at=decision.panic_at)
    assert desired_replicas(calm, POLICY).panic_at == NOW


def test_desired_is_reported_while_the_target_lags() -> None:
    decision = desired_replicas(
        snap(ready=("a", "b"), demand_samples=QUIET, last_active_by_replica=idle_for(1, "a", "b")),
        POLICY,
    )
    assert (decision.target, decision.desired) == (2, 0)


@pytest.mark.parametrize(
    "kw",
    [
        {"min_replicas": 2, "max_replicas": 1},
        {"max_replicas": 0},
        {"min_replicas": -1},
        {"target_queue_per_replica": 0},
        {"panic_threshold": 0.5},
        {"panic_window_s": 61},
        {"panic_window_s": 0},
        {"idle_s": -1},
        {"warm_pool": -1},
    ],
)
def test_policy_rejects_nonsense(kw: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        ScalePolicy(**kw)


replica_ids = st.lists(st.sampled_from("abcdef"), unique=True, max_size=4)


@given(
    ready=replica_ids,
    starting=st.integers(0, 2),
    values=st.lists(st.integers(0, 40), max_size=30),
    busy=st.sets(st.sampled_from("abcdef")),
    idle=st.floats(0, 1000),
    min_replicas=st.integers(0, 2),
    warm_pool=st.integers(0, 2),
    panic_ago=st.none() | st.floats(0, 200),
)
def test_invariants(
    ready: list[str],
    starting: int,
    values: list[int],
    busy: set[str],
    idle: float,
    min_replicas: int,
    warm_pool: int,
    panic_ago: float | None,
) -> None:
    policy = ScalePolicy(min_replicas=min_replicas, max_replicas=6, warm_pool=warm_pool)
    snapshot = ScaleSnapshot(
        now=NOW,
        ready=tuple(ready),
        starting=starting,
        demand_samples=tuple((NOW - len(values) + i + 1, v) for i, v in enumerate(values)),
        in_flight_by_replica={r: 1 for r in busy},
        last_active_by_replica=idle_for(idle, *ready),
        last_panic_at=None if panic_ago is None else NOW - panic_ago,
    )
    decision: Decision = desired_replicas(snapshot, policy)
    current = len(ready) + starting
    assert min_replicas <= decision.target <= policy.max_replicas or decision.target == current
    assert len(decision.stop) <= 1
    assert set(decision.stop) <= set(ready) - busy
    if decision.stop:
        assert starting == 0 and decision.target == current - 1
        assert decision.panic_at is None or NOW - decision.panic_at >= policy.stable_window_s
        if decision.target == 0:
            assert min_replicas == 0 and idle >= policy.last_replica_idle_s
            assert not values or values[-1] == 0
        else:
            assert idle >= policy.idle_s
    else:
        assert decision.target >= current or decision.target >= min_replicas
    if values and values[-1] > 0 and current == 0:
        assert decision.target >= 1
