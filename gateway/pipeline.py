"""The request path, top to bottom (`Pipeline._serve`), one call per step:

    authenticate the tenant's key, as a bearer or `x-api-key` (gateway/tenancy/auth.py)
    parse        body within limits (gateway/body.py); a dialect's request (Anthropic's
                 Messages, OpenAI's Responses) becomes a chat request (gateway/dialects/),
                 or, for a backend that serves the dialect itself, is sent as it came;
                 typed request (gateway/openai_schema.py)
    route        model and prompt size -> backend pool, tenant may use it
                 (gateway/tenancy/tenants.py, gateway/prompt_size.py)
    admit        quotas reserve the estimated tokens, and spend budgets the most it can
                 cost at its model's price (gateway/tenancy/quotas.py)
    cache        look the prompt up, answer a hit (gateway/cache_http.py -> cache/semantic.py)
    degrade      its queue would keep it too long: cap its output or send it to a cheaper
                 model, where its policy says so; then it goes alone (gateway/degrade.py)
    coalesce     an identical request is with the model: wait for its answer; else lead
                 the requests that come meanwhile (gateway/coalesce.py; its flights, the
                 cache's lookups and stores under way: one registry, cache/in_flight.py)
    acquire      cold start, fair queue, shedding: a lease (gateway/traffic/pool.py); held
                 for a start, a stream gets keep-alives meanwhile (gateway/held.py)
    forward      replica (its session's or prefix's while that one has room,
                 gateway/traffic/affinity.py), breaker, budgeted retries
                 (gateway/traffic/forward.py); for a model with fallbacks, the next one when
                 it cannot answer (gateway/fallback.py)
    relay        whole or as a stream (gateway/relay.py); a dialect's answer is translated
                 on its way out (gateway/dialects/translated.py, wrapped by gateway/app.py)

and, however it ends, store, land its flight, settle, release, record and end its trace,
from one place (gateway/lifecycle.py; the trace's spans, gateway/tracing.py). Errors are
typed (gateway/errors.py) and become responses there.
`cache_feedback` is the short path of a client reporting a bad hit: authenticate, read,
delete the entry within the tenant's cache scope (gateway/cache_http.py).

Over 400 lines: the request path is read from this file, top to bottom, one short method
per step (../shared/STYLE.md: a newcomer finds every step from one place); each step's
work is in the module the map above names.
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, replace

import orjson
from starlette.requests import Request
from starlette.responses import Response

from backends.http import UpstreamResponse
from cache.policy import Mode
from gateway.body import BodyReader
from gateway.cache_http import CacheOutcome, HttpCache, Probe, reported
from gateway.coalesce import Flight, Flights
from gateway.degrade import Degradation, decide, rewritten
from gateway.dialects import Dialect
from gateway.disconnect import unless_disconnected
from gateway.errors import GatewayError, ModelNotAllowed
from gateway.fallback import Fallbacks
from gateway.held import HeldStream
from gateway.lifecycle import Exchange, Lifecycle
from gateway.metrics import Metrics
from gateway.openai_schema import UPSTREAM_PATHS, Kind, OpenAIRequest, parse_request
from gateway.relay import Ending, stream, whole
from gateway.settings import Degrade, Price, Priority, Tenant, TrafficSettings
from gateway.tenancy.admission import limits_of, refusal
from gateway.tenancy.auth import Authenticator
from gateway.tenancy.quotas import QuotaEnforcer
from gateway.tenancy.tenants import Catalog
from gateway.traffic.affinity import affinity_key
from gateway.traffic.deadline import (
    Deadline,
    client_deadline,
    held_deadline_s,
    request_class,
    whole_deadline,
)
from gateway.traffic.forward import forward
from gateway.traffic.pool import Admitted, Pool, acquire
from gateway.upstream_body import Rewrite, cache_salt, for_engine
from gateway.usage import UsageTap

UNROUTED_MODEL = "unknown"  # the model recorded for a request whose model did not route


@dataclass(slots=True)
class Call:
    """An admitted request: what it asked, who asked, where it goes, until when."""

    body: OpenAIRequest
    raw: bytes  # forwarded unchanged
    tenant: Tenant
    pool: Pool
    priority: Priority
    deadline: Deadline
    fallbacks: tuple[str, ...] = ()  # models tried in its model's place (gateway/fallback.py)
    degrade: Degrade | None = None  # its tenant's or model's policy under overload
    # The stream asks the engine for usage the client did not ask for: strip that chunk.
    strip_usage: bool = False
    path: str = "/chat/completions"  # the backend's route for its kind
    # A dialect's request, sent as the client sent it to a backend that serves the
    # dialect itself (`Pipeline._natively`): the cache and coalescing pass it by.
    native: bool = False


class Pipeline:
    def __init__(
        self,
        auth: Authenticator,
        catalog: Catalog,
        pools: dict[str, Pool],
        quotas: QuotaEnforcer,
        cache: HttpCache,
        traffic: TrafficSettings,
        metrics: Metrics,
        lifecycle: Lifecycle,
        body: BodyReader,
        flights: Flights,
        fallbacks: Mapping[str, tuple[str, ...]],
        degrade: Mapping[str, Degrade] | None = None,
        *,
        salt_secret: bytes = b"",
        pricing: Mapping[str, Price] | None = None,
    ) -> None:
        self._auth = auth
        self._salt_secret = salt_secret  # keys each tenant's vLLM cache_salt
        self._catalog = catalog
        self._pools = pools
        self._quotas = quotas
        self._cache = cache
        self._traffic = traffic
        self._metrics = metrics
        self._lifecycle = lifecycle
        self._body = body
        self._flights = flights
        self._chains = fallbacks  # per model with fallbacks, the models tried in its place
        self._fallbacks = Fallbacks(catalog, pools, metrics)
        self._degrade = degrade or {}  # per model with a policy (gateway/degrade.py)
        self._pricing = pricing or {}  # per model: what spend budgets charge

    async def openai(
        self, request: Request, kind: Kind, dialect: Dialect | None = None
    ) -> Response:
        """A request of `kind`, or one in another API's `dialect` that becomes a chat
        request once its tenant is known (gateway/dialects/)."""
        exchange = self._lifecycle.begin(request)
        try:
            async with exchange:
                return await self._serve(request, kind, exchange, dialect)
        except GatewayError as error:  # the one place errors become responses
            return error.to_response(exchange.request_id)

    async def line(self, owner: str, raw: bytes, kind: Kind, path: str) -> Response:
        """A batch line, as its job's tenant (`owner`, `Tenant.owner`: the job's creator
        was authenticated when it created the job; a tenant deleted since runs nothing, even
        once another of its name exists). The rest of the path is a request's; the runner
        cancels a line itself, so no connection is watched."""
        exchange = self._lifecycle.open("POST", path, {})
        try:
            async with exchange:
                call = self._parsed(raw, kind, self._owner(owner, exchange), exchange)
                await self._admit(call, exchange)
                return await self._answer(call, exchange)
        except GatewayError as error:
            return error.to_response(exchange.request_id)

    async def count_tokens(self, request: Request, dialect: Dialect) -> Response:
        """The prompt's size in tokens as the gateway estimates it (what quotas reserve),
        for a model the tenant may use; nothing is sent to a model."""
        exchange = self._lifecycle.begin(request, report=False)
        try:
            async with exchange:
                self._body.check_declared(exchange.headers)
                tenant = await self._authenticate(exchange)
                raw = await dialect.to_chat(await self._body.read(request), tenant.owner)
                body = parse_request("chat", raw)
                self._catalog.route(tenant.name, body.model, body.prompt_tokens())
                counted = orjson.dumps({"input_tokens": body.prompt_tokens()})
                headers = {"x-request-id": exchange.request_id}
                return Response(counted, 200, headers, "application/json")
        except GatewayError as error:
            return error.to_response(exchange.request_id)

    async def models(self, request: Request) -> Response:
        async def listed(tenant: Tenant) -> Response:
            body = _model_list(self._catalog.models_for(tenant.name))
            return Response(body, 200, media_type="application/json")

        return await self.as_tenant(request, listed)

    async def as_tenant(
        self, request: Request, handler: Callable[[Tenant], Awaitable[Response]]
    ) -> Response:
        """`handler`'s answer for the request's tenant (a route that reads, such as
        `/v1/models` and the stored responses'), logged as a request but not reported."""
        exchange = self._lifecycle.begin(request, report=False)
        try:
            async with exchange:
                response = await handler(await self._authenticate(exchange))
                response.headers["x-request-id"] = exchange.request_id
                return response
        except GatewayError as error:
            return error.to_response(exchange.request_id)

    async def cache_feedback(self, request: Request) -> Response:
        exchange = self._lifecycle.begin(request)  # reported: the cache report counts it
        try:
            async with exchange:
                return await self._feedback(request, exchange)
        except GatewayError as error:
            return error.to_response(exchange.request_id)

    async def _feedback(self, request: Request, exchange: Exchange) -> Response:
        self._body.check_declared(exchange.headers)
        tenant = await self._authenticate(exchange)
        raw = await self._body.read(request)
        exchange.cache = CacheOutcome.REPORTED
        _, members = self._catalog.cache_scope(tenant.name)
        entry = await self._cache.report_bad_hit(tenant.name, members, raw)
        exchange.model, exchange.namespace = entry.model, entry.namespace
        return reported(entry, exchange.request_id)

    async def _serve(
        self, request: Request, kind: Kind, exchange: Exchange, dialect: Dialect | None
    ) -> Response:
        self._body.check_declared(exchange.headers)
        tenant = await self._authenticate(exchange)
        sent = raw = await self._body.read(request)
        if dialect is not None:
            raw = await dialect.to_chat(raw, tenant.owner)
        call = self._parsed(raw, kind, tenant, exchange)
        if dialect is not None:
            self._natively(call, dialect, sent)
        await self._admit(call, exchange)
        return await unless_disconnected(request, self._answer(call, exchange))

    def _natively(self, call: Call, dialect: Dialect, sent: bytes) -> None:
        """A dialect's request goes as the client `sent` it where its backend serves the
        dialect itself (its chat translation still routed it, set its class and sizes its
        quota reservation), unless a fallback or a degrade policy could send it to another
        model, whose backend might not."""
        path = dialect.native_path
        if path is None or path not in call.pool.native_paths or call.fallbacks:
            return
        if call.degrade is not None and call.degrade.model is not None:
            return
        call.raw, call.path, call.strip_usage, call.native = sent, path, False, True
        dialect.pass_through()

    def _parsed(self, raw: bytes, kind: Kind, tenant: Tenant, exchange: Exchange) -> Call:
        body = parse_request(kind, raw)
        # A client's model name becomes a metric label, an event and a log field only once
        # it routes: made-up names would grow them without bound.
        exchange.model = UNROUTED_MODEL
        call = self._route(body, raw, tenant, exchange)
        exchange.model = body.model
        if exchange.trace is not None:
            exchange.trace.named(kind, body.model)
        return call

    async def _answer(self, call: Call, exchange: Exchange) -> Response:
        cached = await self._lookup(call, exchange)
        if cached is not None:
            return cached
        admitted = self._admitted(call, exchange)
        if call.degrade is not None:
            admitted = self._degraded(call, exchange, admitted, call.degrade)
        exchange.at_zero = call.pool.at_zero
        if exchange.at_zero:
            return await self._held(call, exchange, admitted)
        if exchange.probe is not None and exchange.degraded is None:
            followed = await self._coalesce(call, exchange, exchange.probe)
            if followed is not None:
                return followed
        return await self._dispatch(call, exchange, admitted)

    async def _coalesce(self, call: Call, exchange: Exchange, probe: Probe) -> Response | None:
        """The answer of an identical request already with the model, as a hit; None to go
        upstream: leading the identical requests that come meanwhile, or released by a
        leader that failed (gateway/coalesce.py)."""
        flight = self._flights.get(probe.key.exact_key)
        if flight is None:
            missed = probe.lookup.missed
            exchange.flight = self._flights.lead(probe.key.exact_key, probe.kind, missed=missed)
            return None
        if probe.mode is not Mode.FULL or probe.lookup.explored is not None:
            return None  # it must reach the model (no-cache, or exploring under a bound)
        tenant, streamed = call.tenant.name, call.body.streamed
        may_use = functools.partial(self._catalog.allows, tenant)
        followed = await flight.follow(streamed, call.deadline.answer_by(), may_use)
        if followed is None:
            return None
        response = self._followed(flight, followed.body, probe, exchange, call)
        if response is None:
            return None
        exchange.cached, exchange.fallback = True, flight.served
        self._cache.count_coalesced(probe)
        return self._with_headers(response, exchange)

    def _followed(
        self, flight: Flight, body: bytes | None, probe: Probe, exchange: Exchange, call: Call
    ) -> Response | None:
        if body is None:  # live: the leader's stream as it comes
            cut_at = call.deadline.stream_cut()
            return flight.stream(probe, exchange.request_id, exchange.hand_off(), cut_at)
        return self._cache.coalesced(probe, body, call.body.streamed, exchange.request_id)

    async def _held(self, call: Call, exchange: Exchange, admitted: Admitted) -> Response:
        """No replica is ready: the request waits for one to start (or wake), under a
        deadline that covers the start unless the client set one; a stream is sent
        keep-alives meanwhile (gateway/held.py)."""
        pool, hold = call.pool, self._traffic.hold
        remaining = pool.manager.start_remaining_s() if pool.manager is not None else None
        length_s = held_deadline_s(
            exchange.headers,
            self._traffic.deadline_s[call.priority],
            self._traffic.max_deadline_s,
            remaining,
            hold.deadline_margin,
            streamed=call.body.streamed,
        )
        full = whole_deadline(exchange.headers, self._traffic.max_deadline_s)
        call.deadline = Deadline.after(length_s, exchange.elapsed_s(), whole=full)
        answer = functools.partial(self._dispatch, call, exchange, admitted)
        if not call.body.streamed:
            return await answer()
        headers = {**exchange.admission.headers, **self._cache.miss_headers(exchange.probe)}
        exchange.hand_off()  # the held stream ends the exchange, once it is over
        return HeldStream(answer, exchange, headers, hold.keepalive_s)

    async def _dispatch(self, call: Call, exchange: Exchange, admitted: Admitted) -> Response:
        """Acquire, forward (the model's fallbacks in turn, where it has some), relay: for
        requests that go upstream, held for a start or not."""
        if call.fallbacks:
            upstream = await self._fallbacks.send(call, exchange, admitted)
        else:
            exchange.lease = lease = await acquire(call.pool, admitted, call.deadline)
            body, streamed = self._salted(call), call.body.streamed
            upstream = await forward(lease, call.path, body, exchange.request_id, streamed=streamed)
        return self._with_headers(await self._relay(call, exchange, upstream), exchange)

    async def _relay(self, call: Call, exchange: Exchange, upstream: UpstreamResponse) -> Response:
        if call.body.streamed and upstream.status == 200:
            return self._stream(call, exchange, upstream)
        backend, rid = call.pool.name, exchange.request_id
        response, exchange.ending = await whole(backend, upstream, rid, self._metrics)
        return response

    def _salted(self, call: Call) -> bytes:
        """The body with the tenant's cache salt, for a pool whose engine takes one (vLLM);
        a fallback's pool gets the body as the client sent it."""
        if not call.pool.cache_salt:
            return call.raw
        scope, _ = self._catalog.cache_scope(call.tenant.name)
        salt = cache_salt(self._salt_secret, scope)
        return for_engine(call.raw, Rewrite(stream_usage=False, cache_salt=salt))[0]

    async def _authenticate(self, exchange: Exchange) -> Tenant:
        headers = exchange.headers
        # Anthropic's clients send the key as `x-api-key`.
        api_key = headers.get("x-api-key")
        bearer = f"Bearer {api_key}" if api_key is not None else None
        principal = await self._auth.authenticate(headers.get("authorization") or bearer)
        exchange.tenant = principal.tenant
        return self._catalog.tenant(principal.tenant)

    def _owner(self, owner: str, exchange: Exchange) -> Tenant:
        tenant = self._catalog.of_owner(owner)
        exchange.tenant = tenant.name
        return tenant

    def _route(self, body: OpenAIRequest, raw: bytes, tenant: Tenant, exchange: Exchange) -> Call:
        route = self._catalog.route(tenant.name, body.model, body.prompt_tokens())
        exchange.backend = route.backend
        if route.by_size:
            self._metrics.prompt_size_routed(route.model, route.backend)
        headers = exchange.headers
        priority = request_class(headers, tenant.priority, tenant.priority_header)
        # The deadline is the class's the request runs in, and started when it arrived.
        traffic = self._traffic
        default_s = traffic.deadline_s[priority]
        deadline = client_deadline(headers, default_s, traffic.max_deadline_s, exchange.elapsed_s())
        pool, fallbacks = self._pools[route.backend], self._chains.get(route.model, ())
        policy = tenant.degrade or self._degrade.get(route.model)
        # Every stream asks for usage: quotas are charged what the engine counted.
        raw, strip = for_engine(raw, Rewrite(stream_usage=body.streamed))
        path = UPSTREAM_PATHS[body.kind]
        return Call(body, raw, tenant, pool, priority, deadline, fallbacks, policy, strip, path)

    async def _admit(self, call: Call, exchange: Exchange) -> None:
        exchange.estimate = call.body.reserved_tokens(self._traffic.default_max_tokens)
        q = call.tenant.quotas
        limits = limits_of(q)
        if limits.unlimited:
            return  # nothing to reserve or settle
        cost = self._cost_bound(call, exchange.estimate) if q.spends else 0
        owner = call.tenant.owner
        admission = await self._quotas.admit(owner, limits, exchange.estimate, cost)
        if not admission.allowed:
            self._metrics.quota_rejected(call.tenant.name, admission.reason or "unknown")
            raise refusal(admission, cost)
        exchange.admission = admission

    def _cost_bound(self, call: Call, estimate: int) -> int:
        """The most the request can cost at its model's price (its prompt estimate and
        whole output budget), held against the spend budgets until the answer is known."""
        price = self._pricing.get(call.body.model)
        if price is None:  # a tenant made by the admin API since start-up may reach one
            raise ModelNotAllowed(
                f"The model '{call.body.model}' has no price, and this tenant has a spend "
                "budget: it may use priced models only."
            )
        output = call.body.output_budget(self._traffic.default_max_tokens)
        return price.micro_usd(estimate - output, 0, output)

    async def _lookup(self, call: Call, exchange: Exchange) -> Response | None:
        if call.native:  # the cache keeps chat answers; this one is the dialect's own
            exchange.cache = CacheOutcome.NONE
            return None
        cache_control = exchange.headers.get("cache-control")
        exchange.probe = probe = self._cache.probe(call.tenant, call.body, cache_control)
        if probe is None:
            exchange.cache = self._cache.skipped(call.body)
            return None
        flight = self._flights.get(probe.key.exact_key) if probe.mode is Mode.FULL else None
        if flight is not None and flight.missed:
            return None  # an identical request missed and is with the model: follow it
        lookup = self._cache.lookup(probe, call.body.streamed, exchange.request_id)
        if exchange.trace is None:
            hit = await lookup
        else:
            with exchange.trace.span("cache lookup") as span:
                hit = await lookup
                span.set_attribute("gateway.cache", probe.outcome)
        if hit is None:
            return None
        exchange.cached = True
        return self._with_headers(hit, exchange)

    def _admitted(self, call: Call, exchange: Exchange) -> Admitted:
        output = call.body.output_budget(self._traffic.default_max_tokens)
        input_tokens = max(0, exchange.estimate - output)
        # Its session's or prefix's replica, where there is a choice (gateway/traffic/affinity.py).
        affinity = None
        if call.pool.affinity:
            affinity = affinity_key(exchange.headers, call.body.fields())
        tenant, priority = call.tenant, call.priority
        trace = exchange.trace
        return Admitted(tenant.name, tenant.weight, priority, input_tokens, output, affinity, trace)

    def _degraded(
        self, call: Call, exchange: Exchange, admitted: Admitted, policy: Degrade
    ) -> Admitted:
        """The request as its policy degrades it when its queue is too long (`call` and
        `exchange` updated), or as it was. Its quota reservation stays as admitted: the
        settle charges what the answer really used."""
        wait_s = call.pool.expected_wait_s(admitted)
        asked = _asked_tokens(call.body, admitted.max_output_tokens)
        degradation = decide(policy, call.priority, wait_s, call.deadline.left_s(), asked)
        if degradation is not None and degradation.model is not None:
            degradation = self._routable(call, exchange, degradation)
        if degradation is None:
            return admitted
        call.raw = rewritten(call.raw, degradation)
        exchange.degraded = degradation.header
        for action, _ in degradation.actions():
            self._metrics.degraded(call.tenant.name, call.body.model, action)
        if degradation.max_tokens is None:
            return admitted
        per_choice = asked or self._traffic.default_max_tokens
        choices = max(1, admitted.max_output_tokens // per_choice)
        return replace(admitted, max_output_tokens=degradation.max_tokens * choices)

    def _routable(
        self, call: Call, exchange: Exchange, degradation: Degradation
    ) -> Degradation | None:
        """`degradation` with `call` sent to its model, or without that action where the
        tenant may not use the model (a tenant created since start-up may not)."""
        model = degradation.model
        assert model is not None
        if model not in self._catalog.models_for(call.tenant.name):
            if degradation.max_tokens is None:
                return None
            return Degradation(degradation.max_tokens, None)
        route = self._catalog.route(call.tenant.name, model, call.body.prompt_tokens())
        call.pool, call.fallbacks = self._pools[route.backend], self._chains.get(model, ())
        exchange.backend = route.backend
        return degradation

    def _stream(self, call: Call, exchange: Exchange, upstream: UpstreamResponse) -> Response:
        recorder = self._cache.recorder(exchange.probe)
        end = exchange.hand_off()

        exchange.tap = usage = UsageTap()

        def tap(data: bytes) -> None:
            usage(data)
            if recorder is not None:
                recorder.feed(data)

        async def finish(ending: Ending) -> None:
            body = recorder.result() if recorder is not None and ending.status == 200 else None
            await end(Ending(ending.status, ending.error, body))

        flight = exchange.flight
        shared = flight.leading(recorder) if flight is not None and recorder is not None else None
        rid = exchange.request_id
        strip = call.strip_usage
        cut_at = call.deadline.stream_cut()
        name = call.pool.name
        return stream(name, upstream, rid, self._metrics, tap, finish, shared, strip, cut_at)

    def _with_headers(self, response: Response, exchange: Exchange) -> Response:
        headers = {**exchange.admission.headers, **self._cache.miss_headers(exchange.probe)}
        for name, value in headers.items():
            response.headers.setdefault(name, value)
        lease = exchange.lease
        if lease is not None and lease.cold_start_ms is not None:
            # Answers to requests that waited for a cold start say how long it took.
            response.headers["x-cold-start-ms"] = str(lease.cold_start_ms)
            lease.first_byte()
            if exchange.trace is not None:
                exchange.trace.event("cold_start", **{"gateway.cold_start_ms": lease.cold_start_ms})
        if exchange.fallback is not None:
            response.headers["x-model-fallback"] = exchange.fallback
        if exchange.degraded is not None:
            response.headers["x-degraded"] = exchange.degraded
        return response


def _asked_tokens(body: OpenAIRequest, budget: int) -> int | None:
    """The output cap per choice the request set (None: none; 0: it produces none)."""
    if budget == 0:
        return 0
    cap = getattr(body, "max_completion_tokens", None) or getattr(body, "max_tokens", None)
    return cap if isinstance(cap, int) else None


def _model_list(models: list[str]) -> bytes:
    data = [{"id": m, "object": "model", "created": 0, "owned_by": "gateway"} for m in models]
    return orjson.dumps({"object": "list", "data": data})
