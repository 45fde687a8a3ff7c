"""One request's record, and the one place its end is handled.

`Exchange` is everything known about a request (who, which model, the cache probe, the
quota reservation, the pool lease) and what it holds. `Lifecycle.track` owns it:

    exchange = lifecycle.begin(request)
    async with lifecycle.track(exchange):
        ...                         # the steps fill the exchange in

(`Lifecycle.run` does that around a handler and answers its error, if any.)

However the block ends, `Exchange.end` runs exactly once, shielded from cancellation:
settle (the quota reservation, with what the model really used), release (the lease),
store (a complete answer, in the cache), record (metrics, access log, report event). A
stream hands its end over (`Exchange.hand_off`): it runs when the stream is over instead.
An exception leaving the block is turned into the `GatewayError` the client gets
(`errors.as_error`) before the end is recorded, and re-raised as that; a cancellation
(the client left) is recorded as 499.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

import anyio
from starlette.requests import Request
from starlette.responses import Response

from gateway.accesslog import AccessLog
from gateway.cache_http import HttpCache, Probe
from gateway.errors import GatewayError, as_error, request_id
from gateway.events import EventLog, RequestEvent, refusal_reason
from gateway.metrics import Metrics
from gateway.quotas import Admission, QuotaEnforcer
from gateway.relay import Ending, Finish
from gateway.traffic.pool import Lease
from gateway.usage import TokenUsage, UsageTap, usage_of

Serve = Callable[["Exchange"], Awaitable[Response]]
_UNLIMITED = Admission(True)  # a tenant without quotas: nothing to reserve or settle


async def _not_tracked(ending: Ending) -> None:
    raise RuntimeError("the exchange is not tracked by a Lifecycle")


@dataclass
class Exchange:
    """What is known about one request, and what it holds until its answer is over."""

    request_id: str
    method: str
    path: str
    started: float  # perf_counter
    tenant: str | None = None
    model: str | None = None
    backend: str | None = None
    estimate: int = 0  # tokens reserved
    admission: Admission = _UNLIMITED
    cache: str = "none"  # the report's cache outcome when there is no probe
    probe: Probe | None = None
    lease: Lease | None = None
    tap: UsageTap = field(default_factory=UsageTap)
    cached: bool = False  # answered from the cache
    at_zero: bool = False  # its backend had no replica when it asked for one
    ending: Ending | None = None  # set by the step that produced the answer
    refused: str | None = None
    handed_off: bool = False  # a stream ends the exchange itself, when it is over
    ended: bool = False
    end: Finish = _not_tracked

    def hand_off(self) -> Finish:
        """The exchange ends when the returned function is called, not with its block."""
        self.handed_off = True
        return self.end

    def elapsed_s(self) -> float:
        return time.perf_counter() - self.started

    def usage(self) -> TokenUsage:
        """What the model used: nothing for a hit or a request that never reached one."""
        if self.cached or self.lease is None or self.lease.sent_at is None:
            return TokenUsage(0, 0)
        body = self.ending.body if self.ending is not None else None
        if body is not None:
            return usage_of(body) or TokenUsage(self.estimate, 0)
        return self.tap.usage(self.estimate)


class Lifecycle:
    def __init__(
        self,
        quotas: QuotaEnforcer,
        cache: HttpCache,
        metrics: Metrics,
        access: AccessLog,
        events: EventLog | None,
    ) -> None:
        self._quotas = quotas
        self._cache = cache
        self._metrics = metrics
        self._access = access
        self._events = events

    async def run(self, request: Request, serve: Serve, *, report: bool = True) -> Response:
        """`serve`'s response, or the error it raised as one, its exchange tracked."""
        exchange = self.begin(request)
        try:
            async with self.track(exchange, report=report):
                return await serve(exchange)
        except GatewayError as error:
            return error.to_response(exchange.request_id)

    def begin(self, request: Request) -> Exchange:
        self._metrics.in_flight.inc()
        return Exchange(
            request_id(request.headers), request.method, request.scope["path"], time.perf_counter()
        )

    @asynccontextmanager
    async def track(self, exchange: Exchange, *, report: bool = True) -> AsyncIterator[Exchange]:
        """Ends `exchange` however the block does (see the module)."""
        events = self._events if report else None

        async def end(ending: Ending) -> None:
            await self._end(exchange, ending, events)

        exchange.end = end
        try:
            yield exchange
        except Exception as exc:
            error = as_error(exc, exchange.request_id)
            exchange.refused = refusal_reason(error)
            await self._end(exchange, Ending(error.status, error.code or error.type), events)
            if error is exc:
                raise
            raise error from exc
        except BaseException:
            await self._end(exchange, Ending(499, "client_disconnected"), events)
            raise
        if not exchange.handed_off:
            await self._end(exchange, exchange.ending or Ending(200, None), events)

    async def _end(self, exchange: Exchange, ending: Ending, events: EventLog | None) -> None:
        if exchange.ended:
            return
        exchange.ended = True
        exchange.ending = ending
        usage = exchange.usage()
        with anyio.CancelScope(shield=True):
            await self._settle(exchange, usage)
        if exchange.lease is not None:
            exchange.lease.release(usage)
        if not exchange.cached and exchange.tenant is not None and usage.total:
            self._metrics.tokens(exchange.tenant, usage.prompt, usage.completion)
        if ending.status == 200 and ending.body is not None and exchange.probe is not None:
            self._cache.store(exchange.probe, ending.body)
        self._record(exchange, ending, usage, events)

    async def _settle(self, exchange: Exchange, usage: TokenUsage) -> None:
        # A disconnect must not cancel the refund, or the tenant pays for nothing.
        if exchange.admission.reservation is not None:
            await self._quotas.settle(exchange.admission.reservation, usage.total)

    def _record(
        self, exchange: Exchange, ending: Ending, usage: TokenUsage, events: EventLog | None
    ) -> None:
        seconds = time.perf_counter() - exchange.started
        e = exchange
        self._metrics.in_flight.dec()
        self._metrics.request_done(e.path, e.tenant or "-", e.model or "-", ending.status, seconds)
        self._access.write(
            e.request_id, e.method, e.path, e.tenant, e.model, ending.status, seconds, ending.error
        )
        if events is not None:
            events.record(_event(exchange, ending.status, seconds, usage))


def _event(exchange: Exchange, status: int, seconds: float, usage: TokenUsage) -> RequestEvent:
    probe, lease = exchange.probe, exchange.lease
    cold_wait_s = lease.cold_wait_s if lease is not None else None
    return RequestEvent(
        time.time(),
        exchange.request_id,
        exchange.tenant,
        exchange.model,
        exchange.backend,
        status,
        round(seconds * 1000, 3),
        probe.outcome if probe is not None else exchange.cache,
        probe.key.namespace if probe is not None else None,
        probe.similarity if probe is not None else None,
        usage.prompt,
        usage.completion,
        probe.saved_prompt_tokens + probe.saved_completion_tokens if probe else 0,
        probe.saved_prompt_tokens if probe is not None else 0,
        probe.saved_completion_tokens if probe is not None else 0,
        round(cold_wait_s * 1000, 3) if cold_wait_s is not None else None,
        exchange.refused,
        exchange.at_zero,
    )
