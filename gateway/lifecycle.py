"""One request's record, and the one place its end is handled.

`Exchange` is everything known about a request (who, which model, the cache probe, the
quota reservation, the pool lease) and what it holds; it is its own context manager:

    exchange = lifecycle.begin(request)
    async with exchange:
        ...                         # the steps fill the exchange in

However the block ends, `Exchange.end` runs exactly once: store (a complete answer, in
the cache) and land its flight (the identical requests waiting on it get the answer or are
released, gateway/coalesce.py), settle (the quota reservation, with what the model really
used; shielded from cancellation), release (the lease), record (metrics, access log,
report event). A stream hands its end over (`Exchange.hand_off`): it runs when the stream
is over instead.
An exception leaving the block is turned into the `GatewayError` the client gets
(`errors.as_error`) before the end is recorded, and re-raised as that; a cancellation
(the client left) is recorded as 499.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from types import TracebackType
from typing import Any

import anyio
from starlette.requests import Request

from gateway.accesslog import AccessLog
from gateway.body import header_map
from gateway.cache_http import CacheOutcome, HttpCache, Probe
from gateway.coalesce import Flight
from gateway.errors import GatewayError, as_error, request_id
from gateway.events import EventLog, RequestEvent, refusal_reason
from gateway.metrics import Metrics
from gateway.relay import CLIENT_GONE, Ending, Finish
from gateway.settings import Price
from gateway.tenancy.quotas import Admission, QuotaEnforcer
from gateway.tracing import RequestTrace, Tracing
from gateway.traffic.lease import Lease
from gateway.usage import TokenUsage, UsageTap, usage_of

_UNLIMITED = Admission(True)  # a tenant without quotas: nothing to reserve or settle


@dataclass
class Exchange:
    """What is known about one request, and what it holds until its answer is over."""

    request_id: str
    method: str
    path: str
    started: float  # perf_counter
    headers: dict[str, str]  # gateway.body.header_map
    lifecycle: Lifecycle  # ends it
    report: bool  # records a report event (the OpenAI routes)
    tenant: str | None = None
    model: str | None = None
    backend: str | None = None
    estimate: int = 0  # tokens reserved
    admission: Admission = _UNLIMITED
    cache: CacheOutcome = CacheOutcome.NONE  # the report's cache outcome when there is no probe
    namespace: str | None = None  # likewise its namespace (a reported bad hit's)
    probe: Probe | None = None
    lease: Lease | None = None
    tap: UsageTap | None = None  # counts a stream's usage as it is relayed
    cached: bool = False  # answered from the cache
    at_zero: bool = False  # its backend had no replica when it asked for one
    ending: Ending | None = None  # set by the step that produced the answer
    refused: str | None = None
    handed_off: bool = False  # a stream ends the exchange itself, when it is over
    ended: bool = False
    flight: Flight | None = None  # identical requests wait on its answer (gateway/coalesce.py)
    fallback: str | None = None  # the fallback model that answered (gateway/fallback.py)
    degraded: str | None = None  # what it gave up under overload (gateway/degrade.py)
    trace: RequestTrace | None = None  # its span, when tracing is on (gateway/tracing.py)

    def hand_off(self) -> Finish:
        """The exchange ends when the returned function is called, not with its block."""
        self.handed_off = True
        return self.end

    async def end(self, ending: Ending) -> None:
        await self.lifecycle.end(self, ending)

    async def __aenter__(self) -> Exchange:
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if exc is None:
            if not self.handed_off:
                await self.end(self.ending or Ending(200, None))
        elif isinstance(exc, Exception):
            error = await self.fail(exc)
            if error is not exc:
                raise error from exc
        else:  # cancelled: the client left
            await self.end(CLIENT_GONE)

    async def fail(self, exc: Exception) -> GatewayError:
        """Ends the exchange with the error the client gets for `exc` (also for work that
        outlives the block: a held stream, gateway/held.py), and returns that error."""
        error = as_error(exc, self.request_id)
        self.refused = refusal_reason(error)
        await self.end(Ending(error.status, error.code or error.type))
        return error

    def elapsed_s(self) -> float:
        return time.perf_counter() - self.started

    def usage(self) -> TokenUsage:
        """What the model used: nothing for a hit or a request that never reached one."""
        if self.cached or self.lease is None or self.lease.sent_at is None:
            return TokenUsage(0, 0)
        ending = self.ending
        if ending is not None and ending.usage is not None:
            return ending.usage
        if ending is not None and ending.body is not None:
            return usage_of(ending.body) or TokenUsage(self.estimate, 0)
        if self.tap is not None:
            return self.tap.usage(self.estimate)
        return TokenUsage(self.estimate, 0)


class Lifecycle:
    def __init__(
        self,
        quotas: QuotaEnforcer,
        cache: HttpCache,
        metrics: Metrics,
        access: AccessLog,
        events: EventLog | None,
        pricing: Mapping[str, Price] | None = None,
        tracing: Tracing | None = None,
    ) -> None:
        self._quotas = quotas
        self._tracing = tracing  # None: off
        self._pricing = pricing or {}  # per model: what spend budgets charge
        self._cache = cache
        self._metrics = metrics
        self._access = access
        self._events = events

    def begin(self, request: Request, *, report: bool = True) -> Exchange:
        """The exchange of `request`, to be used as `async with` (see the module)."""
        headers = header_map(request.scope)
        return self.open(request.method, request.scope["path"], headers, report=report)

    def open(
        self, method: str, path: str, headers: dict[str, str], *, report: bool = True
    ) -> Exchange:
        """An exchange for a request that came without HTTP (a batch line)."""
        self._metrics.in_flight += 1
        trace = self._tracing.begin(headers, path) if self._tracing and report else None
        return Exchange(
            request_id(headers),
            method,
            path,
            time.perf_counter(),
            headers,
            self,
            report,
            trace=trace,
        )

    async def end(self, exchange: Exchange, ending: Ending) -> None:
        """Settles, releases, stores and records `exchange`; once, whoever calls first."""
        if exchange.ended:
            return
        exchange.ended = True
        exchange.ending = ending
        if exchange.probe is not None:
            self._keep(exchange, exchange.probe, ending)
        usage = exchange.usage()
        await self._settle(exchange, usage)
        if exchange.lease is not None:
            exchange.lease.release(usage, completed=ending.status < 500 and ending.status != 499)
        if not exchange.cached and exchange.tenant is not None and usage.total:
            self._metrics.tokens(exchange.tenant, usage.prompt, usage.completion)
        self._record(exchange, ending, usage)
        if exchange.trace is not None:
            exchange.trace.end(ending.status, ending.error, _traced(exchange, usage))

    def _keep(self, exchange: Exchange, probe: Probe, ending: Ending) -> None:
        """Stores a complete answer, then lands its flight: the identical requests that
        come from then on are hits. Before the settle's await, so that those waiting on
        the flight need not wait for the quota store too. A fallback model's answer, or a
        degraded one, is not stored: the key names the request as asked."""
        kept_as_asked = exchange.fallback is None and exchange.degraded is None
        if ending.status == 200 and ending.body is not None and kept_as_asked:
            self._cache.store(probe, ending.body)
        if exchange.flight is not None:
            exchange.flight.finish(ending)

    async def _settle(self, exchange: Exchange, usage: TokenUsage) -> None:
        reservation = exchange.admission.reservation
        if reservation is not None:
            # A disconnect must not cancel the refund, or the tenant pays for nothing.
            cost = self._cost(exchange, usage) if reservation.cost else 0
            with anyio.CancelScope(shield=True):
                await self._quotas.settle(reservation, usage.total, cost)

    def _cost(self, exchange: Exchange, usage: TokenUsage) -> int:
        """What the answer cost at the price of the model that gave it (a fallback's, when
        one answered); a model without a price is charged the hold, never nothing."""
        price = self._pricing.get(exchange.fallback or exchange.model or "")
        reservation = exchange.admission.reservation
        if price is None:
            return reservation.cost if reservation is not None else 0
        return price.micro_usd(usage.prompt, usage.cached, usage.completion)

    def _record(self, exchange: Exchange, ending: Ending, usage: TokenUsage) -> None:
        seconds = time.perf_counter() - exchange.started
        e = exchange
        self._metrics.in_flight -= 1
        self._metrics.request_done(e.path, e.tenant or "-", e.model or "-", ending.status, seconds)
        self._access.write(
            e.request_id, e.method, e.path, e.tenant, e.model, ending.status, seconds, ending.error
        )
        if exchange.report and self._events is not None:
            self._events.record(_event(exchange, ending.status, seconds, usage))


def _traced(exchange: Exchange, usage: TokenUsage) -> dict[str, Any]:
    """The request span's closing attributes (GenAI semantic conventions, and ours)."""
    probe = exchange.probe
    return {
        "gen_ai.response.model": exchange.fallback or exchange.model,
        "gen_ai.usage.input_tokens": usage.prompt if usage.total else None,
        "gen_ai.usage.output_tokens": usage.completion if usage.total else None,
        "gateway.request_id": exchange.request_id,
        "gateway.tenant": exchange.tenant,
        "gateway.backend": exchange.backend,
        "gateway.cache": probe.outcome if probe is not None else exchange.cache,
        "gateway.refused": exchange.refused,
    }


def _event(exchange: Exchange, status: int, seconds: float, usage: TokenUsage) -> RequestEvent:
    probe, lease = exchange.probe, exchange.lease
    cold_wait_s = lease.cold_wait_s if lease is not None else None
    return RequestEvent(
        ts=time.time(),
        request_id=exchange.request_id,
        tenant=exchange.tenant,
        model=exchange.model,
        backend=exchange.backend,
        status=status,
        latency_ms=round(seconds * 1000, 3),
        cache=probe.outcome if probe is not None else exchange.cache,
        namespace=probe.key.namespace if probe is not None else exchange.namespace,
        similarity=probe.similarity if probe is not None else None,
        prompt_tokens=usage.prompt,
        completion_tokens=usage.completion,
        saved_tokens=probe.saved_prompt_tokens + probe.saved_completion_tokens if probe else 0,
        saved_prompt_tokens=probe.saved_prompt_tokens if probe is not None else 0,
        saved_completion_tokens=probe.saved_completion_tokens if probe is not None else 0,
        cold_wait_ms=round(cold_wait_s * 1000, 3) if cold_wait_s is not None else None,
        refused=exchange.refused,
        at_zero=exchange.at_zero,
        miss_reason=probe.miss_reason if probe is not None else None,
    )
