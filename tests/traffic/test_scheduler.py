"""The fair scheduler: pure VTC bookkeeping and shedding decisions in tables, then the
asyncio driver with a fake clock and slots released by hand."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gateway.traffic.fair_queue import Entry, FairQueue, lifted_counter, token_cost
from gateway.traffic.scheduler import FairScheduler, Shed, Slot
from gateway.traffic.shedding import (
    ADMIT_WAIT_FRACTION,
    MIN_DRAIN_SAMPLES,
    ClassLoad,
    DrainRate,
    ServiceTimeEstimator,
    expected_wait_s,
    measured_wait_s,
    retry_after_s,
    should_shed,
)


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


FAR = 1e9  # a deadline that never matters


# ---- pure policies -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("input_tokens", "output_tokens", "weight", "output_weight", "expected"),
    [
        (200, 0, 1.0, 2.0, 200.0),
        (20_000, 0, 1.0, 2.0, 20_000.0),  # a big prompt is a hundred small ones
        (100, 50, 1.0, 2.0, 200.0),  # output counts double
        (100, 50, 2.0, 2.0, 100.0),  # a weight-2 tenant is charged half
        (100, 50, 1.0, 1.0, 150.0),
    ],
)
def test_token_cost(
    input_tokens: int, output_tokens: int, weight: float, output_weight: float, expected: float
) -> None:
    assert token_cost(input_tokens, output_tokens, weight, output_weight) == expected


@pytest.mark.parametrize(
    ("counter", "active", "last_idle", "expected", "why"),
    [
        (0.0, [500.0, 300.0], 0.0, 300.0, "returning tenant starts at the lowest waiting"),
        (900.0, [500.0, 300.0], 0.0, 900.0, "a tenant ahead keeps its counter"),
        (0.0, [], 700.0, 700.0, "nobody waits: the last line to empty sets the floor"),
        (800.0, [], 700.0, 800.0, "never lowered"),
        (0.0, [], 0.0, 0.0, "first tenant ever"),
    ],
)
def test_lifted_counter(
    counter: float, active: list[float], last_idle: float, expected: float, why: str
) -> None:
    assert lifted_counter(counter, active, last_idle) == expected, why


@pytest.mark.parametrize(
    ("ahead", "in_flight", "max_concurrency", "mean_s", "expected"),
    [
        (0, 0, 4, 2.0, 0.0),  # free slot
        (0, 3, 4, 2.0, 0.0),
        (0, 4, 4, 2.0, 0.5),  # next slot to free, at 4 per 2 s
        (3, 4, 4, 2.0, 2.0),  # one full round of the slots ahead, then ours
        (7, 4, 4, 2.0, 4.0),
        (9, 1, 1, 0.1, 1.0),
    ],
)
def test_expected_wait(
    ahead: int, in_flight: int, max_concurrency: int, mean_s: float, expected: float
) -> None:
    assert expected_wait_s(ahead, in_flight, max_concurrency, mean_s) == pytest.approx(expected)


@pytest.mark.parametrize(
    ("now", "deadline", "wait", "fraction", "shed"),
    [
        (10.0, 20.0, 5.0, 1.0, False),
        (10.0, 20.0, 10.0, 1.0, False),  # exactly on time still makes it
        (10.0, 20.0, 10.5, 1.0, True),
        (10.0, 10.0, 0.0, 1.0, True),  # no time left at all
        (10.0, 9.0, 0.0, 1.0, True),
        (10.0, 20.0, 5.0, 0.5, False),  # half the time left: the admission margin
        (10.0, 20.0, 5.5, 0.5, True),
    ],
)
def test_should_shed(now: float, deadline: float, wait: float, fraction: float, shed: bool) -> None:
    assert should_shed(now, deadline, wait, fraction) is shed


@pytest.mark.parametrize(("wait", "expected"), [(0.0, 1.0), (3.5, 3.5), (500.0, 60.0)])
def test_retry_after_is_bounded(wait: float, expected: float) -> None:
    assert retry_after_s(wait) == expected


def test_service_time_estimator_trusts_the_first_sample_then_smooths() -> None:
    estimator = ServiceTimeEstimator(initial_s=1.0, alpha=0.5)
    estimator.observe(4.0)
    assert estimator.mean_s == 4.0
    estimator.observe(2.0)
    assert estimator.mean_s == 3.0
    estimator.observe(float("nan"))
    estimator.observe(-1.0)
    assert (estimator.mean_s, estimator.samples) == (3.0, 2)


def test_class_load_is_the_capacity_higher_classes_kept_busy_lately() -> None:
    load = ClassLoad(window_s=2.0)

    def each(mean_s: float) -> Callable[[int], float]:
        return lambda rank: mean_s

    assert load.above(1, 0.0, each(0.1), 4) == 0.0
    for i in range(20):  # interactive: 10/s for 2 s of 0.1 s each on 4 slots = 1/4
        load.record(i * 0.1, 0)
        load.record(i * 0.1, 1)
    assert load.above(1, 1.95, each(0.1), 4) == pytest.approx(0.25)
    assert load.above(0, 1.95, each(0.1), 4) == 0.0  # nothing ranks before the top class
    assert load.above(1, 1.95, each(0.1), 0) == 0.0  # no capacity (cold): no stretch to compute
    assert load.above(1, 1.95, each(1.0), 1) == 1.0  # never more than all of it
    # each class weighed by its own service time: short interactive answers, long batch ones
    by_class = {0: 0.1, 1: 2.0}.__getitem__
    # (20 x 0.1 s + 20 x 2 s) of 40 slots x 2 s
    assert load.above(2, 1.95, by_class, 40) == pytest.approx(42 / 80)
    assert load.above(1, 3.85, each(0.1), 4) == pytest.approx(0.0125)  # the older left the window
    assert load.above(1, 10.0, each(0.1), 4) == 0.0
    with pytest.raises(ValueError, match="window_s"):
        ClassLoad(window_s=0.0)


def test_drain_rate_is_what_finished_lately_by_class_and_tenant() -> None:
    drain = DrainRate(started=0.0, window_s=5.0)
    drain.busy(0.0)
    for i in range(MIN_DRAIN_SAMPLES - 1):
        drain.record(1.0 + i * 0.1, 1, "a", 1.0)
    assert drain.rates(1, "a", 2.0) is None  # too few to say anything
    drain.record(2.0, 1, "b", 2.0)
    drain.record(2.0, 0, "a", 1.0)  # another class: not this one's drain
    # 5 batch requests finished in the 2.5 s since the start (less than a window)
    assert drain.rates(1, "a", 2.5) == pytest.approx((2.0, 1.6))
    assert drain.rates(1, "c", 2.5) == pytest.approx((2.0, 0.0))
    assert drain.weights(1, 2.5) == {"a": 1.0, "b": 2.0}
    assert drain.rates(1, "a", 10.0) is None  # all left the window
    assert drain.weights(1, 10.0) == {}
    with pytest.raises(ValueError, match="window_s"):
        DrainRate(started=0.0, window_s=0.0)


def test_drain_rate_stops_while_idle() -> None:
    """Time with nothing to do is not drain: after a quiet minute the rates are those of
    the last busy seconds (not none, which left the first burst to the model)."""
    drain = DrainRate(started=0.0, window_s=5.0)
    drain.busy(0.0)
    for i in range(10):
        drain.record(5.25 + i * 0.5, 1, "a", 1.0)  # 2/s over the last 5 s
    drain.idle(10.0)
    assert drain.rates(1, "a", 70.0) == pytest.approx((2.0, 2.0))
    drain.busy(70.0)
    assert drain.rates(1, "a", 72.5) == pytest.approx((1.0, 1.0))  # half left the window
    assert drain.rates(1, "a", 80.0) is None


@pytest.mark.parametrize(
    ("own", "class_rate", "tenant_rate", "share", "expected"),
    [
        (9, 10.0, 2.0, 0.0, 5.0),  # backlogged: its own line's pace, 2/s
        (9, 10.0, 2.0, 0.5, 2.0),  # not backlogged: at least its share of the class's
        (9, 10.0, 8.0, 0.5, 1.25),  # faster than its share: the others left it room
        (0, 4.0, 0.0, 1.0, 0.25),  # an idle tenant alone in the class: the next to go
        (3, 10.0, 0.0, 0.0, float("inf")),  # backlogged and served nothing: never
    ],
)
def test_measured_wait(
    own: int, class_rate: float, tenant_rate: float, share: float, expected: float
) -> None:
    assert measured_wait_s(own, class_rate, tenant_rate, share) == pytest.approx(expected)


def entry(
    tenant: str, rank: int = 1, charge: float = 100.0, weight: float = 1.0, at: float = 0.0
) -> Entry:
    return Entry(tenant, weight, "batch" if rank else "interactive", rank, charge, FAR, at)


def test_queue_orders_by_class_then_counter_then_arrival() -> None:
    queue = FairQueue()
    a1, a2, b1 = entry("a"), entry("a"), entry("b")
    for e in (a1, a2, b1):
        queue.push(e)
    assert queue.peek() is a1  # equal counters: the oldest
    queue.dispatch(a1)
    assert queue.peek() is b1  # a was charged, b is behind
    urgent = entry("a", rank=0)
    queue.push(urgent)
    assert queue.peek() is urgent  # a higher class goes first, whatever the counters
    assert (queue.depth(0), queue.depth(1), queue.ahead(0), queue.ahead(1)) == (1, 2, 1, 3)


def test_queue_lifts_a_returning_tenant_to_the_lowest_active_counter() -> None:
    queue = FairQueue()
    for _ in range(3):
        e = entry("a", charge=500.0)
        queue.push(e)
        queue.dispatch(e)
    assert queue.counter("a") == 1500.0
    queue.push(entry("b"))  # b was idle all along: no banked credit
    assert queue.counter("b") == 1500.0


def test_queue_lifts_to_the_last_idle_counter_when_nobody_is_active() -> None:
    queue = FairQueue()
    e = entry("a", charge=500.0)
    queue.push(e)
    queue.dispatch(e)
    queue.complete(e, 800.0)  # the estimate was low: corrected up
    assert queue.counter("a") == 800.0
    queue.push(entry("b"))
    assert queue.counter("b") == 800.0


def test_queue_lifts_a_tenant_whose_line_emptied_though_it_has_requests_in_flight() -> None:
    """The paper's rule: the line, not queued-or-in-flight. Light has a request in flight
    all along while heavy (lifted to light's 100 on arrival) is served eight; light's
    next arrival starts at heavy's counter, not at its own 100 (from which it would take
    the next eight dispatches)."""
    queue = FairQueue()
    first = entry("light")
    queue.push(first)
    queue.dispatch(first)  # in flight from here on
    for _ in range(8):
        e = entry("heavy")
        queue.push(e)
        queue.dispatch(e)
    queue.push(entry("heavy"))  # heavy waits with 900
    queue.push(entry("light"))
    assert queue.counter("light") == queue.counter("heavy") == 900.0


def test_queue_knows_since_when_a_line_is_backlogged_and_who_waits() -> None:
    queue = FairQueue()
    a1, a2, b1 = entry("a", at=5.0), entry("a", at=6.0), entry("b", weight=3.0, at=7.0)
    for e in (a1, a2, b1):
        queue.push(e)
    assert queue.backlogged_since("a", 1) == 5.0
    assert (queue.line("a", 1), queue.line("b", 1), queue.line("a", 0)) == (2, 1, 0)
    assert queue.waiting_weights(1) == {"a": 1.0, "b": 3.0}
    assert queue.waiting_weights(0) == {}
    queue.dispatch(a1)
    assert queue.backlogged_since("a", 1) == 5.0  # not a break: a2 waited all along
    queue.withdraw(a2)
    assert queue.backlogged_since("a", 1) is None
    queue.push(entry("a", at=9.0))
    assert queue.backlogged_since("a", 1) == 9.0


def test_queue_completion_refunds_an_overestimate() -> None:
    queue = FairQueue()
    e = entry("a", charge=1000.0)
    queue.push(e)
    queue.dispatch(e)
    queue.complete(e, 150.0)
    assert queue.counter("a") == 150.0


def test_queue_picks_the_newest_lowest_class_waiter_to_displace() -> None:
    queue = FairQueue()
    old, new, urgent = entry("a"), entry("b"), entry("c", rank=0)
    for e in (old, new, urgent):
        queue.push(e)
    assert queue.newest_below(0) is new
    assert queue.newest_below(1) is None
    queue.withdraw(new)
    queue.withdraw(old)
    assert queue.newest_below(0) is None
    assert len(queue) == 1


@given(st.lists(st.tuples(st.sampled_from("abc"), st.integers(0, 1), st.integers(1, 5000))))
def test_queue_never_serves_a_lower_class_first_and_empties(
    requests: list[tuple[str, int, int]],
) -> None:
    queue = FairQueue()
    for tenant, rank, charge in requests:
        queue.push(entry(tenant, rank, float(charge)))
    ranks = []
    while (e := queue.peek()) is not None:
        queue.dispatch(e)
        queue.complete(e, e.charge)
        ranks.append(e.rank)
    assert ranks == sorted(ranks)
    assert len(queue) == 0


# ---- the asyncio driver --------------------------------------------------------------------


class Harness:
    """Requests as tasks; slots released by hand, oldest first, with the usage each was
    submitted with; dispatch order recorded."""

    def __init__(self, scheduler: FairScheduler) -> None:
        self.scheduler = scheduler
        self.pending: list[tuple[str, asyncio.Task[Slot], tuple[int, int]]] = []
        self.running: list[tuple[Slot, tuple[int, int]]] = []
        self.order: list[str] = []

    async def submit(
        self,
        tag: str,
        tenant: str | None = None,
        priority: str = "batch",
        input_tokens: int = 100,
        max_output_tokens: int = 0,
        deadline: float = FAR,
    ) -> asyncio.Task[Slot]:
        task = asyncio.create_task(
            self.scheduler.acquire(
                tenant or tag, 1.0, priority, input_tokens, max_output_tokens, deadline
            )
        )
        self.pending.append((tag, task, (input_tokens, max_output_tokens)))
        await self.settle()
        return task

    async def settle(self) -> None:
        for _ in range(3):
            await asyncio.sleep(0)
        for item in [p for p in self.pending if p[1].done()]:
            self.pending.remove(item)
            tag, task, usage = item
            if not task.cancelled() and task.exception() is None:
                self.order.append(tag)
                self.running.append((task.result(), usage))

    async def finish_one(self) -> None:
        slot, usage = self.running.pop(0)
        slot.release(*usage, service_s=1.0)
        await self.settle()

    async def drain(self) -> None:
        while self.running:
            await self.finish_one()
        assert not self.pending


async def one_slot_taken(
    max_queue: int,
    clock: Callable[[], float] = time.monotonic,
    initial_service_s: float = 1.0,
    admit_fraction: float = ADMIT_WAIT_FRACTION,
) -> Harness:
    """A scheduler with one slot, held by a request tagged `busy`: what follows waits."""
    scheduler = FairScheduler(
        1, max_queue, clock, initial_service_s=initial_service_s, admit_fraction=admit_fraction
    )
    h = Harness(scheduler)
    await h.submit("busy")
    return h


async def test_while_interactive_is_active_batch_leaves_a_slot_free_for_it() -> None:
    """Ten slots: with no interactive traffic lately batch may fill all ten; once an
    interactive request was dispatched, batch fills nine and the tenth waits for the next
    interactive arrival, which is dispatched at once."""
    clock = FakeClock()
    h = Harness(FairScheduler(10, 100, clock))
    for i in range(12):
        await h.submit(f"b{i}", tenant="jobs")
    assert len(h.running) == 10  # no interactive lately: no reserve
    await h.drain()
    await h.submit("i0", tenant="web", priority="interactive")
    for i in range(12):
        await h.submit(f"c{i}", tenant="jobs")
    assert len(h.running) == 1 + 8  # i0 and eight batch: the tenth slot is kept
    # A batch newcomer behind jobs' 4 waiters counts on 9 slots, not 10: 5 turns of 1/9 s
    # (0.57 s with interactive's share), past half of the 1 s it has. On 10, with the kept
    # slot taken for free, it would have counted 0.41 s and been admitted.
    with pytest.raises(Shed, match="deadline_unreachable"):
        await h.scheduler.acquire("jobs", 1.0, "batch", 100, 0, clock.now + 1.0)
    await h.submit("i1", tenant="web", priority="interactive")
    assert h.order[-1] == "i1" and len(h.running) == 10
    clock.now += 10.0  # interactive quiet for longer than the window: batch takes it all
    await h.finish_one()
    assert len(h.running) == 10 and h.order[-1].startswith("c")
    await h.drain()


async def test_under_ten_slots_batch_keeps_none_free() -> None:
    """A reserve is a tenth of the ceiling, rounded down: of 4 slots none is kept, since
    a kept slot idles whenever interactive traffic does not fill it (a quarter of a 4-slot
    upstream), while waiting for the first of 4 to finish costs an interactive arrival a
    quarter of a service time or less."""
    clock = FakeClock()
    h = Harness(FairScheduler(4, 100, clock))
    await h.submit("i0", tenant="web", priority="interactive")
    for i in range(6):
        await h.submit(f"b{i}", tenant="jobs")
    assert len(h.running) == 4  # i0 and three batch: every slot in use
    await h.finish_one()  # i0 done, interactive recent: batch still takes its slot
    assert len(h.running) == 4 and h.order[-1] == "b3"
    await h.drain()


async def test_interactive_counts_only_its_own_requests_against_a_learned_limit() -> None:
    """A learned limit of 10 under a ceiling of 100, batch holding all ten slots:
    interactive arrivals are still dispatched at once, however close their deadline (the
    batch requests in flight and waiting are no queue to them), up to ten of their own.
    With a fixed limit (ceiling = limit) nothing goes over it: batch keeps one slot free
    for interactive, and past it a tight deadline is refused."""
    for ceiling, dispatched in ((100, 10), (None, 1)):
        clock = FakeClock()
        h = Harness(FairScheduler(10, 100, clock))
        h.scheduler.set_capacity(10, ceiling=ceiling)
        await h.submit("i0", tenant="web", priority="interactive")
        await h.drain()
        for i in range(12):
            await h.submit(f"b{i}", tenant="jobs")
        batch_slots = 10 if ceiling else 9  # the reserve, where the ceiling binds
        assert len(h.running) == batch_slots
        await h.submit("i1", tenant="web", priority="interactive")
        tight = h.scheduler.acquire("web", 1.0, "interactive", 10, 10, clock.now + 0.01)
        if ceiling is None:
            with pytest.raises(Shed, match="deadline_unreachable"):
                await tight
        else:
            h.running.append((await tight, (10, 10)))
        for i in range(3, 20):
            await h.submit(f"i{i}", tenant="web", priority="interactive")
        assert len(h.running) == batch_slots + dispatched
        sent = 1 + (1 if ceiling else 0) + 17  # i1, the tight one unless refused, i3-i19
        assert h.scheduler.snapshot().depth["interactive"] == sent - dispatched
        await h.drain()


async def test_batch_goes_only_once_everything_in_flight_is_under_the_limit() -> None:
    """Interactive took eight of a learned limit of 10 (ceiling 100) while batch held
    ten: batch waits until the total is under 10, however many of its own it has."""
    clock = FakeClock()
    h = Harness(FairScheduler(10, 100, clock))
    h.scheduler.set_capacity(10, ceiling=100)
    for i in range(10):
        await h.submit(f"b{i}", tenant="jobs")
    for i in range(8):
        await h.submit(f"i{i}", tenant="web", priority="interactive")
    await h.submit("b10", tenant="jobs")
    assert len(h.running) == 18 and "b10" not in h.order
    batch = [item for item in h.running if item[0].rank == 1]
    for _ in range(8):  # eight batch requests finish: 2 batch + 8 interactive remain
        slot, _ = h.running.pop(h.running.index(batch.pop()))
        slot.release(10, 10)
    await h.settle()
    assert "b10" not in h.order
    slot, _ = h.running.pop(h.running.index(batch.pop()))
    slot.release(10, 10)  # 9 in flight: b10 goes
    await h.settle()
    assert h.order[-1] == "b10"
    await h.drain()


async def test_while_the_limit_is_cut_interactive_still_gets_the_limit_of_its_own() -> None:
    """A limit of 10 cut to 4 (the engine queued, or a latency baseline is measured)
    while batch holds ten: four interactive requests still go at once, the rest wait."""
    clock = FakeClock()
    h = Harness(FairScheduler(10, 100, clock))
    h.scheduler.set_capacity(10, ceiling=100)
    for i in range(12):
        await h.submit(f"b{i}", tenant="jobs")
    h.scheduler.set_capacity(4, ceiling=100)
    for i in range(7):
        await h.submit(f"i{i}", tenant="web", priority="interactive")
    assert len(h.running) == 10 + 4
    await h.drain()


async def _serve_short_interactive_and_one_long_batch(h: Harness) -> None:
    """Ten interactive answers of 0.1 s, then one batch answer of 2 s."""
    for i in range(10):
        await h.submit(f"i{i}", tenant="web", priority="interactive")
        slot, _ = h.running.pop(0)
        slot.release(10, 10, service_s=0.1)
    await h.submit("b0", tenant="jobs")
    slot, _ = h.running.pop(0)
    slot.release(10, 10, service_s=2.0)


async def test_each_class_has_its_own_service_time_for_the_dispatch_margin() -> None:
    """The pool dispatches a request no later than one service time of its class before
    its deadline: a batch answer's, not a mean that short interactive answers pulled down."""
    scheduler = FairScheduler(1, 100, FakeClock())
    h = Harness(scheduler)
    assert scheduler.class_service_s("batch") == scheduler.mean_service_s  # no sample yet
    await _serve_short_interactive_and_one_long_batch(h)
    assert scheduler.class_service_s("batch") == 2.0
    assert scheduler.class_service_s("interactive") == pytest.approx(0.1)
    assert scheduler.mean_service_s < 1.0


async def test_a_batch_newcomer_counts_on_batch_service_times_not_the_mean_of_all() -> None:
    """Short interactive answers pull the overall mean down; a batch queue drains at batch
    pace, so the batch newcomer's expected wait uses batch's own mean."""
    clock = FakeClock()
    scheduler = FairScheduler(1, 100, clock)
    h = Harness(scheduler)
    await _serve_short_interactive_and_one_long_batch(h)
    assert scheduler.mean_service_s < 1.0
    clock.now += 10.0  # interactive out of the load window
    await h.submit("busy", tenant="jobs")
    await h.submit("b1", tenant="jobs")  # one ahead of the newcomer: 2 x 2 s
    with pytest.raises(Shed, match="deadline_unreachable"):
        await scheduler.acquire("jobs", 1.0, "batch", 10, 10, clock.now + 2 * 3.0)
    await h.drain()


async def test_admission_counts_on_the_limit_now() -> None:
    """A limit of 10, cut to 5 and back: a newcomer is admitted on 10 (8 ahead, every slot
    busy: 9 turns of 1 s / 10 = 0.9 s, within half of 3 s); on 5 (1.8 s) it is refused."""
    clock = FakeClock()
    h = Harness(FairScheduler(10, 100, clock, initial_service_s=1.0))
    for i in range(10 + 8):
        await h.submit(f"b{i}", tenant="jobs")
    assert len(h.running) == 10 and len(h.pending) == 8
    h.scheduler.set_capacity(5)
    with pytest.raises(Shed, match="deadline_unreachable"):
        await h.scheduler.acquire("jobs", 1.0, "batch", 100, 0, clock.now + 3.0)
    h.scheduler.set_capacity(10)
    await h.submit("back", tenant="jobs", deadline=clock.now + 3.0)
    assert len(h.pending) == 9
    await h.drain()


async def test_no_replica_yet_is_no_limit_to_remember() -> None:
    """Built at 0 (no replica ready), then 10: a newcomer is admitted on 10, not on the 0
    of before (which refused two thirds of a burst, tests/traffic/test_traffic_e2e.py)."""
    clock = FakeClock()
    h = Harness(FairScheduler(0, 100, clock, initial_service_s=1.0))
    h.scheduler.set_capacity(10)
    for i in range(10 + 8):
        await h.submit(f"b{i}", tenant="jobs")
    await h.submit("new", tenant="jobs", deadline=clock.now + 3.0)  # 0.9 s of 3 s
    assert len(h.running) == 10 and len(h.pending) == 9
    await h.drain()


async def test_a_limit_cut_drops_the_waiters_it_makes_late_at_once() -> None:
    """Eighteen waiters admitted on a limit of 10 (the last expects 1.8 s of its 3.7); the
    limit cut to 3: on 3 slots the newest expects 6 s, so the re-check drops the waiters
    past their deadline now (told at once, not at the deadline) and keeps the oldest."""
    clock = FakeClock()
    h = Harness(FairScheduler(10, 100, clock, initial_service_s=1.0))
    for i in range(10):
        await h.submit(f"busy{i}", tenant="old")
    for i in range(18):
        await h.submit(f"b{i}", tenant="jobs", deadline=clock.now + 3.7)
    assert len(h.pending) == 18
    h.scheduler.set_capacity(3)
    await h.settle()
    dropped = h.scheduler.snapshot().shed.get(("batch", "deadline_slipped"), 0)
    assert 0 < dropped < 18
    assert [tag for tag, task, _ in h.pending if not task.done()] == [
        f"b{i}" for i in range(18 - dropped)
    ]
    h.scheduler.set_capacity(10)
    await h.drain()


async def test_interactive_overtakes_batch() -> None:
    h = Harness(FairScheduler(1, 10, FakeClock()))
    await h.submit("first")
    for tag in ("b1", "b2", "b3"):
        await h.submit(tag, tenant="batchy")
    await h.submit("i1", tenant="batchy", priority="interactive")
    await h.drain()
    assert h.order == ["first", "i1", "b1", "b2", "b3"]


async def test_a_flooding_tenant_does_not_delay_another_beyond_its_share() -> None:
    h = Harness(FairScheduler(2, 100, FakeClock()))
    for i in range(12):
        await h.submit(f"a{i}", tenant="a")
    for i in range(3):
        await h.submit(f"b{i}", tenant="b")
    await h.drain()
    served = [tag[0] for tag in h.order]
    # Two of a's were dispatched before b arrived; from then on b alternates with a's
    # backlog instead of waiting behind all ten of it.
    assert served[:8] == ["a", "a", "a", "b", "a", "b", "a", "b"]
    assert served[8:] == ["a"] * 7


async def test_a_big_prompt_tenant_is_charged_more_and_served_less_often() -> None:
    scheduler = FairScheduler(1, 100, FakeClock())
    h = Harness(scheduler)
    await h.submit("x", tenant="other")
    for i in range(5):
        await h.submit(f"big{i}", tenant="big", input_tokens=20_000, max_output_tokens=100)
        await h.submit(f"small{i}", tenant="small", input_tokens=200, max_output_tokens=100)
    for _ in range(6):
        await h.finish_one()
    counters = scheduler.snapshot().counters
    # Both started at other's 100; big served one request, small five.
    assert (counters["big"], counters["small"]) == (100 + 20_200, 100 + 5 * 400)
    assert h.order[1:] == ["big0", "small0", "small1", "small2", "small3", "small4"]
    await h.drain()


async def test_a_tenant_back_from_idle_starts_at_the_lowest_active_counter() -> None:
    scheduler = FairScheduler(1, 100, FakeClock())
    h = Harness(scheduler)
    for i in range(6):
        await h.submit(f"a{i}", tenant="a", input_tokens=1000)
    await h.finish_one()
    await h.finish_one()
    for i in range(3):
        await h.submit(f"b{i}", tenant="b", input_tokens=1000)
    counters = scheduler.snapshot().counters
    assert counters["b"] == counters["a"] == 3000  # not zero: idle time is not credit
    await h.drain()
    # Had b kept a zero counter, b0 b1 b2 would all have gone before a3.
    assert h.order == ["a0", "a1", "a2", "a3", "b0", "a4", "b1", "a5", "b2"]


async def test_shed_at_once_when_the_deadline_is_out_of_reach() -> None:
    clock = FakeClock()
    h = await one_slot_taken(10, clock, initial_service_s=2.0, admit_fraction=1.0)
    with pytest.raises(Shed) as shed:
        await h.scheduler.acquire("t", 1.0, "batch", 10, 10, deadline=clock.now + 1.0)
    assert shed.value.reason == "deadline_unreachable"
    assert shed.value.retry_after_s == 2.0
    await h.submit("ok", deadline=clock.now + 3.0)
    assert [p[0] for p in h.pending] == ["ok"]
    assert h.scheduler.snapshot().shed == {("batch", "deadline_unreachable"): 1}
    await h.drain()


async def test_lower_classes_are_shed_first() -> None:
    clock = FakeClock()
    h = await one_slot_taken(10, clock, initial_service_s=1.0, admit_fraction=1.0)
    await h.submit("i0", priority="interactive")
    await h.submit("b0")
    await h.submit("b1")
    deadline = clock.now + 3.0  # batch would wait 4 s (3 ahead), interactive 2 s (1 ahead)
    with pytest.raises(Shed, match="deadline_unreachable"):
        await h.scheduler.acquire("t", 1.0, "batch", 10, 10, deadline)
    await h.submit("i1", priority="interactive", deadline=deadline)
    assert len(h.pending) == 4
    await h.drain()


async def test_admitted_only_with_a_margin_for_the_estimate_to_err() -> None:
    clock = FakeClock()
    h = await one_slot_taken(10, clock, initial_service_s=1.0)
    # Expected wait 1 s: it would make a 1.5 s deadline, but a queue under overload sits
    # at its admission limit, where any error in the estimate would cost a late drop.
    tight = clock.now + 0.9 / ADMIT_WAIT_FRACTION
    with pytest.raises(Shed, match="deadline_unreachable"):
        await h.scheduler.acquire("t", 1.0, "batch", 10, 10, tight)
    await h.submit("ok", deadline=clock.now + 1.1 / ADMIT_WAIT_FRACTION)
    assert [p[0] for p in h.pending] == ["ok"]
    await h.drain()


async def test_a_waiter_that_can_no_longer_make_it_is_dropped_at_once() -> None:
    clock = FakeClock()
    h = await one_slot_taken(100, clock, initial_service_s=1.0)
    doomed = await h.submit("b", deadline=clock.now + 9.5)  # a 1 s wait: admitted
    for i in range(8):
        await h.submit(f"i{i}", tenant="inter", priority="interactive")
    assert not doomed.done()  # interactive arrivals go first: a 9 s wait, still in time
    await h.submit("i8", tenant="inter", priority="interactive")
    # A 10 s wait with 9.5 s left: dropped now, not at its deadline (the fake clock has
    # not moved; the deadline timer would only fire 9.5 real seconds from now).
    with pytest.raises(Shed) as shed:
        await doomed
    assert shed.value.reason == "deadline_slipped"
    assert h.scheduler.snapshot().shed == {("batch", "deadline_slipped"): 1}
    assert h.scheduler.snapshot().depth == {"interactive": 9, "batch": 0}
    await h.drain()


async def test_slower_service_drops_only_the_waiters_at_the_back_that_cannot_make_it() -> None:
    clock = FakeClock()
    h = await one_slot_taken(100, clock, initial_service_s=1.0)
    tasks = [await h.submit(f"t{i}", tenant="t", deadline=clock.now + 20) for i in range(6)]
    assert not any(task.done() for task in tasks)  # 6 s for the last one, of 20
    clock.now += 3.0
    slot, _ = h.running.pop(0)
    slot.release(100, 0, service_s=3.0)  # the first sample: 3 s a request from now on
    await h.settle()
    # t0 is dispatched; with 17 s left, t_k waits 3 s per request ahead of it, plus its
    # own turn: t1..t5 need 3, 6, 9, 12, 15 s... then it slows again.
    assert h.order == ["busy", "t0"]
    assert not any(task.done() for task in tasks[1:])
    clock.now += 4.0
    slot, _ = h.running.pop(0)
    slot.release(100, 0, service_s=7.0)  # mean 3 + 0.2 x (7 - 3) = 3.8 s
    await h.settle()
    # t1 dispatched; 13 s left: t2 3.8 s, t3 7.6, t4 11.4 in time; t5 15.2 s is not.
    assert h.order == ["busy", "t0", "t1"]
    with pytest.raises(Shed, match="deadline_slipped"):
        await tasks[5]
    assert not any(task.done() for task in tasks[2:5])
    await h.drain()
    assert h.order == ["busy", "t0", "t1", "t2", "t3", "t4"]


async def test_requests_held_for_a_cold_start_are_not_dropped_before_their_deadline() -> None:
    clock = FakeClock()
    scheduler = FairScheduler(0, 10, clock)
    scheduler.set_capacity(0, cold_start_s=30.0)
    # Admitted without the margin a queue's estimate needs: 30 s of start, 40 s left.
    held = asyncio.ensure_future(scheduler.acquire("a", 1.0, "batch", 10, 10, clock.now + 40))
    await asyncio.sleep(0)
    assert not held.done()
    clock.now += 25.0  # the start is late: 15 s left, against an estimate of 30
    other = asyncio.ensure_future(scheduler.acquire("b", 1.0, "batch", 10, 10, clock.now + 500))
    await asyncio.sleep(0)  # its arrival moves the queue, which checks the waiters again
    assert not held.done()  # the estimate is the whole start, not what is left of it
    scheduler.set_capacity(1)
    await asyncio.sleep(0)
    held.result().release(10, 10)
    await asyncio.sleep(0)
    other.result().release(10, 10)
    assert scheduler.snapshot().shed == {}


async def test_dropped_when_its_deadline_passes_in_the_queue() -> None:
    h = await one_slot_taken(10, initial_service_s=0.001)  # real clock: a real timer
    started = time.monotonic()
    with pytest.raises(Shed) as shed:
        await h.scheduler.acquire("t", 1.0, "batch", 10, 10, deadline=started + 0.05)
    assert shed.value.reason == "deadline_passed"
    assert 0.04 < time.monotonic() - started < 1.0
    assert h.scheduler.snapshot().depth == {"interactive": 0, "batch": 0}
    await h.drain()


async def test_an_expired_waiter_is_never_dispatched() -> None:
    clock = FakeClock()
    h = await one_slot_taken(10, clock, initial_service_s=0.1)
    late = await h.submit("late", deadline=clock.now + 5)
    await h.submit("patient", deadline=clock.now + 50)
    clock.now += 10  # the timer runs on the loop's real clock; the dispatch check catches it
    await h.finish_one()
    assert h.order == ["busy", "patient"]
    with pytest.raises(Shed, match="deadline_passed"):
        await late
    await h.drain()


async def test_a_full_queue_displaces_the_newest_lower_class_waiter() -> None:
    h = await one_slot_taken(2, FakeClock())
    b1 = await h.submit("b1")
    b2 = await h.submit("b2")
    await h.submit("i1", priority="interactive")
    with pytest.raises(Shed, match="displaced"):
        await b2
    with pytest.raises(Shed, match="queue_full"):
        await h.scheduler.acquire("t", 1.0, "batch", 10, 10, FAR)
    await h.submit("i2", priority="interactive")
    with pytest.raises(Shed, match="displaced"):
        await b1
    with pytest.raises(Shed, match="queue_full"):
        await h.scheduler.acquire("t", 1.0, "interactive", 10, 10, FAR)
    assert h.scheduler.snapshot().shed == {
        ("batch", "displaced"): 2,
        ("batch", "queue_full"): 1,
        ("interactive", "queue_full"): 1,
    }
    await h.drain()
    assert h.order == ["busy", "i1", "i2"]


async def test_a_cancelled_waiter_leaves_the_queue() -> None:
    h = await one_slot_taken(10, FakeClock())
    await h.submit("first", tenant="t")
    gone = await h.submit("gone", tenant="t")
    await h.submit("next", tenant="t")
    gone.cancel()
    await h.settle()
    assert h.scheduler.snapshot().depth["batch"] == 2
    await h.drain()
    assert h.order == ["busy", "first", "next"]
    assert h.scheduler.snapshot().in_flight == 0


async def test_a_waiter_cancelled_just_before_a_release_is_skipped() -> None:
    h = await one_slot_taken(10, FakeClock())
    gone = await h.submit("gone", tenant="t")
    await h.submit("next", tenant="t")
    gone.cancel()  # its task has not run its clean-up yet when the slot frees
    slot, _ = h.running.pop(0)
    slot.release(100, 0)
    await h.settle()
    assert gone.cancelled()
    assert h.order == ["busy", "next"]
    await h.drain()
    assert h.scheduler.snapshot().depth["batch"] == 0


async def test_cancelled_right_after_the_grant_gives_the_slot_back() -> None:
    h = await one_slot_taken(10, FakeClock())
    granted = await h.submit("granted")
    await h.submit("next")
    slot, _ = h.running.pop(0)
    slot.release(100, 0)  # grants "granted" ...
    granted.cancel()  # ... whose client leaves before its task resumes
    await h.settle()
    assert granted.cancelled()
    assert h.order == ["busy", "next"]  # the slot went on to the next, not lost
    assert h.scheduler.snapshot().in_flight == 1
    await h.drain()
    snap = h.scheduler.snapshot()
    assert (snap.in_flight, snap.depth["batch"]) == (0, 0)
    assert snap.counters["granted"] == 100.0  # its lifted start: the estimate was refunded


async def test_release_is_idempotent_and_feeds_the_estimator() -> None:
    clock = FakeClock()
    scheduler = FairScheduler(2, 10, clock)
    slot = await scheduler.acquire("t", 1.0, "interactive", 100, 50, FAR)
    assert scheduler.snapshot().counters["t"] == 200.0  # the estimate, at dispatch
    clock.now += 3.0
    slot.release(100, 10)
    slot.release(100, 10)
    slot.abandon()
    snap = scheduler.snapshot()
    assert (snap.in_flight, snap.counters["t"], snap.mean_service_s) == (0, 120.0, 3.0)
    assert snap.dispatched == {"interactive": 1, "batch": 0}


async def test_wait_times_are_reported_per_class() -> None:
    clock = FakeClock()
    waits: list[tuple[str, float]] = []
    scheduler = FairScheduler(1, 10, clock, on_wait=lambda cls, s: waits.append((cls, s)))
    h = Harness(scheduler)
    await h.submit("busy", priority="interactive")
    await h.submit("queued")
    clock.now += 2.5
    await h.drain()
    assert waits == [("interactive", 0.0), ("batch", 2.5)]


async def test_bad_arguments_are_refused() -> None:
    scheduler = FairScheduler(1, 10)
    with pytest.raises(ValueError, match="weight"):
        await scheduler.acquire("t", 0.0, "batch", 1, 1, FAR)
    with pytest.raises(ValueError, match="priority"):
        await scheduler.acquire("t", 1.0, "urgent", 1, 1, FAR)
    with pytest.raises(ValueError, match="max_concurrency"):
        FairScheduler(-1, 10)
    with pytest.raises(ValueError, match="admit_fraction"):
        FairScheduler(1, 10, admit_fraction=0.0)


def test_newcomer_waits_for_its_fair_share_not_a_heavy_tenants_backlog() -> None:
    queue = FairQueue()
    for _ in range(20):
        queue.push(entry("heavy"))
    queue.push(entry("light"))
    # The light tenant's next request goes after about one of heavy's per round, not all 20.
    assert queue.ahead_of("light", 1.0, 1) == 1 + 2
    assert queue.ahead_of("heavy", 1.0, 1) == 20 + 1
    # A tenant of weight 2 gets two turns per round of a weight-1 one.
    assert queue.ahead_of("new", 2.0, 1) == 1 + 1
    # Every waiter of a higher class goes first, whatever the tenant.
    assert queue.ahead_of("light", 1.0, 2) == 21


async def test_zero_capacity_holds_requests_until_replicas_appear() -> None:
    clock = FakeClock()
    scheduler = FairScheduler(0, 10, clock)
    waiters = [
        asyncio.ensure_future(scheduler.acquire(t, 1.0, "interactive", 10, 10, clock.now + 60))
        for t in ("a", "b", "c")
    ]
    await asyncio.sleep(0)
    assert not any(w.done() for w in waiters)
    scheduler.set_capacity(2)  # one replica with two slots is ready: release two, not all
    await asyncio.sleep(0)
    assert sum(w.done() for w in waiters) == 2
    for w in waiters:
        if w.done():
            w.result().release(10, 10)
    await asyncio.sleep(0)
    assert all(w.done() for w in waiters)
    waiters[2].result().release(10, 10)


async def test_cold_start_estimate_beyond_the_deadline_is_refused_at_once() -> None:
    clock = FakeClock()
    scheduler = FairScheduler(0, 10, clock)
    scheduler.set_capacity(0, cold_start_s=30.0)
    with pytest.raises(Shed) as caught:
        await scheduler.acquire("a", 1.0, "interactive", 10, 10, clock.now + 5)
    assert caught.value.reason == "deadline_unreachable" and caught.value.retry_after_s >= 30


async def test_expected_wait_s_is_the_wait_admission_counts_on() -> None:
    """What degradation under overload reads (gateway/degrade.py): 0 with a free slot; else
    the wait `_admit` compares with the deadline (one service time behind the busy slot)."""
    clock = FakeClock()
    assert FairScheduler(1, 10, clock).expected_wait_s("a", 1.0, "batch") == 0.0
    h = await one_slot_taken(10, clock, initial_service_s=2.0)
    assert h.scheduler.expected_wait_s("a", 1.0, "batch") == pytest.approx(2.0)
    with pytest.raises(Shed, match="deadline_unreachable"):  # 2 s > half of 3.9 s
        await h.scheduler.acquire("a", 1.0, "batch", 100, 0, clock.now + 3.9)
    await h.submit("fits", tenant="a", deadline=clock.now + 4.1)
    assert [tag for tag, _, _ in h.pending] == ["fits"]
    await h.drain()


async def test_lower_classes_wait_while_a_top_class_stream_awaits_its_first_token() -> None:
    """Free slots, yet no batch dispatch while an interactive stream is being prefilled:
    a batch prompt sent then would share the engine step that computes the interactive
    prompt. Batch goes once the first token came, or the attempt ended without one."""
    clock = FakeClock()
    h = Harness(FairScheduler(10, 100, clock))
    await h.submit("i0", tenant="web", priority="interactive")
    (interactive, _usage) = h.running[0]
    interactive.prefilling()
    await h.submit("b0", tenant="jobs")
    assert h.order == ["i0"]  # b0 waits with nine slots free
    await h.submit("i1", tenant="web", priority="interactive")
    assert h.order == ["i0", "i1"]  # the top class itself is not held
    interactive.first_token()
    await h.settle()
    assert h.order == ["i0", "i1", "b0"]
    batch_slot, _ = h.running[-1]
    batch_slot.prefilling()  # a lower class's own stream holds nobody
    await h.submit("b1", tenant="jobs")
    assert h.order[-1] == "b1"
    interactive.prefilling()  # again, for a retry
    await h.submit("b2", tenant="jobs")
    assert h.order[-1] == "b1"
    interactive.release(10, 0, service_s=1.0)  # ended without a first token
    await h.settle()
    assert h.order[-1] == "b2"


async def test_admission_counts_on_the_measured_drain_when_it_is_slower_than_the_model() -> None:
    """Ten slots and 1 s service samples: the model drains a backlog at 10/s. But the line
    has drained at 2/s for the last five seconds (slots freed slower than the samples say,
    as when overload begins), so the backlogged tenant's newcomer behind 20 of its own is
    refused: 10.5 s at the measured pace, over half its 20 s (the model said 2.1 s). A
    tenant with nothing queued is still admitted: its share of the class's pace is 1/s."""
    clock = FakeClock()
    h = Harness(FairScheduler(10, 1000, clock, initial_service_s=1.0))
    for i in range(40):
        await h.submit(f"n{i}", tenant="noisy")
    for _ in range(10):
        clock.now += 0.5
        slot, usage = h.running.pop(0)
        slot.release(*usage, service_s=1.0)
        await h.settle()
    assert h.scheduler.snapshot().depth["batch"] == 20
    assert h.scheduler.expected_wait_s("noisy", 1.0, "batch") == pytest.approx(10.5)
    with pytest.raises(Shed, match="deadline_unreachable"):
        await h.scheduler.acquire("noisy", 1.0, "batch", 100, 0, clock.now + 20.0)
    light = await h.submit("light", tenant="light", deadline=clock.now + 20.0)
    assert not light.done()  # admitted: 1 s at its share
    await h.drain()


async def test_a_line_held_by_the_prefill_gate_drains_at_its_measured_pace() -> None:
    """A hundred slots, never full; batch held by a top-class prompt awaiting its first
    token, so nothing of the class is dispatched. Its line fills at 2/s from 0.5 s while
    the twenty batch requests dispatched before finish at 2/s. Held for a moment, the
    line keeps the model's zero (free slots): newcomers are admitted. Once it has not
    emptied for the drain's whole window (5 s), the model still sees free slots, but the
    line drains at its measured 2/s: the newest waiter, tenth in line, needs 5 s where
    4.5 are left, and is dropped as slipped rather than left to its deadline; and a
    newcomer behind nine expects 5 s, over half of its 9 s, and is refused at once."""
    clock = FakeClock()
    h = Harness(FairScheduler(100, 1000, clock, initial_service_s=1.0))
    for i in range(20):
        await h.submit(f"b{i}", tenant="jobs")
    await h.submit("i0", tenant="web", priority="interactive")
    interactive, _ = h.running.pop()
    interactive.prefilling()
    waiting = []
    for step in range(11):
        clock.now += 0.5
        slot, usage = h.running.pop(0)
        slot.release(*usage, service_s=1.0)
        await h.settle()
        if step < 10:
            deadline = clock.now + (5.0 if step == 9 else 30.0)
            waiting.append(await h.submit(f"w{step}", tenant="jobs", deadline=deadline))
            assert not waiting[-1].done()  # admitted on the model's zero
        if step == 0:
            assert h.scheduler.expected_wait_s("jobs", 1.0, "batch") == 0.0
    assert h.order == [f"b{i}" for i in range(20)] + ["i0"]
    assert waiting[-1].done() and not any(task.done() for task in waiting[:-1])
    assert h.scheduler.snapshot().shed == {("batch", "deadline_slipped"): 1}
    assert h.scheduler.expected_wait_s("jobs", 1.0, "batch") == pytest.approx(5.0)
    with pytest.raises(Shed, match="deadline_unreachable"):
        await h.scheduler.acquire("jobs", 1.0, "batch", 100, 0, clock.now + 9.0)
    h.pending = [p for p in h.pending if p[0] != "w9"]
    interactive.release(10, 10, service_s=1.0)
    await h.drain()


@pytest.mark.parametrize("measured_drain", [True, False])
async def test_a_cut_limit_drops_a_waiter_only_where_the_measured_pace_agrees(
    measured_drain: bool,
) -> None:
    """Ten slots, 1 s service samples, a line that drained at 10/s for 2 s. Then the limit
    is cut to 1 with ten in flight (an engine queueing for KV space): the model expects the
    newest waiter, tenth in its line, to wait 18 s (the excess in flight to finish first,
    then one slot), past the 10 s it has left; at the pace its line drained, 1 s. Kept;
    on the model alone (the measured drain switched off), dropped at once."""
    clock = FakeClock()
    off = frozenset() if measured_drain else frozenset({"measured_drain"})
    h = Harness(FairScheduler(10, 1000, clock, initial_service_s=1.0, off=off))
    tasks = [await h.submit(f"j{i}", tenant="jobs", deadline=clock.now + 12.0) for i in range(40)]
    for _ in range(20):
        clock.now += 0.1
        slot, usage = h.running.pop(0)
        slot.release(*usage, service_s=1.0)
        await h.settle()
    assert h.scheduler.snapshot().depth["batch"] == 10 and len(h.running) == 10
    h.scheduler.set_capacity(1)
    clock.now += 0.1
    slot, usage = h.running.pop(0)
    slot.release(*usage, service_s=1.0)  # nothing dispatched: 9 in flight, a limit of 1
    await h.settle()
    slipped = h.scheduler.snapshot().shed.get(("batch", "deadline_slipped"), 0)
    assert slipped == (0 if measured_drain else 1)
    assert tasks[-1].done() is not measured_drain
    h.scheduler.set_capacity(10)
    await h.drain()


async def test_the_higher_classes_load_is_a_share_of_the_limit_now() -> None:
    """A learned limit grown from 8 to 26 (slow start) while interactive traffic took 8
    slots' worth: a batch newcomer behind a full room expects a fraction of a second on
    26, and is admitted; cut back to 8, that traffic leaves batch 5% (`_MIN_LEFTOVER`),
    the newcomer expects 1.25 s, over half of its 2 s, and is refused."""
    for refused in (False, True):
        clock = FakeClock()
        h = Harness(FairScheduler(8, 100, clock, initial_service_s=1.0))
        for limit in (12, 18, 26):
            h.scheduler.set_capacity(limit)
        for i in range(50):  # 25 slot-seconds of interactive answers in the load window
            await h.submit(f"i{i}", tenant="web", priority="interactive")
            slot, _ = h.running.pop(0)
            slot.release(10, 10, service_s=0.5)
        for i in range(24):  # the batch room: 26 less the 2 kept for interactive
            await h.submit(f"b{i}", tenant="jobs")
        assert len(h.running) == 24
        if refused:
            h.scheduler.set_capacity(8)
        newcomer = h.scheduler.acquire("jobs", 1.0, "batch", 100, 0, clock.now + 2.0)
        if refused:
            with pytest.raises(Shed, match="deadline_unreachable"):
                await newcomer
        else:
            task = asyncio.ensure_future(newcomer)
            await h.settle()
            assert not task.done()  # admitted: it waits for a slot
            h.pending.append(("new", task, (100, 0)))
        await h.drain()


async def test_a_benchmark_may_switch_each_controller_off() -> None:
    """`off` (traffic.controllers_off, for ablations): without the prefill gate a batch
    request goes while an interactive stream awaits its first token; without pacing
    `set_pace` paces nothing. An unknown name is refused."""
    clock = FakeClock()
    h = Harness(FairScheduler(10, 100, clock, off=frozenset({"prefill_gate", "pacing"})))
    await h.submit("i0", tenant="web", priority="interactive")
    h.running[0][0].prefilling()
    h.scheduler.set_pace(0.5)
    assert h.scheduler.pace_per_s() is None
    await h.submit("b0", tenant="jobs")
    await h.submit("b1", tenant="jobs")
    assert h.order == ["i0", "b0", "b1"]
    await h.drain()
    with pytest.raises(ValueError, match="unknown controllers"):
        FairScheduler(10, 100, clock, off=frozenset({"gradient"}))
