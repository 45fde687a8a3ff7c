"""The ASGI app: routes, and the raw-ASGI hot path in front of Starlette's router.
Everything the handlers use is built in the lifespan by `gateway.compose`."""

from __future__ import annotations

import contextlib
import os
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import Any

import anyio
import orjson
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Route
from starlette.types import ASGIApp, Receive, Scope, Send

from gateway.accesslog import AccessLog
from gateway.admin.api import admin_routes
from gateway.batches.routes import BatchApi, batch_routes
from gateway.compose import Parts, build
from gateway.dialects.anthropic import Messages
from gateway.dialects.responses import Responses
from gateway.dialects.stored_routes import stored_routes
from gateway.dialects.translated import Translated
from gateway.errors import GatewayError, MethodNotAllowed, NotFound, Unauthenticated, request_id
from gateway.metrics import Metrics
from gateway.openai_schema import Kind
from gateway.openapi import openapi_document
from gateway.pipeline import Pipeline
from gateway.settings import Settings
from gateway.tenancy.state import StateStoreError

Endpoint = Callable[[Request], Awaitable[Response]]
OPENAI_ROUTES: dict[str, Kind] = {
    "/v1/chat/completions": "chat",
    "/v1/completions": "completions",
    "/v1/embeddings": "embeddings",
}


def create_app(settings: Settings, environ: Mapping[str, str] | None = None) -> ASGIApp:
    env = dict(os.environ if environ is None else environ)
    metrics = Metrics()
    access = AccessLog(enabled=settings.log_level in ("debug", "info"))
    holder: dict[str, Parts] = {}

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        async with contextlib.AsyncExitStack() as stack, anyio.create_task_group() as group:
            parts = await build(settings, env, metrics, access, stack, group)
            holder["parts"] = parts
            await parts.health.probe_all()
            group.start_soon(parts.health.run)
            group.start_soon(access.run)
            yield
            group.cancel_scope.cancel()

    def parts() -> Parts:
        return holder["parts"]

    routes = [
        *_api_routes(parts),
        *_operational_routes(parts, metrics),
        *admin_routes(lambda: parts().admin),
        *(batch_routes(lambda: _batches(parts())) if settings.batches.enabled else []),
    ]
    handlers: dict[Any, Any] = {HTTPException: _http_error}
    app = Starlette(routes=routes, lifespan=lifespan, exception_handlers=handlers)
    return HotPath(app, lambda: parts().pipeline)


def _api_routes(parts: Callable[[], Parts]) -> list[BaseRoute]:
    """The model APIs: OpenAI's, Anthropic's Messages and the Responses API (translated to
    chat on the way in and back on the way out), models, cache feedback."""

    def openai(kind: Kind) -> Endpoint:
        async def endpoint(request: Request) -> Response:
            return await parts().pipeline.openai(request, kind)

        return endpoint

    async def messages(request: Request) -> Response:
        dialect = Messages()
        return Translated(await parts().pipeline.openai(request, "chat", dialect), dialect)

    async def count_tokens(request: Request) -> Response:
        dialect = Messages(counting=True)
        return Translated(await parts().pipeline.count_tokens(request, dialect), dialect)

    async def responses(request: Request) -> Response:
        dialect = Responses(parts().responses)
        return Translated(await parts().pipeline.openai(request, "chat", dialect), dialect)

    async def models(request: Request) -> Response:
        return await parts().pipeline.models(request)

    async def cache_feedback(request: Request) -> Response:
        return await parts().pipeline.cache_feedback(request)

    return [
        *(Route(path, openai(kind), methods=["POST"]) for path, kind in OPENAI_ROUTES.items()),
        Route("/v1/messages", messages, methods=["POST"]),
        Route("/v1/messages/count_tokens", count_tokens, methods=["POST"]),
        Route("/v1/responses", responses, methods=["POST"]),
        *stored_routes(lambda: parts().responses, lambda: parts().pipeline.as_tenant),
        Route("/v1/models", models, methods=["GET"]),
        Route("/v1/cache/feedback", cache_feedback, methods=["POST"]),
    ]


def _operational_routes(parts: Callable[[], Parts], metrics: Metrics) -> list[BaseRoute]:
    """Health, readiness, metrics and the OpenAPI document."""

    async def healthz(request: Request) -> Response:
        return JSONResponse({"status": "ok"})

    async def readyz(request: Request) -> Response:
        # Details for an operator only: they name backends and the replicas' URLs.
        operator = parts().operators.allows(request.headers.get("authorization"))
        return await _readiness(parts(), operator)

    async def prometheus(request: Request) -> Response:
        # Every tenant's traffic by name: for an operator's scraper, never the public.
        if not parts().operators.allows(request.headers.get("authorization")):
            return OperatorKeyRequired(
                "/metrics needs an operator key (admin.operator_keys or "
                "$GATEWAY_OPERATOR_KEY) or an admin key, sent as 'Authorization: Bearer KEY'."
            ).to_response(request_id())
        return Response(metrics.exposition(), media_type="text/plain; version=0.0.4")

    schema = orjson.dumps(openapi_document())

    async def openapi(request: Request) -> Response:
        return Response(schema, media_type="application/json")

    return [
        Route("/healthz", healthz, methods=["GET"]),
        Route("/readyz", readyz, methods=["GET"]),
        Route("/metrics", prometheus, methods=["GET"]),
        Route("/openapi.json", openapi, methods=["GET"]),
    ]


class HotPath:
    """Sends the OpenAI POST routes (`OPENAI_ROUTES`, the same table Starlette's routes are
    made from) straight to the pipeline; everything else to Starlette.

    The pipeline catches every error itself, so Starlette's router and two exception
    middlewares (about a tenth of the CPU of a proxied request) add nothing for them.
    """

    def __init__(self, app: Starlette, pipeline: Callable[[], Pipeline]) -> None:
        self.app = app
        self._pipeline = pipeline

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind = OPENAI_ROUTES.get(scope["path"]) if scope["type"] == "http" else None
        if kind is None or scope["method"] != "POST":
            await self.app(scope, receive, send)
            return
        response = await self._pipeline().openai(Request(scope, receive), kind)
        await response(scope, receive, send)


class OperatorKeyRequired(Unauthenticated):
    code = "operator_key_required"


def _batches(parts: Parts) -> BatchApi:
    assert parts.batches is not None  # the routes exist only when batches are enabled
    return parts.batches


async def _readiness(parts: Parts, detailed: bool) -> Response:
    """200 when ready, else 503; the checks themselves only when `detailed`."""
    checks: dict[str, Any] = {
        "backends": dict(parts.health.reachable),
        "replicas": {
            name: sorted(h.upstream.base_url for h in pool.replicas.handles.values())
            for name, pool in parts.pools.items()
        },
        "capacity": {name: pool.view() for name, pool in parts.pools.items()},
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
    body = checks if detailed else {"status": checks["status"]}
    return JSONResponse(body, 200 if ready else 503)


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
    return error.to_response(request_id())
