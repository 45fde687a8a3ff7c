"""The admission estimate: how long a request would wait in the fair queue, from what the
scheduler measured (service times, each class's recent dispatches, the pace lines drained
at) and the limit now. No I/O and no clock of its own: `now` is passed in,
and `gateway.traffic.scheduler` records into it and asks it on every arrival and re-check.

Admission takes the longer of two estimates (`expected_wait`), so that it errs on the side
of a refusal now rather than one after a wait: the model (`wait`: the waiters ahead, the
slots a class may take, its own mean service time, what higher classes take) and the
measured pace of the tenant's own line (`DrainRate`, `measured_wait_s`). The re-check of
those already waiting takes the shorter, for the same reason: it drops a request that has
waited only when both say it cannot make its deadline.
"""

from __future__ import annotations

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


class Waits:
    """What the estimate is made of, recorded as the queue moves, and the estimates.

    `measured_drain` False: admission on the model alone (benchmarks' ablations,
    `traffic.controllers_off`).
    """

    def __init__(
        self,
        now: float,
        initial_service_s: float,
        *,
        measured_drain: bool = True,
    ) -> None:
        self.service = ServiceTimeEstimator(initial_service_s)
        self._class_service: dict[int, ServiceTimeEstimator] = {}  # by class rank
        self._load = ClassLoad()
        self._drain = DrainRate(now)  # idle until the first request
        self._measured_drain = measured_drain
        self.cold_start_s = 0.0  # expected time until capacity appears while it is 0

    # What the scheduler records.

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

    def expected_wait(
        self,
        queue: FairQueue,
        slots: Slots,
        tenant: str,
        weight: float,
        rank: int,
        now: float,
        position: int | None = None,
    ) -> float:
        """A request's expected wait from the model (`wait`) and the measured pace of its
        tenant's line (`measured_wait_s`); the model's alone where nothing was measured,
        or where it expects no wait and the line has emptied lately; the measured pace
        alone where the model expects none but the line has not emptied for a whole
        window (`_held_apart_from_slots`).

        A newcomer (`position` None: behind all of its tenant's line) gets the longer of
        the two, so that a request that may not make its deadline is refused now rather
        than after a wait. A waiter (`position` in that line, for the re-check) gets the
        shorter, so that a request that has waited is dropped only when both say it
        cannot make its deadline: a learned limit cut below what is in flight lengthens
        the model's wait at once, while the line drains as fast as the engine works. In
        front of vLLM with a small KV cache, whose engine-metrics limit swung between 20
        and 35, the model alone dropped 12-20% of the refusals at 5x after a wait
        (refusal p99 1.5-3.6 s; docs/slo-goodput.md)."""
        wait = self.wait(slots, queue.ahead_of(tenant, weight, rank, position), rank, now)
        held = self._held_apart_from_slots(queue, tenant, rank, now)
        if wait == 0.0 and not held:
            return wait
        own = queue.line(tenant, rank) if position is None else position
        measured = self._measured(queue, slots, tenant, weight, rank, now, own, held)
        if measured is None:
            return wait
        if wait == 0.0:
            return measured
        return max(wait, measured) if position is None else min(wait, measured)

    def _held_apart_from_slots(self, queue: FairQueue, tenant: str, rank: int, now: float) -> bool:
        """Whether the tenant's line has had waiters all through the drain's window.

        The model counts slots only. Where something else holds a lower class (the pacer,
        the prefill gate), it sees free slots and expects no wait, while the line drains
        at the pace those allow; newcomers were then admitted on that zero and waiters
        never dropped until their deadline: in front of vLLM at load 1, a learned limit
        20-30 above what was in flight and 21-25 batch requests queued, 3-4% of the batch
        refusals came at the deadline, 12-13.5 s after arrival (docs/slo-goodput.md,
        seed 311). A line that has not emptied for a whole window is held by something,
        and its measured pace is then its drain; a line held for a moment (a prompt's
        first token, a pacing interval, at light load) keeps the model's zero, since
        its measured pace would be its arrivals', not what it can drain at."""
        since = queue.backlogged_since(tenant, rank)
        return since is not None and since <= now - self._drain.window_s

    def _measured(
        self,
        queue: FairQueue,
        slots: Slots,
        tenant: str,
        weight: float,
        rank: int,
        now: float,
        own: int,
        held: bool,
    ) -> float | None:
        """The wait behind `own` of its tenant's requests at the measured pace; None
        without a measurement (too few finished lately, no slot, or `measured_drain` off).
        `held`: the line is `_held_apart_from_slots`."""
        rates = self._drain.rates(rank, tenant, now) if slots.limit else None
        if rates is None or not self._measured_drain:
            return None
        if held:
            share = 0.0  # backlogged all through the window: its own rate is its turn
        else:
            # Its weight over those of the tenants that take turns in its class's line:
            # with waiters now, or finished lately (a light tenant's line is mostly empty,
            # but its arrivals go first; counted on waiters only, the noisy tenant expected
            # the whole class's pace when overload began, and got half).
            weights = self._drain.weights(rank, now) | queue.waiting_weights(rank)
            weights[tenant] = weight
            share = weight / sum(weights.values())
        return measured_wait_s(own, *rates, share)

    def wait(self, slots: Slots, ahead: int, rank: int, now: float) -> float:
        """Expected wait behind `ahead` waiters at the limit now: higher classes arriving
        meanwhile go first, so a lower class gets only what they leave.

        Until 2026-12-06 admission counted on the lowest limit a cut had set in the last
        10 s and re-checks on the highest ("limit memory", for a learned limit's swings
        and a latency baseline's pin). Three ablations on vLLM's CPU build, nine seeds in
        all (docs/slo-goodput.md), established no effect of it, so it went."""
        higher = self._load.above(rank, now, self.class_mean_s, slots.limit)
        # Slots kept for the top class (`Slots.cap`) are none of this class's to wait for;
        # and the slots it may fill free up at its own pace: with the mean over every
        # class, short interactive answers made a batch queue look twice as fast as it
        # drained, and the batch requests admitted on that estimate were refused late.
        top_active = self.top_active(slots.top_rank, now)
        cap = min(slots.limit, slots.cap(rank, top_active))
        busy = cap - slots.free(rank, top_active)
        wait = self.expected(slots.limit, ahead, busy, cap, self.class_mean_s(rank))
        return wait / max(_MIN_LEFTOVER, 1.0 - higher)

    def expected(
        self,
        limit: int,
        ahead: int,
        busy: int,
        cap: int,
        mean_s: float | None = None,
    ) -> float:
        """Behind `ahead` waiters, with `busy` of the `cap` slots a request may take in
        use; with no slot (`limit` 0, a cold start) the start, then a share of one."""
        mean_s = self.service.mean_s if mean_s is None else mean_s
        if limit == 0:
            return self.cold_start_s + expected_wait_s(ahead, 0, 1, mean_s)
        return expected_wait_s(ahead, busy, cap, mean_s)
