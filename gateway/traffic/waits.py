"""The admission estimate: how long a request would wait in the fair queue, from what the
scheduler measured (service times, each class's recent dispatches, the pace lines drained
at, the limits of the last seconds). No I/O and no clock of its own: `now` is passed in,
and `gateway.traffic.scheduler` records into it and asks it on every arrival and re-check.

Admission takes the longer of two estimates (`admission`), so that it errs on the side of
a refusal now rather than one after a wait: the model (`wait`: the waiters ahead, the slots
a class may take, its own mean service time, what higher classes take) and the measured
pace of the tenant's own line (`DrainRate`, `measured_wait_s`).
"""

from __future__ import annotations

import math
from collections import deque

from gateway.traffic.fair_queue import FairQueue
from gateway.traffic.shedding import (
    ClassLoad,
    DrainRate,
    ServiceTimeEstimator,
    expected_wait_s,
    measured_wait_s,
)
from gateway.traffic.slots import Slots

_MIN_LEFTOVER = 0.05  # a class starved by higher ones: expect 20x longer, not forever

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
# requests that the pin then makes late. On vLLM's CPU build (bench/slo_goodput.py, two
# seeds, 2026-12-05), without it SLO goodput at load 1 fell from 15.4 to 11.1 req/s.
LIMIT_MEMORY_S = 10.0


class LimitMemory:
    """The limits in force over the last LIMIT_MEMORY_S seconds: the lowest a cut set and
    the highest."""

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


class Waits:
    """What the estimate is made of, recorded as the queue moves, and the estimates.

    `measured_drain` False: admission on the model alone; `limit_memory` False: on the
    limit now (benchmarks' ablations, `traffic.controllers_off`).
    """

    def __init__(
        self,
        limit: int,
        now: float,
        initial_service_s: float,
        *,
        measured_drain: bool = True,
        limit_memory: bool = True,
    ) -> None:
        self.service = ServiceTimeEstimator(initial_service_s)
        self._class_service: dict[int, ServiceTimeEstimator] = {}  # by class rank
        self._load = ClassLoad()
        self._drain = DrainRate(now)  # idle until the first request
        self._limits = LimitMemory(limit, now)
        self._measured_drain = measured_drain
        self._limit_memory = limit_memory
        self.cold_start_s = 0.0  # expected time until capacity appears while it is 0

    # What the scheduler records.

    def limit_set(self, limit: int, now: float) -> None:
        self._limits.set(limit, now)

    def dispatched(self, now: float, rank: int) -> None:
        self._load.record(now, rank)

    def busy(self, now: float) -> None:
        """A request arrived: the drain's clock runs (`DrainRate.busy`)."""
        self._drain.busy(now)

    def idle(self, now: float) -> None:
        """Nothing queued or in flight: the drain's clock stops (`DrainRate.idle`)."""
        self._drain.idle(now)

    def finished(
        self, now: float, rank: int, tenant: str, weight: float, service_s: float | None
    ) -> None:
        """A request left its slot; `service_s` a service-time sample, or None."""
        self._drain.record(now, rank, tenant, weight)
        if service_s is None:
            return
        self.service.observe(service_s)
        estimator = self._class_service.get(rank)
        if estimator is None:
            estimator = self._class_service[rank] = ServiceTimeEstimator()
        estimator.observe(service_s)

    # What it reads.

    def top_active(self, top_rank: int, now: float) -> bool:
        """Whether the top class dispatched anything lately (`Slots.cap`)."""
        return self._load.recent(top_rank, now)

    def class_mean_s(self, rank: int) -> float:
        """A class's own mean service time; the overall mean until it has samples."""
        estimator = self._class_service.get(rank)
        return estimator.mean_s if estimator is not None else self.service.mean_s

    def limit_bounds(self, limit: int, now: float) -> tuple[int, int]:
        """(lowest set by a cut, highest) limit of the last LIMIT_MEMORY_S seconds;
        `limit` for both without limit memory."""
        return self._limits.bounds(now) if self._limit_memory else (limit, limit)

    def admission(
        self, queue: FairQueue, slots: Slots, tenant: str, weight: float, rank: int, now: float
    ) -> float:
        """A newcomer's expected wait as admission counts it: the longer of the model's
        (`wait`) and the measured pace's (`measured_wait_s`)."""
        ahead = queue.ahead_of(tenant, weight, rank)
        wait = self.wait(slots, ahead, rank, now, admitting=True)
        rates = self._drain.rates(rank, tenant, now) if slots.limit else None
        if wait == 0.0 or rates is None or not self._measured_drain:
            return wait
        own = queue.line(tenant, rank)
        since = queue.backlogged_since(tenant, rank)
        if since is not None and since <= now - self._drain.window_s:
            share = 0.0  # backlogged all through the window: its own rate is its turn
        else:
            # Its weight over those of the tenants that take turns in its class's line:
            # with waiters now, or finished lately (a light tenant's line is mostly empty,
            # but its arrivals go first; counted on waiters only, the noisy tenant expected
            # the whole class's pace when overload began, and got half).
            weights = self._drain.weights(rank, now) | queue.waiting_weights(rank)
            weights[tenant] = weight
            share = weight / sum(weights.values())
        return max(wait, measured_wait_s(own, *rates, share))

    def wait(
        self, slots: Slots, ahead: int, rank: int, now: float, *, admitting: bool = False
    ) -> float:
        """Expected wait behind `ahead` waiters: higher classes arriving meanwhile go first,
        so a lower class gets only what they leave. The queue drains at the pace of the
        lowest limit of the last LIMIT_MEMORY_S when `admitting`, else of the highest:
        admitted with a margin for the limit's swings, a waiter is dropped only once even
        the best of them would not serve it in time (a latency baseline's pin halves the
        limit for a few seconds, and re-checked on it, a fifth of the waiters were dropped
        that would have been served)."""
        basis = self.limit_bounds(slots.limit, now)[0 if admitting else 1]
        higher = self._load.above(rank, now, self.class_mean_s, basis)
        # Slots kept for the top class (`Slots.cap`) are none of this class's to wait for;
        # and the slots it may fill free up at its own pace: with the mean over every
        # class, short interactive answers made a batch queue look twice as fast as it
        # drained, and the batch requests admitted on that estimate were refused late.
        top_active = self.top_active(slots.top_rank, now)
        cap = min(slots.limit, slots.cap(rank, top_active))
        serving = max(1, cap + basis - slots.limit)
        busy = cap - slots.free(rank, top_active)
        wait = self.expected(slots.limit, ahead, busy, cap, self.class_mean_s(rank), serving)
        return wait / max(_MIN_LEFTOVER, 1.0 - higher)

    def expected(
        self,
        limit: int,
        ahead: int,
        busy: int,
        cap: int,
        mean_s: float | None = None,
        serving: int | None = None,
    ) -> float:
        """Behind `ahead` waiters, with `busy` of the `cap` slots a request may take in
        use; with no slot (`limit` 0, a cold start) the start, then a share of one."""
        mean_s = self.service.mean_s if mean_s is None else mean_s
        if limit == 0:
            return self.cold_start_s + expected_wait_s(ahead, 0, 1, mean_s)
        return expected_wait_s(ahead, busy, cap, mean_s, serving)
