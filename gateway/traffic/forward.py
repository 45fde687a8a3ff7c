"""Sending one leased request upstream: replica choice, the circuit breaker, and budgeted
retries before the first byte. This is the gateway's only retry layer.

The client's deadline bounds every attempt, the waits between them and a stream's first
byte. Once a stream relays bytes it is no longer cut by the deadline (the client is
receiving; the backend's `read_s` still applies). Upstream errors are translated here,
where they enter (`translate`).
"""

from __future__ import annotations

import asyncio
import math
import random
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

import anyio
import orjson

from backends.errors import BackendError, UpstreamConnectError, UpstreamTimeoutError
from backends.http import HttpUpstream, UpstreamResponse
from backends.spawn import POLL_S
from gateway.errors import (
    BackendUnavailable,
    DeadlineExceeded,
    GatewayError,
    UpstreamError,
    UpstreamTimeout,
)
from gateway.metrics import Metrics
from gateway.traffic.breaker import counts_as_failure
from gateway.traffic.replica_set import ReplicaHandle
from gateway.traffic.retry import (
    AttemptOutcome,
    RetryBudget,
    is_retryable,
    parse_retry_after,
    should_retry,
)

if TYPE_CHECKING:
    from gateway.traffic.lease import Lease

# A replica that refused the connection has most likely exited. A provider notices an exit
# within one poll of its process (backends/spawn.py), so a retry that has no other replica
# to go to waits two: it then finds the replica gone (no replica: 503 with Retry-After)
# instead of refused again (502). With full jitter alone (0-50 ms) both retries could come
# first (tests/warmpool/test_scale_to_zero_e2e.py, a crashed replica: a 502 now and then).
# A retry that can go to a replica not yet tried does not wait for it.
CONNECT_RETRY_FLOOR_S = 2 * POLL_S


def translate(backend: str, exc: BackendError, metrics: Metrics) -> GatewayError:
    """An upstream client error as the gateway's own (502 or 504), counted."""
    if isinstance(exc, UpstreamTimeoutError):
        metrics.upstream_error(backend, "timeout")
        return UpstreamTimeout(f"The upstream '{backend}' did not answer in time.")
    metrics.upstream_error(backend, type(exc).__name__)
    return UpstreamError(f"The upstream '{backend}' failed: {exc}.")


async def forward(
    lease: Lease,
    path: str,
    body: bytes,
    request_id: str,
    *,
    streamed: bool = False,
    rng: Callable[[], float] = random.random,
    budget: RetryBudget | None = None,
) -> UpstreamResponse:
    """The upstream's answer (headers arrived and, for a 200 stream, its first bytes; body
    unread), served by `lease.replica`, after at most the policy's attempts.

    A retryable status that is not retried (attempts or budget exhausted) is returned as
    the answer; the caller relays or maps it. Failures without an answer raise. All of it
    ends by the deadline's `answer_by`: past it the attempt in flight is cancelled, its
    connection closed, and `DeadlineExceeded` (504) raised.

    `budget`: the retry budget of the pool the request came to, when this pool answers it
    in that one's place (a fallback model, gateway/fallback.py): it is no new request, so
    nothing is deposited, and its retries spend from that budget.
    """
    pool = lease.pool
    lease.sent_at = time.perf_counter()
    lease.streamed = streamed
    if pool.engine_priority:
        body = with_priority(body, lease.slot.rank)
    if budget is None:
        budget = pool.budget
        budget.on_request()
    answer_by = lease.deadline.answer_by()
    scope = asyncio.timeout(max(0.0, answer_by - time.monotonic()))
    try:
        async with scope:
            return await _attempts(lease, path, body, request_id, answer_by, rng, streamed, budget)
    except TimeoutError as exc:
        if not scope.expired():
            raise
        lease.leave_replica()
        pool.metrics.upstream_error(pool.name, "deadline")
        raise DeadlineExceeded(
            f"The request's deadline passed before the upstream '{pool.name}' answered.",
        ) from exc


async def _attempts(
    lease: Lease,
    path: str,
    body: bytes,
    request_id: str,
    answer_by: float,
    rng: Callable[[], float],
    streamed: bool,
    budget: RetryBudget,
) -> UpstreamResponse:
    pool = lease.pool
    headers = {"content-type": "application/json", "x-request-id": request_id}
    attempt = 1
    tried: set[str] = set()
    while True:
        handle = _choose(lease, tried)
        tried.add(handle.id)
        lease.use(handle)
        started = time.perf_counter()
        if streamed:
            lease.slot.prefilling()
        traced = (
            lease.trace.attempt(handle.upstream.base_url + path, attempt) if lease.trace else None
        )
        sent = {**headers, **traced.headers} if traced is not None else headers
        try:
            upstream, failure = await _try(handle.upstream, path, body, sent, streamed)
        finally:
            lease.slot.first_token()
        outcome: AttemptOutcome = upstream.status if upstream is not None else _kind(failure)
        if traced is not None:
            traced.end(upstream.status if upstream is not None else None, _failed(failure))
        if streamed and outcome == 200:
            lease.first_token_at = time.perf_counter()
            handle.capacity.observe("ttft", lease.first_token_at - started, time.monotonic())
        if handle.breaker is not None:
            handle.breaker.record(not counts_as_failure(outcome))
        if upstream is not None and not is_retryable(outcome):
            return upstream
        nowhere_else = outcome == "connect_error" and tried >= pool.replicas.handles.keys()
        retry_after = CONNECT_RETRY_FLOOR_S if nowhere_else else None
        if upstream is not None:
            retry_after = parse_retry_after(upstream.headers.get("retry-after"), time.time())
        decision = should_retry(
            attempt, outcome, retry_after, answer_by - time.monotonic(), rng=rng, policy=pool.retry
        )
        if not decision.retry or not budget.try_spend():
            if upstream is not None:
                return upstream
            lease.leave_replica()
            assert failure is not None
            raise translate(pool.name, failure, pool.metrics) from failure
        lease.leave_replica()
        pool.metrics.retried(pool.name, decision.reason)
        if upstream is not None:
            upstream.close()
        await anyio.sleep(decision.delay_s)
        attempt += 1


def _failed(failure: BackendError | None) -> str | None:
    return type(failure).__name__ if failure is not None else None


def with_priority(body: bytes, rank: int) -> bytes:
    """The request with vLLM's `priority` field set to its class rank (lower is served
    first; the engine must run with `--scheduling-policy priority`). The gateway decides
    a request's class, so a client's own `priority` is replaced."""
    fields = orjson.loads(body)
    fields["priority"] = rank
    return orjson.dumps(fields)


def _choose(lease: Lease, tried: set[str]) -> ReplicaHandle:
    pool = lease.pool
    handle = pool.replicas.pick(tried, lease.affinity)
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


def _kind(failure: BackendError | None) -> AttemptOutcome:
    if isinstance(failure, UpstreamConnectError):
        return "connect_error"
    if isinstance(failure, UpstreamTimeoutError):
        return "timeout"
    return "protocol_error"
