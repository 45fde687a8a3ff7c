"""The composition root: `create_app(settings)` builds everything in the lifespan and wires
it explicitly. Nothing happens at import."""

from __future__ import annotations

import contextlib
import gc
import logging
import os
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

import anyio
import orjson
from anyio.abc import TaskGroup
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from gateway.accesslog import AccessLog
from gateway.admin import AdminApi, admin_routes
from gateway.assembly import build_cache, build_pools, build_quotas
from gateway.auth import AdminAuthenticator, Authenticator
from gateway.errors import GatewayError, MethodNotAllowed, NotFound
from gateway.events import REQUESTS, open_event_log
from gateway.forward import Pool
from gateway.health import BackendHealth
from gateway.keys import admin_key_hashes, configured_keys
from gateway.metrics import Metrics
from gateway.openapi import openapi_document
from gateway.pipeline import Pipeline
from gateway.reports import build_report
from gateway.settings import Settings
from gateway.state import FileStateStore, StateStore, StateStoreError
from gateway.state_redis import RedisStateStore
from gateway.tenant_store import TenantDirectory
from gateway.tenants import Catalog

_log = logging.getLogger("gateway.app")


def open_state_store(settings: Settings) -> StateStore:
    if settings.state.url == "memory":
        return FileStateStore(settings.state.path)
    return RedisStateStore(settings.state.url, settings.state.prefix)


Endpoint = Callable[[Request], Awaitable[Response]]


@dataclass
class Parts:
    """What the lifespan builds; handlers receive it explicitly."""

    store: StateStore
    pools: dict[str, Pool]
    health: BackendHealth
    pipeline: Pipeline
    admin: AdminApi


def create_app(settings: Settings, environ: Mapping[str, str] | None = None) -> ASGIApp:
    env = dict(os.environ if environ is None else environ)
    metrics = Metrics()
    access = AccessLog(enabled=settings.log_level in ("debug", "info"))
    holder: dict[str, Parts] = {}

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        async with contextlib.AsyncExitStack() as stack, anyio.create_task_group() as group:
            parts = await _build(settings, env, metrics, access, stack, group)
            holder["parts"] = parts
            await parts.health.probe_all()
            group.start_soon(parts.health.run)
            group.start_soon(access.run)
            # Start-up objects live as long as the process: keep them out of every GC pass.
            gc.collect()
            gc.freeze()
            gc.set_threshold(20_000, 20, 20)
            yield
            group.cancel_scope.cancel()

    def parts() -> Parts:
        return holder["parts"]

    async def chat(request: Request) -> Response:
        return await parts().pipeline.openai(request, "chat")

    async def completions(request: Request) -> Response:
        return await parts().pipeline.openai(request, "completions")

    async def embeddings(request: Request) -> Response:
        return await parts().pipeline.openai(request, "embeddings")

    async def models(request: Request) -> Response:
        return await parts().pipeline.models(request)

    async def healthz(request: Request) -> Response:
        return JSONResponse({"status": "ok"})

    async def readyz(request: Request) -> Response:
        return await _readiness(parts())

    async def prometheus(request: Request) -> Response:
        return Response(metrics.exposition(), media_type="text/plain; version=0.0.4")

    schema = orjson.dumps(openapi_document())

    async def openapi(request: Request) -> Response:
        return Response(schema, media_type="application/json")

    routes = [
        Route("/v1/chat/completions", chat, methods=["POST"]),
        Route("/v1/completions", completions, methods=["POST"]),
        Route("/v1/embeddings", embeddings, methods=["POST"]),
        Route("/v1/models", models, methods=["GET"]),
        Route("/healthz", healthz, methods=["GET"]),
        Route("/readyz", readyz, methods=["GET"]),
        Route("/metrics", prometheus, methods=["GET"]),
        Route("/openapi.json", openapi, methods=["GET"]),
        *admin_routes(lambda: parts().admin),
    ]
    handlers: dict[Any, Any] = {HTTPException: _http_error}
    app = Starlette(routes=routes, lifespan=lifespan, exception_handlers=handlers)
    return HotPath(
        app,
        {
            "/v1/chat/completions": chat,
            "/v1/completions": completions,
            "/v1/embeddings": embeddings,
        },
    )


class HotPath:
    """Sends the OpenAI POST routes straight to their handler; everything else to Starlette.

    The handlers catch every error themselves, so Starlette's router and two exception
    middlewares (about a tenth of the CPU of a proxied request) add nothing for them.
    """

    def __init__(self, app: Starlette, routes: dict[str, Endpoint]) -> None:
        self.app = app
        self._routes = routes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        endpoint = self._routes.get(scope["path"]) if scope["type"] == "http" else None
        if endpoint is None or scope["method"] != "POST":
            await self.app(scope, receive, send)
            return
        response = await endpoint(Request(scope, receive))
        await response(scope, receive, send)


async def _build(
    settings: Settings,
    env: dict[str, str],
    metrics: Metrics,
    access: AccessLog,
    stack: contextlib.AsyncExitStack,
    tasks: TaskGroup,
) -> Parts:
    store = open_state_store(settings)
    stack.push_async_callback(store.close)
    pools = await build_pools(settings, metrics, stack, tasks)
    quotas = build_quotas(settings, metrics, stack, tasks)
    cache = await build_cache(settings, metrics, stack, tasks)
    catalog = Catalog(
        {model: b.name for b in settings.backends for model in b.models}, settings.tenants
    )
    tenants = await _tenant_directory(store, catalog, tasks)
    config_keys = configured_keys(settings.tenants, env)
    auth = Authenticator(store, config_keys)
    pipeline = Pipeline(
        auth,
        catalog,
        pools,
        quotas,
        cache,
        settings.traffic,
        metrics,
        access,
        settings.limits.max_body_bytes,
        events=open_event_log(settings, REQUESTS, stack, tasks),
        body_timeout_s=settings.limits.body_timeout_s,
    )
    probes = {
        name: next(iter(pool.replicas.handles.values())).upstream
        for name, pool in pools.items()
        if pool.manager is None and pool.replicas.handles
    }
    health = BackendHealth(probes, {b.name: b.health_path for b in settings.backends})
    guard = AdminAuthenticator(admin_key_hashes(settings.admin, env), auth)
    admin = AdminApi(
        guard,
        tenants,
        store,
        quotas,
        cache,
        config_keys,
        access,
        lambda kind, query: build_report(kind, settings, query),
    )
    return Parts(store, pools, health, pipeline, admin)


async def _tenant_directory(
    store: StateStore, catalog: Catalog, tasks: TaskGroup
) -> TenantDirectory:
    """Tenants of the admin API, loaded before serving and then polled."""
    directory = TenantDirectory(store, catalog)
    try:
        await directory.refresh()
    except StateStoreError as exc:
        # Serve the configured tenants; the poller loads the rest once the store answers.
        _log.warning("tenants not loaded from the state store at start: %s", exc)
    tasks.start_soon(directory.run)
    return directory


async def _readiness(parts: Parts) -> Response:
    checks: dict[str, Any] = {
        "backends": dict(parts.health.reachable),
        "replicas": {
            name: sorted(h.upstream.base_url for h in pool.replicas.handles.values())
            for name, pool in parts.pools.items()
        },
    }
    try:
        await parts.store.ping()
        checks["state"] = "ok"
    except StateStoreError as exc:
        checks["state"] = str(exc)
    # A backend that scales from zero counts: it is started on demand.
    scalable = any(pool.manager is not None for pool in parts.pools.values())
    reachable = any(parts.health.reachable.values()) or scalable
    ready = checks["state"] == "ok" and reachable
    checks["status"] = "ready" if ready else "not_ready"
    return JSONResponse(checks, 200 if ready else 503)


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    error: GatewayError
    if exc.status_code == 405:
        error = MethodNotAllowed(
            f"Method {request.method} is not allowed on {request.url.path}.",
            headers=dict(exc.headers or {}),  # Allow: the methods that are
        )
    else:
        error = NotFound(f"Unknown request URL: {request.method} {request.url.path}.")
    return error.to_response("req_" + os.urandom(12).hex())
