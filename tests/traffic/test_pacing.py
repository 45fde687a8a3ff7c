"""Pacing of lower-class dispatches: the token bucket alone, then in the scheduler."""

from __future__ import annotations

import asyncio

import pytest

from gateway.traffic.pacing import Pacer
from gateway.traffic.scheduler import FairScheduler
from tests.traffic.test_scheduler import FakeClock, Harness


def test_off_by_default_and_at_interval_zero() -> None:
    pacer = Pacer()
    for _ in range(100):
        assert pacer.ready(0.0)
        pacer.take(0.0)


def test_a_burst_then_one_per_interval_and_a_free_replacement_per_finish() -> None:
    pacer = Pacer(burst=2)
    pacer.set_interval(0.02, 0.0)
    pacer.take(0.0)
    pacer.take(0.0)
    assert not pacer.ready(0.0)
    assert pacer.wait_s(0.0) == pytest.approx(0.02)
    assert not pacer.ready(0.019)
    assert pacer.ready(0.0201)
    pacer.take(0.0201)
    assert not pacer.ready(0.0201)
    pacer.credit()  # a request finished: its replacement goes at once
    assert pacer.ready(0.0201)
    assert pacer.ready(10.0)  # idle: the bucket refills, but only to the burst
    pacer.take(10.0)
    pacer.take(10.0)
    assert not pacer.ready(10.0)


def test_a_burst_below_one_is_refused() -> None:
    with pytest.raises(ValueError, match="burst"):
        Pacer(burst=0.5)


async def test_batch_growth_is_paced_interactive_is_not_and_a_timer_dispatches_the_rest() -> None:
    """Ten free slots and a step time of 20 ms: twelve batch requests at once start two at
    once (the burst), then one per 20 ms without anything else happening; an interactive
    arrival goes straight through."""
    clock = FakeClock()
    h = Harness(FairScheduler(10, 100, clock))
    h.scheduler.set_pace(0.02)
    for i in range(12):
        await h.submit(f"b{i}", tenant="jobs")
    assert len(h.running) == 2
    await h.submit("i0", tenant="web", priority="interactive")
    assert h.order[-1] == "i0" and len(h.running) == 3
    clock.now += 0.02
    await asyncio.sleep(0.03)  # the pacing timer (real time) pumps; the clock says 20 ms
    await h.settle()
    assert len(h.running) == 4
    await h.finish_one()  # a finish: its replacement is free
    assert len(h.running) == 4
    h.scheduler.set_pace(0.0)  # pacing off: the rest up to the room (9 of 10, reserve 1)
    await h.settle()
    assert len(h.running) == 9
    await h.drain()


def test_the_pool_paces_at_the_median_step_per_replica_and_never_slower_than_max() -> None:
    from types import SimpleNamespace
    from typing import Any

    from gateway.traffic.pool import MAX_PACE_S, Pool

    def handles(*steps: float | None) -> Any:
        return [SimpleNamespace(capacity=SimpleNamespace(step_s=s)) for s in steps]

    assert Pool._pace_s(handles(None, None)) == 0.0  # fixed limits, or nothing measured yet
    assert Pool._pace_s(handles(0.02, 0.04, None)) == pytest.approx(0.03 / 3)
    assert Pool._pace_s(handles(2.0)) == MAX_PACE_S  # a per-token latency no step takes
