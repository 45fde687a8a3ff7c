"""The request path, top to bottom:

    limit → authenticate → parse → route → admit (quotas) → cache → queue (fair, shed)
          → forward (breaker, retries) → relay (whole or stream) → settle → store → record

Everything a request holds (quota reservation, queue slot) is given back by `Ticket.close`,
exactly once, however the request ends.
"""

from __future__ import annotations

import asyncio
import logging
import math
import re
import secrets
import time
from collections.abc import Awaitable
from dataclasses import dataclass, field
from typing import Any

import anyio
import orjson
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response

from gateway.accesslog import AccessLog
from gateway.answer_cache import AnswerCache, Probe
from gateway.auth import Authenticator
from gateway.errors import (
    BackendUnavailable,
    BadRequest,
    BodyTooLarge,
    ClientGone,
    GatewayError,
    InternalError,
    QuotaExceeded,
    RequestTimeout,
    StateUnavailable,
)
from gateway.events import EventLog, RequestEvent, refusal_reason
from gateway.forward import Admitted, Pool, answer_by, attempt_upstream, take_slot
from gateway.metrics import Metrics
from gateway.openai_schema import parse_body
from gateway.quotas import Admission, QuotaEnforcer, QuotaLimits, estimate_tokens
from gateway.relay import Outcome, stream, whole
from gateway.replicas import ReplicaHandle
from gateway.scheduler import Slot
from gateway.settings import Tenant, TrafficSettings
from gateway.tenants import Catalog
from gateway.usage import Usage, UsageTap, usage_of
from warmpool.manager import ColdStartFailed, ColdStartHandle

_log = logging.getLogger("gateway.pipeline")
_CLIENT_REQUEST_ID = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")
_PRIORITIES = ("interactive", "batch")
_UNLIMITED = Admission(True)  # a tenant without quotas: nothing to reserve or settle


@dataclass
class Exchange:
    """What is known about one request, for its log line and metrics."""

    request_id: str
    method: str
    path: str
    started: float
    tenant: str | None = None
    model: str | None = None
    # For the report event (OpenAI routes only: `events` is set there)
    events: EventLog | None = None
    backend: str | None = None
    cache: str = "none"
    probe: Probe | None = None
    usage: Usage | None = None
    cold_wait_ms: float | None = None
    refused: str | None = None
    at_zero: bool = False

    def finish(self, metrics: Metrics, log: AccessLog, status: int, error: str | None) -> None:
        seconds = time.perf_counter() - self.started
        metrics.in_flight.dec()
        metrics.request_done(self.path, self.tenant or "-", self.model or "-", status, seconds)
        log.write(
            self.request_id, self.method, self.path, self.tenant, self.model, status, seconds, error
        )
        if self.events is not None:
            self.events.record(self._event(status, seconds))

    def _event(self, status: int, seconds: float) -> RequestEvent:
        probe, usage = self.probe, self.usage
        return RequestEvent(
            time.time(),
            self.request_id,
            self.tenant,
            self.model,
            self.backend,
            status,
            round(seconds * 1000, 3),
            probe.outcome if probe is not None else self.cache,
            probe.key.namespace if probe is not None else None,
            probe.similarity if probe is not None else None,
            usage.prompt if usage is not None else 0,
            usage.completion if usage is not None else 0,
            probe.saved_prompt_tokens + probe.saved_completion_tokens if probe else 0,
            probe.saved_prompt_tokens if probe is not None else 0,
            probe.saved_completion_tokens if probe is not None else 0,
            self.cold_wait_ms,
            self.refused,
            self.at_zero,
        )


@dataclass
class Ticket:
    """What one admitted request holds until its answer is over."""

    exchange: Exchange
    tenant: str
    estimate: int
    admission: Admission
    probe: Probe | None = None
    slot: Slot | None = None
    pool: Pool | None = None
    replica: ReplicaHandle | None = None
    upstream_started: float | None = None
    tap: UsageTap = field(default_factory=UsageTap)
    closed: bool = False


class Pipeline:
    def __init__(
        self,
        auth: Authenticator,
        catalog: Catalog,
        pools: dict[str, Pool],
        quotas: QuotaEnforcer,
        cache: AnswerCache,
        traffic: TrafficSettings,
        metrics: Metrics,
        access: AccessLog,
        max_body_bytes: int,
        events: EventLog | None = None,
        body_timeout_s: float = 30.0,
    ) -> None:
        self._auth = auth
        self._catalog = catalog
        self._pools = pools
        self._quotas = quotas
        self._cache = cache
        self._traffic = traffic
        self._metrics = metrics
        self._access = access
        self._max_body = max_body_bytes
        self._body_timeout_s = body_timeout_s
        self._events = events

    async def openai(self, request: Request, kind: str) -> Response:
        exchange = self._begin(request)
        exchange.events = self._events
        try:
            response = await self._serve(request, kind, exchange)
        except GatewayError as exc:
            exchange.refused = refusal_reason(exc)
            exchange.finish(self._metrics, self._access, exc.status, exc.code or exc.type)
            return exc.to_response(exchange.request_id)
        except Exception:
            # A bug: answer in OpenAI's shape, keep the traceback for the operator.
            _log.exception("unexpected error in request %s", exchange.request_id)
            error = InternalError("The gateway failed unexpectedly; the error was logged.")
            exchange.finish(self._metrics, self._access, error.status, error.code)
            return error.to_response(exchange.request_id)
        return response

    async def models(self, request: Request) -> Response:
        exchange = self._begin(request)
        try:
            principal = await self._auth.authenticate(request.headers.get("authorization"))
            exchange.tenant = principal.tenant
            body = _model_list(self._catalog.models_for(principal.tenant))
        except GatewayError as exc:
            exchange.finish(self._metrics, self._access, exc.status, exc.code or exc.type)
            return exc.to_response(exchange.request_id)
        exchange.finish(self._metrics, self._access, 200, None)
        return Response(body, 200, {"x-request-id": exchange.request_id}, "application/json")

    def _begin(self, request: Request) -> Exchange:
        self._metrics.in_flight.inc()
        path = request.scope["path"]
        return Exchange(_request_id(request), request.method, path, time.perf_counter())

    async def _serve(self, request: Request, kind: str, exchange: Exchange) -> Response:
        self._check_declared_size(request)
        principal = await self._auth.authenticate(request.headers.get("authorization"))
        exchange.tenant = principal.tenant
        raw = await self._read_body(request)
        body, fields = parse_body(kind, raw)
        exchange.model = body.model
        route = self._catalog.route(principal.tenant, body.model)
        tenant = self._catalog.tenant(principal.tenant)
        ticket = await self._admit(exchange, tenant, fields)
        try:
            answer = self._answer(request, kind, raw, fields, tenant, route.backend, ticket)
            return await _unless_disconnected(request, answer)
        except BaseException as exc:
            # Errors are answered (and recorded) by the caller; a cancellation is not.
            answered = isinstance(exc, Exception)
            status = exc.status if isinstance(exc, GatewayError) else 500 if answered else 499
            await self._close(ticket, Outcome(status, type(exc).__name__), finish=not answered)
            raise

    async def _admit(self, exchange: Exchange, tenant: Tenant, fields: dict[str, Any]) -> Ticket:
        estimate = estimate_tokens(fields, self._traffic.default_max_tokens)
        q = tenant.quotas
        limits = QuotaLimits(
            q.requests_per_minute,
            q.tokens_per_minute,
            q.max_concurrent,
            q.tokens_per_day,
            q.tokens_per_month,
        )
        admission = (
            _UNLIMITED
            if limits.unlimited
            else await self._quotas.admit(tenant.name, limits, estimate)
        )
        if not admission.allowed:
            self._metrics.quota_rejected(tenant.name, admission.reason or "unknown")
            raise _refusal(admission)
        return Ticket(exchange, tenant.name, estimate, admission)

    async def _answer(
        self,
        request: Request,
        kind: str,
        raw: bytes,
        fields: dict[str, Any],
        tenant: Tenant,
        backend: str,
        ticket: Ticket,
    ) -> Response:
        exchange = ticket.exchange
        streamed = fields.get("stream") is True
        exchange.backend = backend
        ticket.probe = exchange.probe = self._cache.probe(
            tenant, exchange.model or "", kind, fields, request
        )
        if ticket.probe is None:
            exchange.cache = self._cache.skipped(kind, fields)
        else:
            cached = await self._cache.lookup(ticket.probe, streamed, exchange.request_id)
            if cached is not None:
                await self._close(ticket, Outcome(200, None), cached=True)
                return self._with_headers(cached, ticket)
        pool = self._pools[backend]
        exchange.at_zero = pool.manager is not None and len(pool.replicas) == 0
        cold = _activate(pool)
        timeout_s = self._deadline_s(request, tenant)
        # The client's clock started when it sent the request, not now.
        deadline = time.monotonic() - (time.perf_counter() - exchange.started) + timeout_s
        queued = time.perf_counter()
        ticket.slot = await take_slot(
            pool, self._admitted(request, tenant, ticket, fields, timeout_s)
        )
        if cold is not None:
            exchange.cold_wait_ms = round((time.perf_counter() - queued) * 1000, 3)
        ticket.pool = pool
        self._metrics.queue_waited(pool.name, tenant.priority, ticket.slot.waited_s)
        ticket.upstream_started = time.perf_counter()
        upstream, ticket.replica = await attempt_upstream(
            pool,
            exchange.path.removeprefix("/v1"),
            raw,
            exchange.request_id,
            answer_by(deadline, timeout_s),
            self._metrics,
            streamed=streamed,
        )
        if streamed and upstream.status == 200:
            recorder = self._cache.recorder(ticket.probe)

            def tap(data: bytes) -> None:
                ticket.tap(data)
                if recorder is not None:
                    recorder.feed(data)

            async def finish(outcome: Outcome) -> None:
                body = recorder.result() if recorder is not None and outcome.status == 200 else None
                await self._close(ticket, Outcome(outcome.status, outcome.error, body))

            response = stream(pool.name, upstream, exchange.request_id, self._metrics, tap, finish)
            return _cold_headers(self._with_headers(response, ticket), cold)
        response, content = await whole(pool.name, upstream, exchange.request_id, self._metrics)
        await self._close(ticket, Outcome(response.status_code, None, content))
        return _cold_headers(self._with_headers(response, ticket), cold)

    def _admitted(
        self,
        request: Request,
        tenant: Tenant,
        ticket: Ticket,
        fields: dict[str, Any],
        timeout_s: float,
    ) -> Admitted:
        completion = fields.get("max_completion_tokens") or fields.get("max_tokens")
        output = completion if isinstance(completion, int) else self._traffic.default_max_tokens
        return Admitted(
            tenant.name,
            tenant.weight,
            self._priority(request, tenant),
            max(0, ticket.estimate - output),
            output,
            timeout_s,
        )

    def _priority(self, request: Request, tenant: Tenant) -> str:
        asked = request.headers.get("x-priority")
        if tenant.priority_header and asked in _PRIORITIES:
            return str(asked)
        return tenant.priority

    def _deadline_s(self, request: Request, tenant: Tenant) -> float:
        default = self._traffic.deadline_s.get(tenant.priority, 60.0)
        for header in ("x-request-timeout", "x-stainless-timeout"):
            value = request.headers.get(header)
            if value is not None:
                try:
                    asked = float(value)
                except ValueError:
                    continue
                if 0 < asked < default:
                    return asked
        return default

    async def _close(
        self, ticket: Ticket, outcome: Outcome, *, finish: bool = True, cached: bool = False
    ) -> None:
        """Gives back what the request held; records it. Runs once, shielded from cancel."""
        if ticket.closed:
            return
        ticket.closed = True
        usage = ticket.exchange.usage = self._usage(ticket, outcome, cached)
        if ticket.admission.reservation is not None:
            # A disconnect must not cancel the refund, or the tenant pays for nothing.
            with anyio.CancelScope(shield=True):
                await self._quotas.settle(ticket.admission.reservation, usage.total)
        self._release(ticket, usage)
        if not cached:
            self._metrics.tokens(ticket.tenant, usage.prompt, usage.completion)
        if ticket.pool is not None and ticket.replica is not None:
            ticket.pool.finished(ticket.replica)
        if ticket.upstream_started is not None and ticket.pool is not None:
            elapsed = time.perf_counter() - ticket.upstream_started
            self._metrics.upstream_done(ticket.pool.name, elapsed)
        if outcome.status == 200 and outcome.body is not None and ticket.probe is not None:
            self._cache.store_later(ticket.probe, outcome.body)
        if finish:
            ticket.exchange.finish(self._metrics, self._access, outcome.status, outcome.error)

    def _usage(self, ticket: Ticket, outcome: Outcome, cached: bool) -> Usage:
        if cached or ticket.upstream_started is None:
            return Usage(0, 0)  # nothing reached a model: the whole reservation goes back
        if outcome.body is not None:
            return usage_of(outcome.body) or Usage(ticket.estimate, 0)
        return ticket.tap.usage(ticket.estimate)

    def _release(self, ticket: Ticket, usage: Usage) -> None:
        if ticket.slot is None:
            return
        if ticket.upstream_started is None:
            ticket.slot.abandon()
        else:
            ticket.slot.release(usage.prompt, usage.completion)

    def _with_headers(self, response: Response, ticket: Ticket) -> Response:
        headers = {**ticket.admission.headers, **self._cache.miss_headers(ticket.probe)}
        for name, value in headers.items():
            response.headers.setdefault(name, value)
        return response

    def _check_declared_size(self, request: Request) -> None:
        declared = request.headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > self._max_body:
            raise BodyTooLarge(f"The request body exceeds {self._max_body} bytes.")

    async def _read_body(self, request: Request) -> bytes:
        parts: list[bytes] = []
        size = 0
        try:
            async with asyncio.timeout(self._body_timeout_s):
                async for part in request.stream():
                    size += len(part)
                    if size > self._max_body:
                        raise BodyTooLarge(f"The request body exceeds {self._max_body} bytes.")
                    parts.append(part)
        except ClientDisconnect as exc:
            raise BadRequest("The client closed the connection before sending the body.") from exc
        except TimeoutError as exc:
            # A body dribbled under the size limit would hold a connection (and its memory)
            # for as long as the client liked; the rest of it is not read, so hang up.
            raise RequestTimeout(
                f"The request body did not arrive within {self._body_timeout_s:g} s.",
                headers={"connection": "close"},
            ) from exc
        return b"".join(parts)


def _activate(pool: Pool) -> ColdStartHandle | None:
    """Starts a replica now if none is ready (the request then waits in the queue)."""
    if pool.manager is None:
        return None
    try:
        return pool.manager.activate()
    except ColdStartFailed as exc:
        raise BackendUnavailable(
            f"The backend '{pool.name}' could not be started: {exc}",
            retry_after=max(1, math.ceil(exc.retry_after_s)),
        ) from exc


def _cold_headers(response: Response, cold: ColdStartHandle | None) -> Response:
    """Answers to requests that waited for a cold start say how long the start took."""
    if cold is not None and cold.cold_start_s is not None:
        response.headers["x-cold-start-ms"] = str(round(cold.cold_start_s * 1000))
        cold.first_byte()
    return response


async def _unless_disconnected(request: Request, answer: Awaitable[Response]) -> Response:
    """The answer, unless the client leaves first: then its queue place and upstream
    request are cancelled instead of being served to nobody.

    One watcher task per request cancels this one on disconnect (a task group of two
    tasks cost a fifth of the gateway's CPU per proxied request).
    """
    current = asyncio.current_task()
    assert current is not None
    watcher = asyncio.get_running_loop().create_task(_cancel_on_disconnect(request, current))
    try:
        return await answer
    except asyncio.CancelledError:
        if _client_left(watcher) and current.uncancel() == 0:
            raise ClientGone("The client closed the connection before the answer.") from None
        raise
    finally:
        watcher.cancel()


async def _cancel_on_disconnect(request: Request, task: asyncio.Task[Any]) -> bool:
    while (await request.receive())["type"] != "http.disconnect":
        pass
    task.cancel()
    return True


def _client_left(watcher: asyncio.Task[bool]) -> bool:
    return watcher.done() and not watcher.cancelled() and watcher.exception() is None


def _refusal(admission: Admission) -> GatewayError:
    if admission.unavailable:
        return StateUnavailable(
            "The quota store is unreachable and this tenant's budget cannot be checked.",
            retry_after=1,
            headers=admission.headers,
        )
    reason = admission.reason or "quota"
    if admission.retry_after_s is None:
        message = f"This request alone exceeds your {reason.replace('_', ' ')} limit."
    else:
        message = f"Rate limit reached for {reason.replace('_', ' ')}; retry later."
    budget = reason in ("tokens_per_day", "tokens_per_month")
    code = "insufficient_quota" if budget else "rate_limit_exceeded"
    return QuotaExceeded(message, headers=admission.headers, code=code)


def _request_id(request: Request) -> str:
    offered = request.headers.get("x-request-id")
    if offered is not None and _CLIENT_REQUEST_ID.match(offered):
        return offered
    return "req_" + secrets.token_hex(12)


def _model_list(models: list[str]) -> bytes:
    data = [{"id": m, "object": "model", "created": 0, "owned_by": "gateway"} for m in models]
    return orjson.dumps({"object": "list", "data": data})
