"""The fair queue in front of one backend, driven on the event loop: concurrency slots,
deadlines, shedding and pacing around the pure order of `gateway.traffic.fair_queue`
(priority classes, then the tenants' virtual token counters).

Strict priority between classes is deliberate: batch waits while interactive work waits,
and is shed first (its expected wait counts the interactive queue; displacement picks it).
Lower classes also wait while a top-class stream that was sent awaits its first token
(`Slot.prefilling`): a batching engine computes a prompt in one step with whatever else it
admitted, and a 256-token batch prompt adds about twice a bare step's time to it, so a
batch request sent then lands in the step the interactive request waits on
(bench/batch_interference.py --quick, two runs each at the same hour: interactive time to
first token p99 2.46x and 3.34x its unloaded value with this, 3.46x and 3.92x without;
batch lines per second unchanged, 9.3-9.6). Only streams are seen: a whole answer's first
token is not. Held for one engine step instead (by then the engine has begun the step
that computes the prompt), lower classes were released while a long step still ran, and
joined the interactive request's step: bench/batch_interference.py --quick, two runs
each, 3.33x and 3.63x against 2.10x and 2.53x held to the first token.

Shedding aims to refuse at once, not after a wait: a newcomer is admitted only when its
expected wait fits well within its deadline (`ADMIT_WAIT_FRACTION`), and whenever the
queue moves the newest waiters are checked again, so that one whose expected wait has
grown past its deadline is dropped then, not when the deadline comes.

The pure parts live beside it: the order (`gateway.traffic.fair_queue`), the shedding
decisions and wait estimates (`gateway.traffic.shedding`), the pace of lower classes
(`gateway.traffic.pacing`) and the limits of the last seconds (`LimitMemory`, below).

Over 400 lines: the driver's slots, timers, admission and re-checks all read and move the
same queue and counts, on every arrival and release.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from gateway.traffic.fair_queue import Entry, FairQueue, token_cost
from gateway.traffic.pacing import Pacer, prefill_steps
from gateway.traffic.shedding import (
    ADMIT_WAIT_FRACTION,
    ClassLoad,
    DrainRate,
    ServiceTimeEstimator,
    expected_wait_s,
    measured_wait_s,
    retry_after_s,
    should_shed,
)

DEFAULT_RANKS: Mapping[str, int] = {"interactive": 0, "batch": 1}
DEFAULT_OUTPUT_WEIGHT = 2.0

Clock = Callable[[], float]
WaitHook = Callable[[str, float], None]


_MIN_LEFTOVER = 0.05  # a class starved by higher ones: expect 20x longer, not forever
# While the top class is active, lower classes leave this share of the ceiling, rounded
# down, free for it: where the ceiling binds (a fixed limit) every slot is otherwise busy
# under overload, and an interactive arrival, first in line, still waited for a request to
# finish (bench/capacity.py, 5x: interactive time to first token p99 8x its unloaded value
# with a fixed limit). Rounded down, since a reserved slot idles whenever the top class
# does not fill it: one slot of 4 cost a quarter of a 4-slot upstream (bench/overload.py
# --quick, 5x: goodput and utilisation 0.80), where waiting for the first of 4 to finish
# costs the top class a quarter of a service time. A learned limit needs none: the top
# class counts only its own requests against it (`FairScheduler._may_dispatch`).
RESERVED_SHARE = 0.1
# Admission counts on the lowest limit a cut set in this many seconds (a learned limit
# swings down when the engine queues, and is pinned low while a latency baseline is
# measured), re-checks on the highest. Both on the current limit, every swing down turned
# the requests admitted at the top into late refusals: bench/capacity.py at 5x, adaptive
# limits, about a fifth of the noisy tenant's refusals came 1 to 4 s after arrival, not at
# once. Only cuts: the lower limits a learned limit grew from are no risk, and counted too,
# a gateway whose limit had just grown from 8 to 26 took its interactive traffic (9 slots)
# for all of 8 and refused batch requests with nothing queued for ten seconds after every
# start (bench/capacity.py --quick, load 1, adaptive-metrics: 9% refused). A latency
# measurement's pin is a cut: it ends by design, but while it holds the queue drains at
# its pace for seconds, and counted on the limit it returns to, admission would take
# requests that the pin then makes late.
LIMIT_MEMORY_S = 10.0


class LimitMemory:
    """The limits in force over the last LIMIT_MEMORY_S seconds: the lowest a cut set and
    the highest (pure: `now` is passed in)."""

    def __init__(self, limit: int, now: float) -> None:
        self._limits: deque[tuple[float, int, bool]] = deque()  # (since, limit, a cut)
        self._bounds = (limit, limit)
        self._until = -math.inf  # the bounds hold until then
        self.set(limit, now)

    def set(self, limit: int, now: float) -> None:
        """The limit is now `limit`; 0 (held for a cold start) forgets the past, since what
        the replicas will take is new."""
        if limit == 0:
            self._limits.clear()
        else:
            cut = bool(self._limits) and limit < self._limits[-1][1]
            self._limits.append((now, limit, cut))
        self._current = limit
        self._until = -math.inf
        self.bounds(now)  # forget what is older, so the record stays short

    def bounds(self, now: float) -> tuple[int, int]:
        """(lowest set by a cut, or the limit now if lower; highest). Read several times
        per queued request, they change only when the limit does or an old limit leaves
        the window: kept until then, instead of rebuilt from the record at every read."""
        if now >= self._until:
            horizon = now - LIMIT_MEMORY_S
            while len(self._limits) > 1 and self._limits[1][0] <= horizon:
                self._limits.popleft()  # [0] stays: the limit in force at the horizon
            limits = [limit for _, limit, _ in self._limits] or [self._current]
            cuts = [limit for _, limit, cut in self._limits if cut]
            self._bounds = (min([limits[-1], *cuts]), max(limits))
            # Valid until the oldest remembered change leaves the window.
            later = len(self._limits) > 1
            self._until = self._limits[1][0] + LIMIT_MEMORY_S if later else math.inf
        return self._bounds


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
# lower classes, holding them while a top-class prompt is computed, admission by the
# measured drain rate, and admission on the limits of the last LIMIT_MEMORY_S.
CONTROLLERS = frozenset({"pacing", "prefill_gate", "measured_drain", "limit_memory"})


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
        self._max = max_concurrency
        self._ceiling = max_concurrency
        self._limits = LimitMemory(max_concurrency, clock())
        self._cold_start_s = 0.0  # expected time until capacity appears while it is 0
        self._max_queue = max_queue
        self._clock = clock
        self._ranks = dict(ranks)
        self._top_rank = min(self._ranks.values(), default=0)
        self._output_weight = output_weight
        self._on_wait = on_wait
        self._admit_fraction = admit_fraction
        self._queue = FairQueue()
        self._waiters: dict[Entry, _Waiter] = {}
        self._service = ServiceTimeEstimator(initial_service_s)
        self._class_service: dict[int, ServiceTimeEstimator] = {}  # by class rank
        self._in_flight = 0
        self._in_flight_by_rank: dict[int, int] = {}
        self._prefills = 0  # top-class streams sent and awaiting their first token
        self._pacer = Pacer()
        self._pace_timer: asyncio.TimerHandle | None = None
        self._dispatched = dict.fromkeys(self._ranks, 0)
        self._load = ClassLoad()
        self._drain = DrainRate(clock())  # idle until the first request
        self._shed: dict[tuple[str, str], int] = {}
        self._rechecked_at = -math.inf

    @property
    def mean_service_s(self) -> float:
        return self._service.mean_s

    def set_capacity(
        self, max_concurrency: int, cold_start_s: float = 0.0, ceiling: int | None = None
    ) -> None:
        """Replicas came or went, or their limits moved: dispatch at most `max_concurrency`
        at once from now on, each class counting its own and higher classes' requests
        against it, all of them at most `ceiling` (default: no higher) (`_may_dispatch`).

        0 means no replica is ready (a cold start is under way): requests wait, held in
        the queue, and `cold_start_s` estimates when capacity appears. Raising it releases
        held requests up to the new limit, not all at once.
        """
        if max_concurrency < 0:
            raise ValueError("max_concurrency must be >= 0")
        self._max = max_concurrency
        self._ceiling = max_concurrency if ceiling is None else max(ceiling, max_concurrency)
        self._limits.set(self._max, self._clock())
        self._cold_start_s = cold_start_s
        self._pump()

    def expect_capacity_in(self, cold_start_s: float) -> None:
        """While no replica is ready: capacity is expected in `cold_start_s` (a start's
        estimate shrinks as it proceeds; `set_capacity` set it when capacity went to 0)."""
        self._cold_start_s = cold_start_s

    def _dispatchable_at_once(self, entry: Entry, now: float) -> bool:
        """Nobody of its class or a higher one waits, and it may be dispatched now (the
        top class even while lower classes queue: `_may_dispatch`)."""
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
        self._drain.busy(now)
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
        return self._admission_wait(tenant, weight, rank, now)

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
            in_flight=self._in_flight,
            max_concurrency=self._max,
            max_queue=self._max_queue,
            mean_service_s=self._service.mean_s,
            dispatched=dict(self._dispatched),
            shed=dict(self._shed),
            counters=self._queue.counters(),
        )

    def _admit(self, entry: Entry, now: float) -> None:
        """Refuses on arrival (raises Shed), or makes room in a full queue."""
        wait = self._admission_wait(entry.tenant, entry.weight, entry.rank, now)
        # Held for a cold start, the wait is mostly the start's, not a queue at its limit.
        fraction = self._admit_fraction if self._max else 1.0
        if should_shed(now, entry.deadline, wait, fraction):
            raise self._count(entry, Shed("deadline_unreachable", retry_after_s(wait)))
        if self._in_flight < self._max or len(self._queue) < self._max_queue:
            return
        victim = self._queue.newest_below(entry.rank)
        if victim is None:
            drain = self._wait_for(max(self._ranks.values()))
            raise self._count(entry, Shed("queue_full", retry_after_s(drain)))
        self._drop(victim, "displaced")

    def _admission_wait(self, tenant: str, weight: float, rank: int, now: float) -> float:
        """A newcomer's expected wait as admission counts it: the longer of the model's
        (`_wait`) and the measured pace's (`measured_wait_s`), so that admission errs on
        the side of a refusal now rather than one after a wait."""
        ahead = self._queue.ahead_of(tenant, weight, rank)
        wait = self._wait(ahead, rank, now, admitting=True)
        rates = self._drain.rates(rank, tenant, now) if self._max else None
        if wait == 0.0 or rates is None or "measured_drain" in self._off:
            return wait
        own = self._queue.line(tenant, rank)
        since = self._queue.backlogged_since(tenant, rank)
        if since is not None and since <= now - self._drain.window_s:
            share = 0.0  # backlogged all through the window: its own rate is its turn
        else:
            share = self._share(tenant, weight, rank, now)
        return max(wait, measured_wait_s(own, *rates, share))

    def _share(self, tenant: str, weight: float, rank: int, now: float) -> float:
        """The tenant's weight over those of the tenants that take turns in its class's
        line: with waiters now, or finished lately (a light tenant's line is mostly empty,
        but its arrivals go first; counted on waiters only, the noisy tenant expected the
        whole class's pace when overload began, and got half)."""
        weights = self._drain.weights(rank, now) | self._queue.waiting_weights(rank)
        weights[tenant] = weight
        return weight / sum(weights.values())

    def _wait(self, ahead: int, rank: int, now: float, *, admitting: bool = False) -> float:
        """Expected wait behind `ahead` waiters: higher classes arriving meanwhile go first,
        so a lower class gets only what they leave. The queue drains at the pace of the
        lowest limit of the last LIMIT_MEMORY_S when `admitting`, else of the highest:
        admitted with a margin for the limit's swings, a waiter is dropped only once even
        the best of them would not serve it in time (a latency baseline's pin halves the
        limit for a few seconds, and re-checked on it, a fifth of the waiters were dropped
        that would have been served)."""
        basis = self._limit_bounds(now)[0 if admitting else 1]
        higher = self._load.above(rank, now, self._class_mean_s, basis)
        # Slots kept for the top class (`_cap`) are none of this class's to wait for; and
        # the slots it may fill free up at its own pace: with the mean over every class,
        # short interactive answers made a batch queue look twice as fast as it drained,
        # and the batch requests admitted on that estimate were refused late.
        slots = min(self._max, self._cap(rank, now))
        serving = max(1, slots + basis - self._max)
        busy = slots - self._free(rank, now)
        wait = self._expected_wait(ahead, busy, slots, self._class_mean_s(rank), serving)
        return wait / max(_MIN_LEFTOVER, 1.0 - higher)

    def _limit_bounds(self, now: float) -> tuple[int, int]:
        """(lowest set by a cut, highest) limit of the last LIMIT_MEMORY_S seconds; the
        limit now for both with `limit_memory` off."""
        if "limit_memory" in self._off:
            return self._max, self._max
        return self._limits.bounds(now)

    def class_service_s(self, priority: str) -> float:
        """The mean service time of a class's requests (the overall mean until it has
        samples)."""
        return self._class_mean_s(self._ranks[priority])

    def _class_mean_s(self, rank: int) -> float:
        """A class's own mean service time; the overall mean until it has samples."""
        estimator = self._class_service.get(rank)
        return estimator.mean_s if estimator is not None else self._service.mean_s

    def _wait_for(self, rank: int) -> float:
        return self._expected_wait(self._queue.ahead(rank), self._in_flight, self._max)

    def _expected_wait(
        self,
        ahead: int,
        busy: int,
        slots: int,
        mean_s: float | None = None,
        serving: int | None = None,
    ) -> float:
        """Behind `ahead` waiters, with `busy` of the `slots` a request may take in use."""
        mean_s = self._service.mean_s if mean_s is None else mean_s
        if self._max == 0:  # cold: the wait is the start, then a share of one replica
            return self._cold_start_s + expected_wait_s(ahead, 0, 1, mean_s)
        return expected_wait_s(ahead, busy, slots, mean_s, serving)

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

    def _held(self, rank: int) -> int:
        """Requests in flight of this class and the higher ones: the slots a request of
        the class waits for (`_may_dispatch`)."""
        return sum(n for r, n in self._in_flight_by_rank.items() if r <= rank)

    def _cap(self, rank: int, now: float) -> int:
        """How many may be in flight in all, for a request of this class to go: the
        ceiling; for lower classes less a reserve of RESERVED_SHARE of it (rounded down)
        while the top class has been dispatching lately, so that where the ceiling binds
        (a fixed limit, where it is the limit) a top-class arrival finds a free slot at
        once instead of waiting for a long batch request to finish."""
        if rank == self._top_rank or not self._load.recent(self._top_rank, now):
            return self._ceiling
        return self._ceiling - math.floor(RESERVED_SHARE * self._ceiling)

    def _free(self, rank: int, now: float) -> int:
        """Slots a request of this class could take now."""
        return max(0, min(self._max - self._held(rank), self._cap(rank, now) - self._in_flight))

    def _may_dispatch(self, rank: int, now: float) -> bool:
        """Whether a request of this class may be dispatched now: the limit counts the
        requests in flight of its class and the higher ones only, and all of them stay
        within `_cap` (the ceiling, `set_capacity`).

        So a higher class never waits for a lower class's slot: batch requests are long
        and a learned limit full of them held interactive arrivals here for one to
        finish, although the engine would have run them next (bench/slo_goodput.py,
        vLLM's CPU build at load 1: interactive time to first token p99 5-7x the bare
        engine's). The engine then holds at most the limit of the top class plus the lower
        classes' requests already in flight, and lower classes go only once the total is
        back under the limit; with priority scheduling the engine runs the top class first
        anyway. Where the ceiling is the limit (a fixed limit) nothing goes over it.
        """
        if rank != self._top_rank and self._prefills:
            return False  # not into the engine step that computes a top-class prompt
        return self._free(rank, now) > 0

    def _recheck(self, now: float) -> None:
        """Drops, from the back of each tenant's line, the waiters whose expected wait has
        grown past their deadline (a burst of higher-class work, slower service): told now,
        not at the deadline. Only the newest are at risk; the check stops at one that fits.
        """
        if self._max == 0:
            return  # held for a cold start, whose estimate does not shrink as it proceeds
        self._rechecked_at = now
        for rank, tenant in self._queue.tenants_waiting():
            while (newest := self._queue.newest(rank, tenant)) is not None:
                entry, position = newest
                if entry not in self._waiters:
                    break  # cannot happen (queue and waiters move together); never spin
                ahead = self._queue.ahead_of(tenant, entry.weight, rank, position)
                if not should_shed(now, entry.deadline, self._wait(ahead, rank, now)):
                    break
                self._drop(
                    entry, "deadline_passed" if entry.deadline <= now else "deadline_slipped"
                )

    def _grant(self, entry: Entry, now: float) -> None:
        waiter = self._forget(entry, withdraw=False)
        self._queue.dispatch(entry)
        waiter.future.set_result(self._start(entry, now))

    def _start(self, entry: Entry, now: float) -> Slot:
        self._in_flight += 1
        if entry.rank != self._top_rank:
            self._pacer.take(now, entry.steps)
        self._in_flight_by_rank[entry.rank] = self._in_flight_by_rank.get(entry.rank, 0) + 1
        self._dispatched[entry.priority] = self._dispatched.get(entry.priority, 0) + 1
        self._load.record(now, entry.rank)
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
        self._prefills += 1
        return True

    def prefill_ended(self) -> None:
        """For `Slot`: a stream `prefill_began` counted has its first token."""
        self._prefills -= 1
        if not self._prefills:
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
        self._drain.record(now, entry.rank, entry.tenant, entry.weight)
        self._in_flight -= 1
        if entry.rank != self._top_rank:  # the pace follows what it paces, not the top class
            self._pacer.finished(now, entry.steps)
        self._in_flight_by_rank[entry.rank] -= 1
        if service_s is not None:
            self._service.observe(service_s)
            estimator = self._class_service.get(entry.rank)
            if estimator is None:
                estimator = self._class_service[entry.rank] = ServiceTimeEstimator()
            estimator.observe(service_s)
        self._pump(recheck=False)  # a release mostly shortens waits: see RECHECK_INTERVAL_S
        if not self._in_flight and not len(self._queue):
            self._drain.idle(now)

    def _count(self, entry: Entry, shed: Shed) -> Shed:
        key = (entry.priority, shed.reason)
        self._shed[key] = self._shed.get(key, 0) + 1
        return shed
