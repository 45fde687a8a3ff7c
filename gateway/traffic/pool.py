"""One backend's pool: everything from "admitted" to "a replica is answering".

    lease = await pool.acquire(request, deadline)   # cold start, fair queue, shedding
    upstream = await forward(lease, path, body, request_id, streamed=...)  # replica, retries
                                                      # (gateway/traffic/forward.py)
    ...relay the answer...
    lease.release(usage)                              # exactly once, however it ended

The lease holds the queue slot, the replica serving it and the cold-start handle
(`Pool.at_zero` says, before `acquire`, whether the request will wait for a start).
`release` gives all of it back: the slot (charged with real usage, or abandoned when
nothing reached a model), the replica's in-flight count, and the upstream-duration
sample. Each replica's in-flight count lives in one place, its `ReplicaHandle`: replica
choice reads it, and the cold-start manager reads it (through `ReplicaSet.load`) to know
which replicas are idle.

Errors are typed: `Overloaded` when the queue sheds the request, `BackendUnavailable` when
no replica can take it (cold start failed, circuit open), `DeadlineExceeded` when the
client's deadline passes before the upstream's first byte.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

from backends.providers.replicas import Replica
from gateway.errors import BackendUnavailable, Overloaded
from gateway.metrics import Metrics
from gateway.traffic.deadline import Deadline
from gateway.traffic.replica_set import ReplicaHandle, ReplicaSet
from gateway.traffic.retry import RetryBudget, UpstreamRetryPolicy
from gateway.traffic.scheduler import FairScheduler, Shed, Slot
from gateway.usage import TokenUsage
from warmpool.manager import ColdStartFailed, ColdStartHandle, ColdStartManager


@dataclass(slots=True)
class Admitted:
    """A request's place in the queue, for the scheduler: who, how big, in which class."""

    tenant: str
    weight: float
    priority: str
    input_tokens: int
    max_output_tokens: int


class Pool:
    """One backend: its ready replicas, its fair queue, its retry budget and policy.

    The queue dispatches at most `per_replica` requests per ready replica at once; with
    none ready (scaled to zero, starting) requests are held in it.
    """

    def __init__(
        self,
        name: str,
        replicas: ReplicaSet,
        scheduler: FairScheduler,
        budget: RetryBudget,
        per_replica: int,
        metrics: Metrics,
        retry: UpstreamRetryPolicy | None = None,
    ) -> None:
        self.name = name
        self.replicas = replicas
        self.scheduler = scheduler
        self.budget = budget
        self.per_replica = per_replica
        self.metrics = metrics
        self.retry = retry or UpstreamRetryPolicy()
        self.manager: ColdStartManager | None = None

    def attach(self, manager: ColdStartManager) -> None:
        """Scales from zero: replicas come and go as `manager` starts and stops them."""
        self.manager = manager
        manager.on_ready_change.append(self._ready_changed)
        manager.on_start_failed.append(self._start_failed)
        self.adopt([], manager.expected_cold_start_s())

    def adopt(self, ready: list[Replica], cold_start_s: float = 0.0) -> None:
        self.replicas.update(ready)
        self.scheduler.set_capacity(len(self.replicas) * self.per_replica, cold_start_s)

    @property
    def at_zero(self) -> bool:
        return self.manager is not None and len(self.replicas) == 0

    async def acquire(self, request: Admitted, deadline: Deadline) -> Lease:
        """A lease on the backend once the fair queue dispatches the request, starting a
        replica first if none is ready (the request then waits in the queue)."""
        cold = self._activate()
        queued = time.perf_counter()
        slot = await self._take_slot(request, deadline)
        cold_wait_s = time.perf_counter() - queued if cold is not None else None
        return Lease(self, slot, deadline, cold, cold_wait_s)

    def _activate(self) -> ColdStartHandle | None:
        if self.manager is None:
            return None
        try:
            return self.manager.activate()
        except ColdStartFailed as exc:
            raise self._unstartable(exc) from exc

    async def _take_slot(self, request: Admitted, deadline: Deadline) -> Slot:
        # The answer must also arrive before the deadline: dispatch no later than one
        # typical service time before it, but never refuse at once for that alone (a mean
        # that long streams made long says little of a short answer's time).
        margin = min(deadline.left_s() / 2, self.scheduler.mean_service_s)
        latest = deadline.at - margin
        try:
            return await self.scheduler.acquire(
                request.tenant,
                request.weight,
                request.priority,
                request.input_tokens,
                request.max_output_tokens,
                latest,
            )
        except Shed as exc:
            raise Overloaded(
                f"The backend '{self.name}' is overloaded ({exc.reason}); retry later.",
                retry_after=max(1, math.ceil(exc.retry_after_s)),
            ) from exc

    def _ready_changed(self, ready: list[Replica]) -> None:
        assert self.manager is not None
        self.adopt(ready, self.manager.expected_cold_start_s())

    def _start_failed(self, exc: ColdStartFailed) -> None:
        """A cold start failed: the requests it holds get 503 now, not at their deadline."""
        self.scheduler.drop_waiting("cold_start_failed", lambda: self._unstartable(exc))

    def _unstartable(self, exc: ColdStartFailed) -> BackendUnavailable:
        return BackendUnavailable(
            f"The backend '{self.name}' could not be started: {exc}",
            retry_after=max(1, math.ceil(exc.retry_after_s)),
        )


class Lease:
    """One request's hold on its pool, from dispatch until its answer is over."""

    def __init__(
        self,
        pool: Pool,
        slot: Slot,
        deadline: Deadline,
        cold: ColdStartHandle | None,
        cold_wait_s: float | None,
    ) -> None:
        self.pool = pool
        self.slot = slot
        self.deadline = deadline
        self.cold = cold
        self.cold_wait_s = cold_wait_s
        self.replica: ReplicaHandle | None = None
        self.sent_at: float | None = None  # perf_counter when `forward` began
        self._released = False

    @property
    def cold_start_ms(self) -> int | None:
        """How long the cold start this request waited for took, once it is over."""
        if self.cold is None or self.cold.cold_start_s is None:
            return None
        return round(self.cold.cold_start_s * 1000)

    def use(self, replica: ReplicaHandle) -> None:
        """The attempt about to be made goes to `replica` (replacing the last one's)."""
        self.leave_replica()
        replica.in_flight += 1
        self.replica = replica

    def leave_replica(self) -> None:
        if self.replica is not None:
            self.replica.done()
            self.replica = None

    def first_byte(self) -> None:
        """The answer's first byte goes to the client (for the cold-start timeline)."""
        if self.cold is not None and self.cold.cold_start_s is not None:
            self.cold.first_byte()

    def release(self, usage: TokenUsage, *, completed: bool = True) -> None:
        """Gives everything back, once, charging the fair queue with what the model used
        (a request that never reached one abandons its slot: no charge, no sample).

        Only a `completed` answer's duration is a service-time sample: one cut short (the
        client left, its deadline passed, the upstream failed) says nothing about how long
        answers take, and counting it once made an idle backend refuse short deadlines."""
        if self._released:
            return
        self._released = True
        self.leave_replica()
        if self.sent_at is None:
            self.slot.abandon()
            return
        self.slot.release(usage.prompt, usage.completion, sampled=completed)
        self.pool.metrics.upstream_done(self.pool.name, time.perf_counter() - self.sent_at)
