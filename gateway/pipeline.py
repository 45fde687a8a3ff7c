"""The request path, top to bottom: limit → authenticate → parse → route → relay → record.

Later stages (quotas, cache, scheduler, cold start) slot in between route and relay.
"""

from __future__ import annotations

import logging
import re
import secrets
import time
from dataclasses import dataclass

import orjson
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response

from gateway.accesslog import AccessLog
from gateway.auth import Authenticator
from gateway.errors import BadRequest, BodyTooLarge, GatewayError, InternalError
from gateway.metrics import Metrics
from gateway.openai_schema import parse_body
from gateway.relay import Relay, RelayedStream
from gateway.tenants import Catalog

_log = logging.getLogger("gateway.pipeline")
_CLIENT_REQUEST_ID = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")


@dataclass
class Exchange:
    """What is known about one request, for its log line and metrics."""

    request_id: str
    method: str
    path: str
    started: float
    tenant: str | None = None
    model: str | None = None

    def finish(self, metrics: Metrics, log: AccessLog, status: int, error: str | None) -> None:
        seconds = time.perf_counter() - self.started
        metrics.in_flight.dec()
        metrics.request_done(self.path, self.tenant or "-", self.model or "-", status, seconds)
        log.write(
            self.request_id, self.method, self.path, self.tenant, self.model, status, seconds, error
        )


class Pipeline:
    def __init__(
        self,
        auth: Authenticator,
        catalog: Catalog,
        relay: Relay,
        metrics: Metrics,
        log: AccessLog,
        max_body_bytes: int,
    ) -> None:
        self._auth = auth
        self._catalog = catalog
        self._relay = relay
        self._metrics = metrics
        self._access = log
        self._max_body = max_body_bytes

    async def openai(self, request: Request, kind: str) -> Response:
        exchange = self._begin(request)
        try:
            response = await self._serve(request, kind, exchange)
        except GatewayError as exc:
            exchange.finish(self._metrics, self._access, exc.status, exc.code or exc.type)
            return exc.to_response(exchange.request_id)
        except Exception:
            # A bug: answer in OpenAI's shape, keep the traceback for the operator.
            _log.exception("unexpected error in request %s", exchange.request_id)
            error = InternalError("The gateway failed unexpectedly; the error was logged.")
            exchange.finish(self._metrics, self._access, error.status, error.code)
            return error.to_response(exchange.request_id)
        if not isinstance(response, RelayedStream):
            exchange.finish(self._metrics, self._access, response.status_code, None)
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
        return Exchange(
            _request_id(request), request.method, request.scope["path"], time.perf_counter()
        )

    async def _serve(self, request: Request, kind: str, exchange: Exchange) -> Response:
        self._check_declared_size(request)
        principal = await self._auth.authenticate(request.headers.get("authorization"))
        exchange.tenant = principal.tenant
        raw = await self._read_body(request)
        body = parse_body(kind, raw)
        exchange.model = body.model
        route = self._catalog.route(principal.tenant, body.model)
        upstream_path = exchange.path.removeprefix("/v1")
        return await self._relay.send(
            route.backend,
            upstream_path,
            raw,
            exchange.request_id,
            bool(body.stream),
            lambda status, error: exchange.finish(self._metrics, self._access, status, error),
        )

    def _check_declared_size(self, request: Request) -> None:
        declared = request.headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > self._max_body:
            raise BodyTooLarge(f"The request body exceeds {self._max_body} bytes.")

    async def _read_body(self, request: Request) -> bytes:
        parts: list[bytes] = []
        size = 0
        try:
            async for part in request.stream():
                size += len(part)
                if size > self._max_body:
                    raise BodyTooLarge(f"The request body exceeds {self._max_body} bytes.")
                parts.append(part)
        except ClientDisconnect as exc:
            raise BadRequest("The client closed the connection before sending the body.") from exc
        return b"".join(parts)


def _request_id(request: Request) -> str:
    offered = request.headers.get("x-request-id")
    if offered is not None and _CLIENT_REQUEST_ID.match(offered):
        return offered
    return "req_" + secrets.token_hex(12)


def _model_list(models: list[str]) -> bytes:
    data = [{"id": m, "object": "model", "created": 0, "owned_by": "gateway"} for m in models]
    return orjson.dumps({"object": "list", "data": data})
