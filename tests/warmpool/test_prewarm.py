"""Raised floors: the policy honours them until they expire (pure, the clock passed in), and
the manager applies a pre-warm at once and a scheduled floor at each tick (fake provider,
hand-driven clock and ticks)."""

from __future__ import annotations

import pytest

from tests.backends.support import wait_until
from tests.warmpool.test_manager import FakeClock, running
from warmpool.autoscale import Floor, ScalePolicy, ScaleSnapshot, desired_replicas

NOW = 1000.0
POLICY = ScalePolicy(max_replicas=3, idle_s=10, last_replica_idle_s=30)
QUIET = tuple((NOW - ago, 0) for ago in range(60, -1, -1))
LONG_IDLE = {"a": NOW - 500, "b": NOW - 500}

CASES: list[tuple[str, ScaleSnapshot, int, tuple[str, ...], str]] = [
    # (name, snapshot, target, stop, reason starts with)
    (
        "a floor at zero starts that many at once",
        ScaleSnapshot(NOW, demand_samples=QUIET, floors=(Floor(2, NOW + 60),)),
        2,
        (),
        "floor 2: scale up 0 -> 2",
    ),
    (
        "an expired floor asks for nothing",
        ScaleSnapshot(NOW, demand_samples=QUIET, floors=(Floor(2, NOW),)),
        0,
        (),
        "steady",
    ),
    (
        "the largest floor that holds wins",
        ScaleSnapshot(NOW, floors=(Floor(3, NOW - 1), Floor(1, NOW + 5), Floor(2, NOW + 1))),
        2,
        (),
        "floor 2",
    ),
    (
        "never above max_replicas",
        ScaleSnapshot(NOW, floors=(Floor(9, NOW + 60),)),
        3,
        (),
        "floor 9: scale up 0 -> 3",
    ),
    (
        "idle replicas are kept while it holds",
        ScaleSnapshot(
            NOW, ("a", "b"), last_active_by_replica=LONG_IDLE, floors=(Floor(2, NOW + 1),)
        ),
        2,
        (),
        "steady",
    ),
    (
        "and go by the idle rules once it expires",
        ScaleSnapshot(NOW, ("a", "b"), last_active_by_replica=LONG_IDLE, floors=(Floor(2, NOW),)),
        1,
        ("b",),
        "scale down: b idle 10 s",
    ),
    (
        "demand above the floor still scales by demand",
        ScaleSnapshot(
            NOW,
            ("a",),
            demand_samples=tuple((NOW - ago, 3) for ago in range(60, -1, -1)),
            last_active_by_replica={"a": NOW},
            floors=(Floor(1, NOW + 60),),
        ),
        2,
        (),
        "scale up 1 -> 2",
    ),
]


@pytest.mark.parametrize(
    ("name", "snapshot", "target", "stop", "reason"), CASES, ids=[c[0] for c in CASES]
)
def test_policy_honours_floors_until_they_expire(
    name: str, snapshot: ScaleSnapshot, target: int, stop: tuple[str, ...], reason: str
) -> None:
    decision = desired_replicas(snapshot, POLICY)
    assert (decision.target, decision.stop) == (target, stop)
    assert decision.reason.startswith(reason), decision.reason


async def test_prewarm_starts_replicas_now_and_holds_them_until_it_expires() -> None:
    async with running(POLICY, FakeClock(0.0)) as rig:
        clock, provider, manager = rig.clock, rig.provider, rig.manager
        decision = manager.prewarm(2, hold_s=100)
        assert (decision.target, decision.reason) == (2, "floor 2: scale up 0 -> 2")
        await wait_until(lambda: provider.starting() == 2, "two starts")
        assert provider.ensure_calls == [2]
        provider.load()
        await wait_until(lambda: len(manager.ready()) == 2, "two ready")
        assert manager.snapshot().floor == 2
        [record] = rig.sink.records  # a start no request waited for ends at ready
        assert record.trigger == "prewarm"

        clock.now = 99.0  # idle far past idle_s, but the pre-warm holds
        assert manager.tick().stop == ()
        clock.now = 100.0
        first = manager.tick()
        assert first.stop == ("fake-2",) and manager.snapshot().floor == 0
        await wait_until(lambda: provider.stop_calls == ["fake-2"], "fake-2 to stop")
        assert manager.tick().stop == ("fake-1",)  # ready at 0: idle past last_replica_idle_s
        await wait_until(lambda: provider.ready() == [], "fake-1 to stop")


async def test_a_second_prewarm_extends_and_the_first_still_counts() -> None:
    async with running(POLICY, FakeClock(0.0)) as rig:
        rig.manager.prewarm(2, hold_s=50)
        assert rig.manager.prewarm(1, hold_s=500).target == 2
        rig.clock.now = 60.0
        assert rig.manager.snapshot().floor == 1


async def test_scheduled_floor_is_read_at_each_tick() -> None:
    scheduled = [1]
    async with running(POLICY, FakeClock(0.0), floor=lambda: scheduled[0]) as rig:
        clock, provider, manager = rig.clock, rig.provider, rig.manager
        await wait_until(lambda: provider.ensure_calls == [1], "the start at startup")
        provider.load()
        await wait_until(lambda: len(manager.ready()) == 1, "one ready")
        clock.now = 1000.0
        assert manager.tick().stop == ()  # the window is open
        scheduled[0] = 0  # it closed
        assert manager.tick().stop == ("fake-1",)
