"""The fair queue in front of one backend, driven on the event loop: concurrency slots,
deadlines, shedding and pacing around the pure order of `gateway.traffic.fair_queue`
(priority classes, then the tenants' virtual token counters).

Strict priority between classes is deliberate: batch waits while interactive work waits,
and is shed first (its expected wait counts the interactive queue; displacement picks it).

Shedding aims to refuse at once, not after a wait: a newcomer is admitted only when its
expected wait fits well within its deadline (`ADMIT_WAIT_FRACTION`), and whenever the
queue moves the newest waiters are checked again, so that one whose expected wait has
grown past its deadline is dropped then, not when the deadline comes.

This module is the driver: the waiters' futures and timers, dispatch, and the counts it
moves. The policies it asks are pure and live beside it: the order
(`gateway.traffic.fair_queue`), the slots a class may take (`gateway.traffic.slots`), the
admission estimate (`gateway.traffic.waits`, over `gateway.traffic.shedding`'s parts) and
the pace of lower classes (`gateway.traffic.pacing`). The limit itself is learned apart
(`gateway.traffic.capacity`, `gateway.traffic.gradient`) and set here.

Over 400 lines: the driver's waiters, timers, admission and re-checks all read and move
the same queue and counts, on every arrival and release.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import get_args

from gateway.settings_types import Controller
from gateway.traffic.fair_queue import Entry, FairQueue, token_cost
from gateway.traffic.pacing import Pacer, prefill_steps
from gateway.traffic.shedding import ADMIT_WAIT_FRACTION, retry_after_s, should_shed
from gateway.traffic.slots import Slots
from gateway.traffic.waits import Waits

DEFAULT_RANKS: Mapping[str, int] = {"interactive": 0, "batch": 1}
DEFAULT_OUTPUT_WEIGHT = 2.0

Clock = Callable[[], float]
WaitHook = Callable[[str, float], None]


# Waiters are checked again at once when the limit moves or an arrival goes before some
# of them; after a release, or an arrival that goes behind everyone, at most this often. A
# release moves the queue forward, which mostly shortens waits: it lengthens them only by
# a slower service sample or a higher class's dispatch, whose effect on a wait of seconds
# shows as well a few milliseconds later. Checked at every release and arrival, the
# waiters took a third of the scheduler's time per queued request (bench/proxy_overhead.py,
# concurrency 64 in front of a learned limit of 8).
RECHECK_INTERVAL_S = 0.01


# The controllers a benchmark may switch off one at a time (`FairScheduler(off=...)`, from
# the config's `traffic.controllers_off`) to measure what each buys: the pacer of
# lower classes, holding them while a top-class prompt is computed (`Slots.prefills`), and
# admission by the measured drain rate (`gateway.traffic.waits`). The names are the
# config's (`Controller`), so that the two lists cannot drift apart.
CONTROLLERS: frozenset[str] = frozenset(get_args(Controller))


class Shed(Exception):
    """The request was refused or dropped by the scheduler; answer 503 with Retry-After.

    Reasons: "queue_full", "displaced" (a higher class took its place), "deadline_unreachable"
    (refused on arrival), "deadline_slipped" (dropped while queued, once its expected wait
    grew past its deadline), "deadline_passed" (dropped while queued, at its deadline).
    """

    def __init__(self, reason: str, retry_after_s: float) -> None:
        super().__init__(f"shed: {reason} (retry after {retry_after_s:.1f} s)")
        self.reason = reason
        self.retry_after_s = retry_after_s


class Slot:
    """A dispatched request's hold on one of the backend's concurrency slots."""

    __slots__ = ("_done", "_entry", "_prefilling", "_scheduler", "granted_at")

    def __init__(self, scheduler: FairScheduler, entry: Entry, granted_at: float) -> None:
        self._scheduler = scheduler
        self._entry = entry
        self._done = False
        self._prefilling = False
        self.granted_at = granted_at

    def prefilling(self) -> None:
        """A streamed request of the top class was sent: until its first token
        (`first_token`) lower classes are not dispatched (the module's docstring)."""
        if not (self._done or self._prefilling):
            self._prefilling = self._scheduler.prefill_began(self._entry)

    def first_token(self) -> None:
        """Its first token came (or the attempt ended without one)."""
        if self._prefilling:
            self._prefilling = False
            self._scheduler.prefill_ended()

    @property
    def rank(self) -> int:
        """The request's class rank (0 is the highest)."""
        return self._entry.rank

    @property
    def waited_s(self) -> float:
        return self.granted_at - self._entry.enqueued_at

    def release(
        self,
        input_tokens: int,
        output_tokens: int,
        service_s: float | None = None,
        *,
        sampled: bool = True,
    ) -> None:
        """Frees the slot and charges real usage; `service_s` defaults to the time since
        dispatch, and is a service-time sample only when `sampled`. Idempotent: only the
        first call counts."""
        if self._done:
            return
        self.first_token()
        self._done = True
        self._scheduler.finished(
            self._entry, input_tokens, output_tokens, service_s, self.granted_at, sampled
        )

    def abandon(self) -> None:
        """Frees the slot of a request that never reached the backend: no charge, and no
        service-time sample (it would drag the estimate towards zero)."""
        if self._done:
            return
        self.first_token()
        self._done = True
        self._scheduler.finished(self._entry, 0, 0, None, self.granted_at, sampled=False)


@dataclass(frozen=True)
class SchedulerSnapshot:
    """Numbers for metrics; counts are totals since start."""

    depth: Mapping[str, int]
    in_flight: int
    max_concurrency: int
    max_queue: int
    mean_service_s: float
    dispatched: Mapping[str, int]
    shed: Mapping[tuple[str, str], int]  # (priority, reason) -> count
    counters: Mapping[str, float] = field(default_factory=dict)


@dataclass
class _Waiter:
    future: asyncio.Future[Slot]
    timer: asyncio.TimerHandle | None = None


class FairScheduler:
    """Runs the fair queue for one backend: at most `max_concurrency` dispatched at once,
    at most `max_queue` waiting. `deadline` values are on `clock`'s scale.

    No background task: dispatch happens inside `acquire` and `release`, and each waiter's
    deadline is a loop timer, so nothing outlives the requests.
    """

    def __init__(
        self,
        max_concurrency: int,
        max_queue: int,
        clock: Clock = time.monotonic,
        *,
        ranks: Mapping[str, int] = DEFAULT_RANKS,
        output_weight: float = DEFAULT_OUTPUT_WEIGHT,
        initial_service_s: float = 1.0,
        on_wait: WaitHook | None = None,
        admit_fraction: float = ADMIT_WAIT_FRACTION,
        prefill_chunk_tokens: int | None = None,
        off: frozenset[str] = frozenset(),
    ) -> None:
        """`off`: controllers switched off, of CONTROLLERS (benchmarks' ablations)."""
        if max_concurrency < 0 or max_queue < 0:
            raise ValueError("max_concurrency and max_queue must be >= 0")
        if not 0 < admit_fraction <= 1:
            raise ValueError("admit_fraction must be in (0, 1]")
        if prefill_chunk_tokens is not None and prefill_chunk_tokens < 1:
            raise ValueError("prefill_chunk_tokens must be >= 1")
        if unknown := off - CONTROLLERS:
            raise ValueError(f"unknown controllers {sorted(unknown)}")
        self._off = off
        self._prefill_chunk = prefill_chunk_tokens
        self._max_queue = max_queue
        self._clock = clock
        self._ranks = dict(ranks)
        self._top_rank = min(self._ranks.values(), default=0)
        self._slots = Slots(max_concurrency, self._top_rank)
        self._waits = Waits(clock(), initial_service_s, measured_drain="measured_drain" not in off)
        self._output_weight = output_weight
        self._on_wait = on_wait
        self._admit_fraction = admit_fraction
        self._queue = FairQueue()
        self._waiters: dict[Entry, _Waiter] = {}
        self._pacer = Pacer()
        self._pace_timer: asyncio.TimerHandle | None = None
        self._dispatched = dict.fromkeys(self._ranks, 0)
        self._shed: dict[tuple[str, str], int] = {}
        self._rechecked_at = -math.inf

    @property
    def mean_service_s(self) -> float:
        return self._waits.service.mean_s

    def set_capacity(
        self, max_concurrency: int, cold_start_s: float = 0.0, ceiling: int | None = None
    ) -> None:
        """Replicas came or went, or their limits moved: dispatch at most `max_concurrency`
        at once from now on, each class counting its own and higher classes' requests
        against it, all of them at most `ceiling` (default: no higher) (`Slots.may_dispatch`).

        0 means no replica is ready (a cold start is under way): requests wait, held in
        the queue, and `cold_start_s` estimates when capacity appears. Raising it releases
        held requests up to the new limit, not all at once.
        """
        if max_concurrency < 0:
            raise ValueError("max_concurrency must be >= 0")
        self._slots.set(max_concurrency, ceiling)
        self._waits.cold_start_s = cold_start_s
        self._pump()

    def expect_capacity_in(self, cold_start_s: float) -> None:
        """While no replica is ready: capacity is expected in `cold_start_s` (a start's
        estimate shrinks as it proceeds; `set_capacity` set it when capacity went to 0)."""
        self._waits.cold_start_s = cold_start_s

    def _dispatchable_at_once(self, entry: Entry, now: float) -> bool:
        """Nobody of its class or a higher one waits, and it may be dispatched now (the
        top class even while lower classes queue: `Slots.may_dispatch`)."""
        return (
            self._queue.ahead(entry.rank) == 0
            and now < entry.deadline
            and self._may_dispatch(entry.rank, now)
            and (entry.rank == self._top_rank or self._pacer.ready(now))
        )

    def pace_per_s(self) -> float | None:
        """Lower-class prompt steps per second the pacer allows now: dispatches, where
        each prompt takes one step (`prefill_steps`); None: not paced."""
        return self._pacer.rate_per_s(self._clock())

    def set_pace(self, interval_s: float) -> None:
        """Lower classes' dispatches beyond replacing finished requests at most one per
        `interval_s` (gateway.traffic.pacing); 0: no pacing."""
        pacing = "pacing" not in self._off
        self._pacer.set_interval(interval_s if pacing else 0.0, self._clock())
        self._pump()

    async def acquire(
        self,
        tenant: str,
        weight: float,
        priority: str,
        input_tokens: int,
        max_output_tokens: int,
        deadline: float,
    ) -> Slot:
        """Waits for a slot; raises `Shed` when refused on arrival or dropped while queued.

        `deadline` is the latest time the request may still be dispatched: the caller
        takes what the upstream needs (a first-token budget, say) off the client's deadline.
        """
        if weight <= 0:
            raise ValueError(f"tenant weight must be > 0, got {weight}")
        if priority not in self._ranks:
            raise ValueError(f"unknown priority class {priority!r}")
        now = self._clock()
        self._waits.busy(now)
        charge = token_cost(input_tokens, max_output_tokens, weight, self._output_weight)
        steps = prefill_steps(input_tokens, self._prefill_chunk)
        rank = self._ranks[priority]
        entry = Entry(tenant, weight, priority, rank, charge, deadline, now, steps=steps)
        if self._dispatchable_at_once(entry, now):
            # Nobody waits before it and it may go: what push, pump and grant would do.
            self._queue.dispatch_at_once(entry)
            return self._start(entry, now)
        self._admit(entry, now)
        loop = asyncio.get_running_loop()
        waiter = self._waiters[entry] = _Waiter(loop.create_future())
        self._queue.push(entry)
        self._pump(recheck=self._queue.overtakes(entry))
        if not waiter.future.done():
            waiter.timer = loop.call_later(deadline - now, self._drop, entry, "deadline_passed")
        try:
            return await waiter.future
        except asyncio.CancelledError:
            self._cancelled(entry, waiter.future)
            raise

    def expected_wait_s(self, tenant: str, weight: float, priority: str) -> float:
        """How long a newcomer of `tenant` in class `priority` would wait for a slot now,
        as admission estimates it (`_admit`); 0 when it would be dispatched at once."""
        now, rank = self._clock(), self._ranks[priority]
        if self._queue.ahead(rank) == 0 and self._may_dispatch(rank, now):
            return 0.0
        return self._waits.expected_wait(self._queue, self._slots, tenant, weight, rank, now)

    def drop_waiting(self, reason: str, error: Callable[[], Exception]) -> None:
        """Fails every waiter with a new `error()` (a cold start failed: nothing will serve
        them soon); counted as shed for `reason`."""
        for entry in list(self._waiters):
            waiter = self._forget(entry)
            if not waiter.future.done():
                self._count(entry, Shed(reason, 0.0))
                waiter.future.set_exception(error())

    def snapshot(self) -> SchedulerSnapshot:
        depth = {name: self._queue.depth(rank) for name, rank in self._ranks.items()}
        return SchedulerSnapshot(
            depth=depth,
            in_flight=self._slots.in_flight,
            max_concurrency=self._slots.limit,
            max_queue=self._max_queue,
            mean_service_s=self._waits.service.mean_s,
            dispatched=dict(self._dispatched),
            shed=dict(self._shed),
            counters=self._queue.counters(),
        )

    def _admit(self, entry: Entry, now: float) -> None:
        """Refuses on arrival (raises Shed), or makes room in a full queue."""
        wait = self._waits.expected_wait(
            self._queue, self._slots, entry.tenant, entry.weight, entry.rank, now
        )
        # Held for a cold start, the wait is mostly the start's, not a queue at its limit.
        fraction = self._admit_fraction if self._slots.limit else 1.0
        if should_shed(now, entry.deadline, wait, fraction):
            raise self._count(entry, Shed("deadline_unreachable", retry_after_s(wait)))
        if self._slots.in_flight < self._slots.limit or len(self._queue) < self._max_queue:
            return
        victim = self._queue.newest_below(entry.rank)
        if victim is None:
            drain = self._wait_for(max(self._ranks.values()))
            raise self._count(entry, Shed("queue_full", retry_after_s(drain)))
        self._drop(victim, "displaced")

    def class_service_s(self, priority: str) -> float:
        """The mean service time of a class's requests (the overall mean until it has
        samples)."""
        return self._waits.class_mean_s(self._ranks[priority])

    def _wait_for(self, rank: int) -> float:
        slots = self._slots
        return self._waits.expected(
            slots.limit, self._queue.ahead(rank), slots.in_flight, slots.limit
        )

    def _pump(self, *, recheck: bool = True) -> None:
        """Dispatches while slots are free; drops expired waiters on the way. Then checks
        the waiters again (`_recheck`): always when `recheck`, else at most once per
        RECHECK_INTERVAL_S."""
        now = self._clock()
        while (entry := self._queue.peek()) is not None:
            future = self._waiters[entry].future
            if future.done():  # cancelled, its task not yet resumed to clean up
                self._forget(entry)
            elif entry.deadline <= now:
                self._drop(entry, "deadline_passed")
            elif not self._may_dispatch(entry.rank, now):
                break  # no slot; or, for a lower class, the last slots kept for the top one
            elif entry.rank != self._top_rank and not self._pacer.ready(now):
                self._pump_later(self._pacer.wait_s(now))
                break
            else:
                self._grant(entry, now)
        if recheck or now - self._rechecked_at >= RECHECK_INTERVAL_S:
            self._recheck(now)

    def _pump_later(self, delay_s: float) -> None:
        """Pumps again once the pacer has a token (nothing else may come along to)."""
        if self._pace_timer is not None:
            self._pace_timer.cancel()
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # no loop (a synchronous caller): the next event pumps
            return
        self._pace_timer = loop.call_later(delay_s, self._pump)

    def _may_dispatch(self, rank: int, now: float) -> bool:
        return self._slots.may_dispatch(rank, self._waits.top_active(self._top_rank, now))

    def _recheck(self, now: float) -> None:
        """Drops, from the back of each tenant's line, the waiters whose expected wait has
        grown past their deadline (a burst of higher-class work, slower service), by the
        model and the measured pace alike (`Waits.expected_wait`): told now, not at the
        deadline. Only the newest are at risk; the check stops at one that fits.
        """
        if self._slots.limit == 0:
            return  # held for a cold start, whose estimate does not shrink as it proceeds
        self._rechecked_at = now
        for rank, tenant in self._queue.tenants_waiting():
            while (newest := self._queue.newest(rank, tenant)) is not None:
                entry, position = newest
                if entry not in self._waiters:
                    break  # cannot happen (queue and waiters move together); never spin
                wait = self._waits.expected_wait(
                    self._queue, self._slots, tenant, entry.weight, rank, now, position
                )
                if not should_shed(now, entry.deadline, wait):
                    break
                self._drop(
                    entry, "deadline_passed" if entry.deadline <= now else "deadline_slipped"
                )

    def _grant(self, entry: Entry, now: float) -> None:
        waiter = self._forget(entry, withdraw=False)
        self._queue.dispatch(entry)
        waiter.future.set_result(self._start(entry, now))

    def _start(self, entry: Entry, now: float) -> Slot:
        self._slots.take(entry.rank)
        if entry.rank != self._top_rank:
            self._pacer.take(now, entry.steps)
        self._dispatched[entry.priority] = self._dispatched.get(entry.priority, 0) + 1
        self._waits.dispatched(now, entry.rank)
        if self._on_wait is not None:
            self._on_wait(entry.priority, now - entry.enqueued_at)
        return Slot(self, entry, now)

    def _drop(self, entry: Entry, reason: str) -> None:
        """Takes a waiter out of the queue and fails its acquire with Shed."""
        if entry not in self._waiters:
            return  # granted or gone already; the timer lost the race
        waiter = self._forget(entry)
        if not waiter.future.done():
            shed = Shed(reason, retry_after_s(self._wait_for(entry.rank)))
            waiter.future.set_exception(self._count(entry, shed))

    def _forget(self, entry: Entry, *, withdraw: bool = True) -> _Waiter:
        waiter = self._waiters.pop(entry)
        if waiter.timer is not None:
            waiter.timer.cancel()
        if withdraw:
            self._queue.withdraw(entry)
        return waiter

    def _cancelled(self, entry: Entry, future: asyncio.Future[Slot]) -> None:
        """The waiting task was cancelled: leave the queue, or give back a slot granted in
        the moment between the grant and the task resuming."""
        if entry in self._waiters:
            self._forget(entry)
        elif future.done() and not future.cancelled() and future.exception() is None:
            future.result().abandon()

    def prefill_began(self, entry: Entry) -> bool:
        """For `Slot`: its top-class stream was sent; whether lower classes now wait for
        its first token (`prefill_ended`)."""
        if entry.rank != self._top_rank or "prefill_gate" in self._off:
            return False
        self._slots.prefills += 1
        return True

    def prefill_ended(self) -> None:
        """For `Slot`: a stream `prefill_began` counted has its first token."""
        self._slots.prefills -= 1
        if not self._slots.prefills:
            self._pump(recheck=False)

    def finished(
        self,
        entry: Entry,
        input_tokens: int,
        output_tokens: int,
        service_s: float | None,
        granted_at: float,
        sampled: bool,
    ) -> None:
        """For `Slot`: it is free; charge the real usage, and take `service_s` (default:
        since `granted_at`) as a service-time sample when `sampled`."""
        now = self._clock()
        if not sampled:
            service_s = None
        elif service_s is None:
            service_s = now - granted_at
        tokens = token_cost(input_tokens, output_tokens, 1.0, self._output_weight)
        self._queue.complete(entry, tokens / entry.weight)
        self._waits.finished(now, entry.rank, entry.tenant, entry.weight, service_s)
        self._slots.give_back(entry.rank)
        if entry.rank != self._top_rank:  # the pace follows what it paces, not the top class
            self._pacer.finished(now, entry.steps)
        self._pump(recheck=False)  # a release mostly shortens waits: see RECHECK_INTERVAL_S
        if not self._slots.in_flight and not len(self._queue):
            self._waits.idle(now)

    def _count(self, entry: Entry, shed: Shed) -> Shed:
        key = (entry.priority, shed.reason)
        self._shed[key] = self._shed.get(key, 0) + 1
        return shed
