"""Sending a request to its backend: the fair queue, the circuit breaker, and budgeted
retries before the first byte. This is the gateway's only retry layer.
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import anyio

from backends.errors import (
    BackendError,
    UpstreamConnectError,
    UpstreamTimeoutError,
)
from backends.http import HttpUpstream, UpstreamResponse
from backends.providers.replicas import Replica
from gateway.breaker import counts_as_failure
from gateway.errors import BackendUnavailable, Overloaded
from gateway.metrics import Metrics
from gateway.relay import translate
from gateway.replicas import ReplicaHandle, ReplicaSet
from gateway.retry import Outcome, RetryBudget, is_retryable, parse_retry_after, should_retry
from gateway.scheduler import FairScheduler, Shed, Slot

if TYPE_CHECKING:
    from warmpool.manager import ColdStartManager


@dataclass
class Pool:
    """One backend: its ready replicas, its fair queue and its retry budget.

    The queue dispatches at most `per_replica` requests per ready replica at once; with
    none ready (scaled to zero, starting) requests are held in it.
    """

    name: str
    replicas: ReplicaSet
    scheduler: FairScheduler
    budget: RetryBudget
    per_replica: int
    manager: ColdStartManager | None = None

    def adopt(self, ready: list[Replica], cold_start_s: float = 0.0) -> None:
        self.replicas.update(ready)
        self.scheduler.set_capacity(len(self.replicas) * self.per_replica, cold_start_s)

    def finished(self, handle: ReplicaHandle) -> None:
        handle.in_flight -= 1
        if self.manager is not None:
            self.manager.request_finished(handle.id)


@dataclass(frozen=True)
class Admitted:
    """A request's place in the queue, for the scheduler: who, how big, until when."""

    tenant: str
    weight: float
    priority: str
    input_tokens: int
    max_output_tokens: int
    timeout_s: float  # the client's whole deadline, from now


async def take_slot(pool: Pool, request: Admitted) -> Slot:
    """Waits in the backend's fair queue; 503 with Retry-After when shed."""
    # The answer must also arrive before the deadline: dispatch no later than one
    # typical service time before it.
    latest = time.monotonic() + max(0.0, request.timeout_s - pool.scheduler.mean_service_s)
    try:
        return await pool.scheduler.acquire(
            request.tenant,
            request.weight,
            request.priority,
            request.input_tokens,
            request.max_output_tokens,
            latest,
        )
    except Shed as exc:
        if exc.reason == "cold_start_failed":
            raise BackendUnavailable(
                f"The backend '{pool.name}' could not be started; retry later.",
                retry_after=max(1, math.ceil(exc.retry_after_s)),
            ) from exc
        raise Overloaded(
            f"The backend '{pool.name}' is overloaded ({exc.reason}); retry later.",
            retry_after=max(1, math.ceil(exc.retry_after_s)),
        ) from exc


async def attempt_upstream(
    pool: Pool,
    path: str,
    body: bytes,
    request_id: str,
    deadline: float,
    metrics: Metrics,
    rng: Callable[[], float] = random.random,
) -> tuple[UpstreamResponse, ReplicaHandle]:
    """The upstream's answer (headers arrived; body unread) and the replica serving it,
    after at most three attempts; the caller calls `pool.finished(replica)` when done.

    A retryable status that is not retried (attempts or budget exhausted) is returned as
    the answer; the caller relays or maps it. Failures without an answer raise.
    """
    pool.budget.on_request()
    headers = {"content-type": "application/json", "x-request-id": request_id}
    attempt = 1
    tried: set[str] = set()
    while True:
        handle = _choose(pool, tried)
        tried.add(handle.id)
        handle.in_flight += 1
        if pool.manager is not None:
            pool.manager.request_started(handle.id)
        upstream, failure = await _try(handle.upstream, path, body, headers)
        outcome: Outcome = upstream.status if upstream is not None else _kind(failure)
        if handle.breaker is not None:
            handle.breaker.record(not counts_as_failure(outcome))
        if upstream is not None and not is_retryable(outcome):
            return upstream, handle
        retry_after = None
        if upstream is not None:
            retry_after = parse_retry_after(upstream.headers.get("retry-after"), time.time())
        decision = should_retry(attempt, outcome, retry_after, deadline - time.monotonic(), rng=rng)
        if not decision.retry or not pool.budget.try_spend():
            if upstream is not None:
                return upstream, handle
            pool.finished(handle)
            assert failure is not None
            raise translate(pool.name, failure, metrics) from failure
        pool.finished(handle)
        metrics.retried(pool.name, decision.reason)
        if upstream is not None:
            upstream.close()
        await anyio.sleep(decision.delay_s)
        attempt += 1


def _choose(pool: Pool, tried: set[str]) -> ReplicaHandle:
    handle = pool.replicas.pick(tried)
    if handle is None:
        raise BackendUnavailable(
            f"The backend '{pool.name}' has no replica that can take requests now.",
            retry_after=1,
        )
    if handle.breaker is not None and not handle.breaker.allow():
        raise BackendUnavailable(
            f"The backend '{pool.name}' is failing; its circuit is open.",
            retry_after=max(1, math.ceil(handle.breaker.config.open_s)),
        )
    return handle


async def _try(
    upstream: HttpUpstream, path: str, body: bytes, headers: dict[str, str]
) -> tuple[UpstreamResponse | None, BackendError | None]:
    try:
        return await upstream.post(path, body, headers), None
    except BackendError as exc:
        return None, exc


def _kind(failure: BackendError | None) -> Outcome:
    if isinstance(failure, UpstreamConnectError):
        return "connect_error"
    if isinstance(failure, UpstreamTimeoutError):
        return "timeout"
    return "protocol_error"
