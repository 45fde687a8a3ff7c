"""One backend's pool: everything from "admitted" to "a replica is answering".

    lease = await pool.acquire(request, deadline)   # cold start, fair queue, shedding
    upstream = await forward(lease, path, body, request_id, streamed=...)  # replica, retries
                                                      # (gateway/traffic/forward.py)
    ...relay the answer...
    lease.release(usage)                              # exactly once, however it ended

The lease (gateway/traffic/lease.py) holds the queue slot, the replica serving it and the
cold-start handle (`Pool.at_zero` says, before `acquire`, whether the request will wait for
a start).
`release` gives all of it back: the slot (charged with real usage, or abandoned when
nothing reached a model), the replica's in-flight count, and the upstream-duration
sample. Each replica's in-flight count lives in one place, its `ReplicaHandle`: replica
choice reads it, and the cold-start manager reads it (through `ReplicaSet.load`) to know
which replicas are idle.

How many requests the queue dispatches at once is the sum of the replicas' learned limits
(gateway/traffic/capacity.py): `tune`, called every `interval_s` by `run_capacity`, reads
each replica's engine metrics when its backend declares an engine, updates each limit and
resizes the queue. With `mode: fixed` the sum is `max_concurrency` per ready replica.

Errors are typed: `Overloaded` when the queue sheds the request, `BackendUnavailable` when
no replica can take it (cold start failed, circuit open), `StartTooSlow` when the learned
start time alone outlasts its deadline, `DeadlineExceeded` when the client's deadline
passes before the upstream's first byte.
"""

from __future__ import annotations

import asyncio
import logging
import math
import statistics
import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass
from typing import Any

import anyio

from backends.providers.replicas import Replica
from gateway.errors import BackendUnavailable, Overloaded, StartTooSlow
from gateway.metrics import Metrics
from gateway.tracing import RequestTrace
from gateway.traffic.deadline import Deadline
from gateway.traffic.engine_metrics import EngineSample
from gateway.traffic.lease import Lease
from gateway.traffic.replica_set import ReplicaHandle, ReplicaSet
from gateway.traffic.retry import RetryBudget, UpstreamRetryPolicy
from gateway.traffic.scheduler import FairScheduler, Shed, Slot
from warmpool.manager import ColdStartFailed, ColdStartHandle, ColdStartManager

_log = logging.getLogger(__name__)
# The longest step time pacing believes: decode steps of real engines take 10 to 100 ms.
MAX_PACE_S = 0.1


@dataclass(slots=True)
class Admitted:
    """A request's place in the queue, for the scheduler: who, how big, in which class."""

    tenant: str
    weight: float
    priority: str
    input_tokens: int
    max_output_tokens: int
    # The session or prompt prefix it belongs to (gateway/traffic/affinity.py); None: the
    # replica with the most headroom serves it.
    affinity: str | None = None
    trace: RequestTrace | None = None  # its upstream attempts are its trace's children


Scraper = Callable[[ReplicaHandle], Awaitable[EngineSample | None]]


class Pool:
    """One backend: its ready replicas, its fair queue, its retry budget and policy.

    The queue dispatches at most the sum of the ready replicas' limits at once; with none
    ready (scaled to zero, starting) requests are held in it. `engine_priority`: each
    request's class rank goes to the engine as vLLM's `priority` field. `cache_salt`: its
    requests carry their tenant's prefix-cache salt (gateway/upstream_body.py).
    `native_paths`: the routes of other APIs than chat completions that its backend
    serves itself (`/messages`), where a request in that API goes unchanged.
    """

    def __init__(
        self,
        name: str,
        replicas: ReplicaSet,
        scheduler: FairScheduler,
        budget: RetryBudget,
        metrics: Metrics,
        retry: UpstreamRetryPolicy | None = None,
        *,
        engine_priority: bool = False,
        cache_salt: bool = False,
        affinity: bool = False,
        native_paths: frozenset[str] = frozenset(),
    ) -> None:
        self.name = name
        self.replicas = replicas
        self.scheduler = scheduler
        self.budget = budget
        self.metrics = metrics
        self.retry = retry or UpstreamRetryPolicy()
        self.engine_priority = engine_priority
        self.cache_salt = cache_salt  # its engine takes vLLM's per-tenant `cache_salt`
        self._affinity = affinity  # a session's or prefix's requests to one replica
        self.native_paths = native_paths
        self.manager: ColdStartManager | None = None
        self._cold_start_s = 0.0
        self._capacity = -1  # what the scheduler was last told

    def attach(self, manager: ColdStartManager) -> None:
        """Scales from zero: replicas come and go as `manager` starts and stops them."""
        self.manager = manager
        manager.on_ready_change.append(self._ready_changed)
        manager.on_start_failed.append(self._start_failed)
        self.adopt([], manager.expected_cold_start_s())

    def adopt(self, ready: list[Replica], cold_start_s: float = 0.0) -> None:
        self.replicas.update(ready)
        self._cold_start_s = cold_start_s
        self._capacity = -1
        self._resize()

    @property
    def affinity(self) -> bool:
        """Does replica choice follow sessions and prefixes now (on, and a choice to make)?"""
        return self._affinity and len(self.replicas) > 1

    @property
    def capacity(self) -> int:
        """Requests the queue dispatches at once: the sum of the replicas' limits."""
        return max(0, self._capacity)

    def demand(self) -> int:
        """Requests queued here, in flight, and queued inside the engines: what the
        autoscaler sizes the backend for."""
        snap = self.scheduler.snapshot()
        engine_waiting = sum(
            h.capacity.sample.waiting or 0.0
            for h in self.replicas.handles.values()
            if h.capacity.sample is not None
        )
        return sum(snap.depth.values()) + snap.in_flight + round(engine_waiting)

    def learned_per_replica(self) -> float | None:
        """The ready replicas' mean learned limit (None: fixed limits, or none ready)."""
        handles = self.replicas.handles.values()
        if not handles or not all(h.capacity.adaptive for h in handles):
            return None
        return sum(h.capacity.limit for h in handles) / len(handles)

    def desired_replicas(self) -> float:
        """Replicas the backend should have (the gauge KEDA reads, and /readyz): the
        cold-start manager's decision where it scales the backend, else the current demand
        over the learned limit per replica; 0 without demand."""
        if self.manager is not None:
            return float(self.manager.snapshot().desired)
        demand = self.demand()
        per_replica = self.learned_per_replica()
        if demand == 0:
            return 0.0
        if per_replica is None:
            return float(max(1, len(self.replicas)))
        return demand / per_replica

    def view(self) -> dict[str, Any]:
        """The learned capacity, for /readyz and the admin API: the backend's limit and,
        per replica, its limit, where it came from and what the engine reported."""
        snap = self.scheduler.snapshot()
        replicas = []
        for handle in self.replicas.handles.values():
            capacity = handle.capacity.snapshot()
            latency = capacity.latency
            replicas.append(
                {
                    "replica": handle.id,
                    "url": handle.upstream.base_url,
                    "in_flight": handle.in_flight,
                    **{k: v for k, v in asdict(capacity).items() if k != "latency"},
                    "latency": asdict(latency) if latency is not None else None,
                }
            )
        return {
            "backend": self.name,
            "limit": self.capacity,
            "in_flight": snap.in_flight,
            "queued": sum(snap.depth.values()),
            "desired_replicas": round(self.desired_replicas(), 3),
            "start_estimate_s": self._start_estimate_s(),
            "pace_per_s": _rounded(self.scheduler.pace_per_s()),
            "replicas": replicas,
        }

    def _start_estimate_s(self) -> float | None:
        """The learned start time (None: the backend does not scale, or none measured)."""
        return _rounded(self.manager.start_estimate_s() if self.manager is not None else None)

    async def tune(self, scrape: Scraper) -> None:
        """One control tick: read the engines' metrics, update every replica's limit,
        resize the queue."""
        handles = list(self.replicas.handles.values())
        samples = await asyncio.gather(*(scrape(h) for h in handles))
        now = time.monotonic()
        for handle, sample in zip(handles, samples, strict=True):
            handle.capacity.update(now, handle.in_flight, sample)
        self._resize()
        self.scheduler.set_pace(self._pace_s(handles))

    @staticmethod
    def _pace_s(handles: list[ReplicaHandle]) -> float:
        """Lower classes may add about one request a step to each replica's batch: the
        median replica's step time over the number of replicas (0: no pacing, with fixed
        limits or before any step time is known). At most MAX_PACE_S: a latency per
        output token longer than an engine step (a few tokens after a long prompt, an
        upstream that is no batching engine) must not make a batch backlog start at one
        request a second."""
        steps = [s for h in handles if (s := h.capacity.step_s) is not None]
        return min(MAX_PACE_S, statistics.median(steps)) / len(handles) if steps else 0.0

    async def run_capacity(self, scrape: Scraper, interval_s: float) -> None:
        """`tune` every `interval_s`, for as long as the gateway runs. A tick that fails
        is logged and skipped: the limits stay as they were, and the gateway serves on."""
        while True:
            try:
                await self.tune(scrape)
            except Exception:
                _log.exception("capacity tick of backend %r failed", self.name)
            await anyio.sleep(interval_s)

    def _resize(self) -> None:
        handles = self.replicas.handles.values()
        total = sum(h.capacity.limit for h in handles)
        if total != self._capacity:
            self._capacity = total
            ceiling = sum(h.capacity.ceiling for h in handles)
            self.scheduler.set_capacity(total, self._cold_start_s, ceiling)

    @property
    def at_zero(self) -> bool:
        return self.manager is not None and len(self.replicas) == 0

    def expected_wait_s(self, request: Admitted) -> float:
        """How long `request` would wait in the queue if it came now (the start included,
        with no replica ready)."""
        return self.scheduler.expected_wait_s(request.tenant, request.weight, request.priority)

    async def acquire(self, request: Admitted, deadline: Deadline) -> Lease:
        """A lease on the backend once the fair queue dispatches the request, starting a
        replica first if none is ready (the request then waits in the queue)."""
        cold = self._activate()
        if cold is not None:
            self._hold(deadline)
        queued = time.perf_counter()
        slot = await self._take_slot(request, deadline)
        cold_wait_s = time.perf_counter() - queued if cold is not None else None
        tokens = request.input_tokens + request.max_output_tokens
        return Lease(self, slot, deadline, cold, cold_wait_s, tokens, request)

    def _activate(self) -> ColdStartHandle | None:
        if self.manager is None:
            return None
        try:
            return self.manager.activate()
        except ColdStartFailed as exc:
            raise self._unstartable(exc) from exc

    def _hold(self, deadline: Deadline) -> None:
        """A request that will wait for a start: refused at once when the start alone would
        outlast its deadline (the start goes on, and `Retry-After` says when it should be
        over); else the queue counts its wait from what is left of the start."""
        assert self.manager is not None
        remaining = self.manager.start_remaining_s()
        if remaining is not None and remaining > deadline.answer_by() - time.monotonic():
            raise StartTooSlow(
                f"The backend '{self.name}' is starting and should be ready in about "
                f"{math.ceil(remaining)} s, after this request's deadline; retry then.",
                retry_after=max(1, math.ceil(remaining)),
            )
        self.scheduler.expect_capacity_in(remaining or 0.0)

    async def _take_slot(self, request: Admitted, deadline: Deadline) -> Slot:
        # The answer must also arrive before the deadline: dispatch no later than one
        # typical service time of its class before it, but never refuse at once for that
        # alone (a mean that long streams made long says little of a short answer's time).
        # The class's own: with the mean over all, short interactive answers let batch
        # requests go with less time than a batch answer takes (bench/capacity.py at 5x:
        # 40 and 77 batch requests a run answered 504 after 19.5 s of their 20; 12, 25).
        margin = min(deadline.left_s() / 2, self.scheduler.class_service_s(request.priority))
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


async def acquire(pool: Pool, request: Admitted, deadline: Deadline) -> Lease:
    """`pool.acquire`, within a "queue" span of the request's trace when it has one (a shed
    request's span says why, and its trace gets a "shed" event)."""
    trace = request.trace
    if trace is None:
        return await pool.acquire(request, deadline)
    with trace.span("queue", **{"gateway.backend": pool.name}):
        try:
            return await pool.acquire(request, deadline)
        except Overloaded as exc:
            trace.event("shed", **{"gateway.backend": pool.name, "gateway.reason": exc.message})
            raise


def _rounded(value: float | None) -> float | None:
    return None if value is None else round(value, 3)
