"""Pacing of lower-class dispatches: the token bucket alone, then in the scheduler."""

from __future__ import annotations

import asyncio

import pytest

from gateway.traffic.pacing import RATE_HEADROOM, RATE_WINDOW_S, Pacer, prefill_steps
from gateway.traffic.scheduler import FairScheduler
from tests.traffic.test_scheduler import FakeClock, Harness


def test_off_by_default_and_at_interval_zero() -> None:
    pacer = Pacer()
    for _ in range(100):
        assert pacer.ready(0.0)
        pacer.take(0.0)


def test_one_at_a_time_then_one_per_interval() -> None:
    pacer = Pacer()
    pacer.set_interval(0.02, 0.0)
    pacer.take(0.0)
    assert not pacer.ready(0.0)
    assert pacer.wait_s(0.0) == pytest.approx(0.02)
    assert not pacer.ready(0.019)
    assert pacer.ready(0.0201)
    pacer.take(0.0201)
    assert pacer.ready(10.0)  # idle: the bucket refills, but only to one
    pacer.take(10.0)
    assert not pacer.ready(10.0)


def test_a_finished_request_is_no_free_replacement() -> None:
    """Requests prefilled in one step finish in one step (equal output lengths): free
    replacements sent them back into one step, and the cohort kept its steps long."""
    pacer = Pacer()
    pacer.set_interval(0.02, 0.0)
    pacer.take(0.0)
    for _ in range(4):
        pacer.finished(0.001)
    assert not pacer.ready(0.001)


def test_the_pace_keeps_up_with_completions_faster_than_one_a_step() -> None:
    """A batch of short answers finishes several a step: the tokens then accrue at the
    completion rate (with headroom), so pacing never caps what the engine finishes."""
    pacer = Pacer()
    pacer.set_interval(0.02, 0.0)
    for i in range(200):  # 100 a second over the last two: two a 20 ms step
        pacer.finished(i * 0.01)
    now = 1.99
    pacer.take(now)
    expected = RATE_WINDOW_S / (RATE_HEADROOM * 200)
    assert pacer.wait_s(now) == pytest.approx(expected)
    assert pacer.rate_per_s(now) == pytest.approx(1 / expected)  # /readyz's pace_per_s
    assert expected < 0.02 / 2
    assert pacer.wait_s(now + 5.0) == 0.0  # ready; and completions that old no longer count
    pacer.take(now + 5.0)
    assert pacer.wait_s(now + 5.0) == pytest.approx(0.02)
    assert pacer.rate_per_s(now + 5.0) == pytest.approx(50.0)  # /readyz: one a 20 ms step
    assert Pacer().rate_per_s(0.0) is None  # off


def test_a_dispatch_costs_the_steps_its_prompt_spans() -> None:
    """A 256-token prompt in 64-token chunks prefills over four steps: the next lower-class
    dispatch waits four intervals, so two prompts never prefill side by side."""
    pacer = Pacer()
    pacer.set_interval(0.02, 0.0)
    pacer.take(0.0, steps=4.0)
    assert pacer.wait_s(0.0) == pytest.approx(0.08)
    assert not pacer.ready(0.079)
    assert pacer.ready(0.0801)
    assert pacer.rate_per_s(0.0801) == pytest.approx(50.0)  # steps a second, not dispatches


def test_completions_count_in_steps_for_the_rate_rule() -> None:
    """Completions of four-step prompts at 100 a second allow 400 steps a second (with
    headroom), not 100: the rule never caps what the engine finishes, whatever the cost."""
    pacer = Pacer()
    pacer.set_interval(0.02, 0.0)
    for i in range(200):
        pacer.finished(i * 0.01, steps=4.0)
    now = 1.99
    pacer.take(now, steps=4.0)
    expected = RATE_WINDOW_S / (RATE_HEADROOM * 800)
    assert pacer.wait_s(now) == pytest.approx(4 * expected)  # four steps owed
    assert pacer.rate_per_s(now) == pytest.approx(1 / expected)
    assert pacer.rate_per_s(now + 5.0) == pytest.approx(50.0)  # old completions forgotten


def test_prefill_steps() -> None:
    assert prefill_steps(5000, None) == 1.0  # the engine prefills a prompt in one step
    assert prefill_steps(256, 64) == 4.0
    assert prefill_steps(257, 64) == 5.0
    assert prefill_steps(10, 64) == 1.0
    assert prefill_steps(0, 64) == 1.0
    with pytest.raises(ValueError, match="prefill_chunk_tokens"):
        FairScheduler(1, 1, prefill_chunk_tokens=0)


async def test_the_scheduler_spaces_chunked_prompts_by_their_steps() -> None:
    """With 64-token chunks, 256-token batch prompts go one per four 20 ms steps; a short
    prompt costs one step; interactive ones are never paced."""
    clock = FakeClock()
    h = Harness(FairScheduler(10, 100, clock, prefill_chunk_tokens=64))
    h.scheduler.set_pace(0.02)
    for i in range(3):
        await h.submit(f"b{i}", tenant="jobs", input_tokens=256)
    assert h.order == ["b0"]
    await h.submit("i0", tenant="web", priority="interactive", input_tokens=256)
    assert h.order == ["b0", "i0"]
    clock.now += 0.06  # three steps: not yet
    await asyncio.sleep(0.05)
    await h.settle()
    assert h.order == ["b0", "i0"]
    clock.now += 0.02  # the fourth
    await asyncio.sleep(0.05)
    await h.settle()
    assert h.order == ["b0", "i0", "b1"]
    h.scheduler.set_pace(0.0)
    await h.drain()


async def test_without_chunks_each_prompt_costs_one_step() -> None:
    clock = FakeClock()
    h = Harness(FairScheduler(10, 100, clock))
    h.scheduler.set_pace(0.02)
    for i in range(3):
        await h.submit(f"b{i}", tenant="jobs", input_tokens=256)
    clock.now += 0.02
    await asyncio.sleep(0.05)
    await h.settle()
    assert h.order == ["b0", "b1"]
    h.scheduler.set_pace(0.0)
    await h.drain()


async def test_batch_growth_is_paced_interactive_is_not_and_a_timer_dispatches_the_rest() -> None:
    """Ten free slots and a step time of 20 ms: twelve batch requests at once start one at
    once, then one per 20 ms without anything else happening, and a finish frees no extra
    one; an interactive arrival goes straight through."""
    clock = FakeClock()
    h = Harness(FairScheduler(10, 100, clock))
    h.scheduler.set_pace(0.02)
    for i in range(12):
        await h.submit(f"b{i}", tenant="jobs")
    assert len(h.running) == 1
    await h.submit("i0", tenant="web", priority="interactive")
    assert h.order[-1] == "i0" and len(h.running) == 2
    clock.now += 0.02
    await asyncio.sleep(0.03)  # the pacing timer (real time) pumps; the clock says 20 ms
    await h.settle()
    assert len(h.running) == 3
    await h.finish_one()  # a finish: no free replacement
    assert len(h.running) == 2
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
