"""Sending a request to its backend: the fair queue, the circuit breaker, and budgeted
retries before the first byte. This is the gateway's only retry layer.

The client's deadline bounds all of it: the wait in the queue, then every attempt, the
waits between them and a stream's first byte. Once a stream relays bytes it is no longer
cut by the deadline (the client is receiving; the backend's `read_s` still applies).
"""

from __future__ import annotations

import asyncio
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
from gateway.errors import BackendUnavailable, DeadlineExceeded, Overloaded
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


# The gateway gives up this long before the client's deadline (at most `_MARGIN_MAX_S`),
# so that the client reads a 504 saying why rather than timing out with nothing.
_MARGIN = 0.1
_MARGIN_MAX_S = 0.5


def answer_by(deadline: float, timeout_s: float) -> float:
    """When the upstream's first byte must have arrived, for a client deadline of
    `timeout_s` seconds that ends at `deadline` (monotonic)."""
    return deadline - min(_MARGIN_MAX_S, _MARGIN * timeout_s)


async def attempt_upstream(
    pool: Pool,
    path: str,
    body: bytes,
    request_id: str,
    deadline: float,
    metrics: Metrics,
    rng: Callable[[], float] = random.random,
    *,
    streamed: bool = False,
) -> tuple[UpstreamResponse, ReplicaHandle]:
    """The upstream's answer (headers arrived and, for a 200 stream, its first bytes; body
    unread) and the replica serving it, after at most three attempts; the caller calls
    `pool.finished(replica)` when done.

    A retryable status that is not retried (attempts or budget exhausted) is returned as
    the answer; the caller relays or maps it. Failures without an answer raise. All of it
    ends by `deadline` (monotonic): past it the attempt in flight is cancelled, its
    connection closed, and `DeadlineExceeded` (504) raised.
    """
    pool.budget.on_request()
    scope = asyncio.timeout(max(0.0, deadline - time.monotonic()))
    try:
        async with scope:
            return await _attempts(pool, path, body, request_id, deadline, metrics, rng, streamed)
    except TimeoutError as exc:
        if not scope.expired():
            raise
        metrics.upstream_error(pool.name, "deadline")
        raise DeadlineExceeded(
            f"The request's deadline passed before the upstream '{pool.name}' answered.",
        ) from exc


async def _attempts(
    pool: Pool,
    path: str,
    body: bytes,
    request_id: str,
    deadline: float,
    metrics: Metrics,
    rng: Callable[[], float],
    streamed: bool,
) -> tuple[UpstreamResponse, ReplicaHandle]:
    headers = {"content-type": "application/json", "x-request-id": request_id}
    attempt = 1
    tried: set[str] = set()
    while True:
        handle = _choose(pool, tried)
        tried.add(handle.id)
        handle.in_flight += 1
        if pool.manager is not None:
            pool.manager.request_started(handle.id)
        try:
            upstream, failure = await _try(handle.upstream, path, body, headers, streamed)
        except BaseException:
            # Cancelled (the deadline passed, or the client left): the replica is free again.
            pool.finished(handle)
            raise
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
    upstream: HttpUpstream, path: str, body: bytes, headers: dict[str, str], streamed: bool
) -> tuple[UpstreamResponse | None, BackendError | None]:
    try:
        response = await upstream.post(path, body, headers)
    except BackendError as exc:
        return None, exc
    if streamed and response.status == 200:
        # A stream's headers come at once; its first token may not. Until that arrives
        # nothing has been relayed, so the deadline still applies.
        try:
            await response.first_chunk()
        except BackendError as exc:
            response.close()
            return None, exc
        except BaseException:
            response.close()  # cancelled: drop the connection, never pool it half-read
            raise
    return response, None


def _kind(failure: BackendError | None) -> Outcome:
    if isinstance(failure, UpstreamConnectError):
        return "connect_error"
    if isinstance(failure, UpstreamTimeoutError):
        return "timeout"
    return "protocol_error"
