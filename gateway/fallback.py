"""Model fallbacks: when the model asked for cannot answer, the next of its fallbacks does.

    fallbacks: {big-model: [small-model, other-model]}    # settings; gateway/fallback_config.py

The model (then each fallback in turn) is left for the next one when it is

    unavailable   no replica can take the request, its circuit is open, its start failed
                  or would outlast the request's deadline (BackendUnavailable, StartTooSlow)
    overloaded    its queue sheds the request (Overloaded), or its upstream answered 429
                  after the retries
    failing       its upstream failed after the retries (UpstreamError: refused, reset,
                  malformed), or answered 5xx after them

always before anything of the answer was sent to the client (the retries' rule), within
the request's deadline. Not on a timeout (the model may be doing the work, and the deadline
is all but spent) nor on other statuses (the answer stands: a 400 says the request is
wrong, whichever model reads it). A fallback after a model that called its upstream is
one more upstream attempt for the same request: it costs a token of the retry budget of
the pool the request came to, and the fallback's own retries spend from that budget too
(one budget however many models a request tries, so that an outage does not multiply the
load on the others). After a model that called no upstream (no replica, circuit open,
shed, start too slow) the fallback's call is the request's first, and free. Fallbacks the
tenant may not use are skipped. When none answers, the client gets the first model's
error, as if there were no fallbacks.

The body sent to a fallback names it (its `model` rewritten, nothing else); its answer
names it too (upstreams answer with their own model name), and carries
`x-model-fallback: <model>`. It is not stored in the cache, whose key names the model
asked for.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Protocol

import orjson

from backends.http import UpstreamResponse
from gateway.errors import (
    BackendUnavailable,
    GatewayError,
    Overloaded,
    StartTooSlow,
    UpstreamError,
)
from gateway.lifecycle import Exchange
from gateway.metrics import Metrics
from gateway.openai_schema import OpenAIRequest
from gateway.settings import Tenant
from gateway.tenancy.tenants import Catalog
from gateway.traffic.deadline import Deadline
from gateway.traffic.forward import forward
from gateway.traffic.pool import Admitted, Pool, acquire
from gateway.traffic.retry import RetryBudget
from gateway.usage import TokenUsage

# What makes a model's place go to its next fallback, and the reason it is counted under.
_LEFT_FOR: dict[type[GatewayError], str] = {
    BackendUnavailable: "unavailable",
    StartTooSlow: "unavailable",
    Overloaded: "overloaded",
    UpstreamError: "failing",
}
_LEAVES = tuple(_LEFT_FOR)
Failure = GatewayError | UpstreamResponse  # a model's failure: raised, or answered


class Routed(Protocol):
    """What the request path knows of a request (gateway/pipeline.py `Call`)."""

    body: OpenAIRequest
    raw: bytes
    tenant: Tenant
    pool: Pool
    deadline: Deadline
    fallbacks: tuple[str, ...]
    path: str


class Fallbacks:
    """Sends requests to their model, or in its place to its fallbacks (`Routed.fallbacks`)."""

    def __init__(self, catalog: Catalog, pools: Mapping[str, Pool], metrics: Metrics) -> None:
        self._catalog = catalog
        self._pools = pools
        self._metrics = metrics

    async def send(self, call: Routed, exchange: Exchange, admitted: Admitted) -> UpstreamResponse:
        """The upstream answer of the request's model, or of the first fallback that
        answers in its place (then `call.pool` is the fallback's)."""
        failure: Failure
        try:
            upstream = await self._attempt(call.pool, call, exchange, admitted, call.raw, None)
        except _LEAVES as exc:
            failure = exc
        else:
            if not _failing(upstream.status):
                return upstream
            failure = upstream
        return await self._instead(call, exchange, admitted, failure)

    async def _instead(
        self, call: Routed, exchange: Exchange, admitted: Admitted, failure: Failure
    ) -> UpstreamResponse:
        reason = _reason(failure)
        for model in call.fallbacks:
            if not self._catalog.allows(call.tenant.name, model):
                continue
            if call.deadline.answer_by() <= time.monotonic():
                break
            if _called_upstream(exchange) and not call.pool.budget.try_spend():
                break
            answered = await self._fall_back(model, call, exchange, admitted, reason)
            if isinstance(answered, UpstreamResponse):
                if isinstance(failure, UpstreamResponse):
                    failure.close()
                return answered
            reason = answered
        if isinstance(failure, GatewayError):
            raise failure
        return failure

    async def _fall_back(
        self, model: str, call: Routed, exchange: Exchange, admitted: Admitted, reason: str
    ) -> UpstreamResponse | str:
        """`model`'s answer in place of the request's, or why it gave none."""
        route = self._catalog.route(call.tenant.name, model, call.body.prompt_tokens())
        pool = self._pools[route.backend]
        self._metrics.model_fallback(call.body.model, model, reason)
        if exchange.lease is not None:  # nothing of the last try reached the client
            exchange.lease.release(TokenUsage(0, 0), completed=False)
            exchange.lease = None
        budget = call.pool.budget
        try:
            upstream = await self._attempt(
                pool, call, exchange, admitted, _named(call, model), budget
            )
        except _LEAVES as exc:
            return _reason(exc)
        if _failing(upstream.status):
            upstream.close()
            return _reason(upstream)
        call.pool, exchange.backend, exchange.fallback = pool, pool.name, model
        if exchange.flight is not None:
            exchange.flight.served = model
        return upstream

    @staticmethod
    async def _attempt(
        pool: Pool,
        call: Routed,
        exchange: Exchange,
        admitted: Admitted,
        body: bytes,
        budget: RetryBudget | None,
    ) -> UpstreamResponse:
        exchange.lease = lease = await acquire(pool, admitted, call.deadline)
        path, streamed = call.path, call.body.streamed
        rid = exchange.request_id
        return await forward(lease, path, body, rid, streamed=streamed, budget=budget)


def _called_upstream(exchange: Exchange) -> bool:
    """Whether the model that just failed made an upstream call. Only then is its fallback
    a retry, one more call for the request, paid from the retry budget. One that made none
    (no replica, its circuit open, its queue shed the request, its start too slow) cost
    the upstreams nothing: its fallback's call is the request's first, and charging it
    refused two thirds of the requests for a model whose circuit was open at half the
    fallback's capacity (bench/workload_shapes.py), with the fallback idle."""
    lease = exchange.lease
    return lease is not None and lease.attempts > 0


def _failing(status: int) -> bool:
    """An answer a fallback may replace: the model's server failing or busy."""
    return status >= 500 or status == 429


def _reason(failure: Failure) -> str:
    if isinstance(failure, UpstreamResponse):
        return "overloaded" if failure.status == 429 else "failing"
    return _LEFT_FOR.get(type(failure), "failing")


def _named(call: Routed, model: str) -> bytes:
    """The request's body for `model`: the client's, with `model` replaced."""
    body = orjson.loads(call.raw)
    body["model"] = model
    return orjson.dumps(body)
