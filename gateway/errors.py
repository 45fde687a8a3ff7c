"""Errors a request can end with, and the one place that turns them into OpenAI's error JSON.

    GatewayError                  status  type
    ├── BadRequest                400     invalid_request_error
    ├── Unauthenticated           401     authentication_error   (missing or unknown key)
    ├── ModelNotAllowed           403     permission_error
    ├── ModelNotFound             404     invalid_request_error  (code model_not_found)
    ├── NotFound                  404     invalid_request_error  (unknown route)
    ├── CacheEntryNotFound        404     invalid_request_error  (or another scope's entry)
    ├── MethodNotAllowed          405     invalid_request_error
    ├── RequestTimeout            408     invalid_request_error  (body too slow; closes)
    ├── BodyTooLarge              413     invalid_request_error
    ├── ClientGone                499     client_closed_request  (logged; nobody reads it)
    ├── QuotaExceeded             429     rate_limit_error       (Retry-After, x-ratelimit-*)
    ├── StateUnavailable          503     service_unavailable    (Retry-After)
    ├── Overloaded                503     service_unavailable    (shed from the queue; Retry-After)
    ├── BackendUnavailable        503     service_unavailable    (circuit open; Retry-After)
    ├── StartTooSlow              503     service_unavailable    (its start outlasts the deadline)
    ├── UpstreamError             502     upstream_error         (refused, reset, bad answer)
    ├── UpstreamTimeout           504     timeout_error
    ├── DeadlineExceeded          504     timeout_error          (the client's deadline)
    └── InternalError             500     server_error           (a bug; logged with traceback)

Messages never contain a key or an upstream credential. This module is the one place
that turns an exception into a response, for the OpenAI and admin routes alike
(`as_error`, then `GatewayError.to_response`); other packages' errors are translated into
this tree where they enter (the upstream client's in `gateway.traffic.forward`, the state
store's in the admin API). The batch API's errors (files, batches) are subclasses of these,
in gateway/batches/errors.py. `request_id` names every request the same way.
"""

from __future__ import annotations

import logging
import random
import re
from collections.abc import Mapping

import orjson
from starlette.responses import Response

_log = logging.getLogger("gateway.errors")
_CLIENT_REQUEST_ID = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")


def request_id(headers: Mapping[str, str] | None = None) -> str:
    """The client's `x-request-id` when it is a sane one, else a new `req_...` id."""
    offered = headers.get("x-request-id") if headers is not None else None
    if offered is not None and _CLIENT_REQUEST_ID.match(offered):
        return offered
    # 96 random bits from the module's generator (seeded from the OS, reseeded in a forked
    # child): an id needs to be unique, not unguessable, and `secrets` reads the OS's
    # random source per call, 2.5% of the gateway's CPU at concurrency 64 (py-spy).
    return f"req_{random.getrandbits(96):024x}"


def as_error(exc: Exception, request_id: str) -> GatewayError:
    """`exc` as the error the client gets: itself, or (a bug) a logged 500."""
    if isinstance(exc, GatewayError):
        return exc
    # A bug: answer in OpenAI's shape, keep the traceback for the operator.
    _log.error("unexpected error in request %s", request_id, exc_info=exc)
    return InternalError("The gateway failed unexpectedly; the error was logged.")


class GatewayError(Exception):
    status = 500
    type = "server_error"
    code: str | None = None

    def __init__(
        self,
        message: str,
        *,
        param: str | None = None,
        retry_after: int | None = None,
        headers: dict[str, str] | None = None,
        code: str | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self.retry_after = retry_after
        self.headers = headers or {}
        if code is not None:
            self.code = code

    def body(self) -> bytes:
        return error_body(self.message, self.type, self.param, self.code)

    def to_response(self, request_id: str) -> Response:
        headers = {**self.headers, "x-request-id": request_id}
        if self.retry_after is not None:
            headers["retry-after"] = str(self.retry_after)
        if self.status == 401:
            headers["www-authenticate"] = "Bearer"
        return Response(self.body(), self.status, headers, media_type="application/json")


def error_body(
    message: str, type_: str, param: str | None = None, code: str | None = None
) -> bytes:
    return orjson.dumps(
        {"error": {"message": message, "type": type_, "param": param, "code": code}}
    )


class BadRequest(GatewayError):
    status = 400
    type = "invalid_request_error"


class Unauthenticated(GatewayError):
    status = 401
    type = "authentication_error"
    code = "invalid_api_key"


class ModelNotAllowed(GatewayError):
    status = 403
    type = "permission_error"
    code = "model_not_allowed"


class ModelNotFound(GatewayError):
    status = 404
    type = "invalid_request_error"
    code = "model_not_found"


class NotFound(GatewayError):
    status = 404
    type = "invalid_request_error"
    code = "unknown_url"


class CacheEntryNotFound(GatewayError):
    status = 404
    type = "invalid_request_error"
    code = "cache_entry_not_found"


class MethodNotAllowed(GatewayError):
    status = 405
    type = "invalid_request_error"
    code = "method_not_allowed"


class RequestTimeout(GatewayError):
    status = 408
    type = "invalid_request_error"
    code = "request_timeout"


class BodyTooLarge(GatewayError):
    status = 413
    type = "invalid_request_error"
    code = "request_too_large"


class ClientGone(GatewayError):
    status = 499
    type = "client_closed_request"
    code = "client_disconnected"


class QuotaExceeded(GatewayError):
    status = 429
    type = "rate_limit_error"
    code = "rate_limit_exceeded"


class Overloaded(GatewayError):
    status = 503
    type = "service_unavailable"
    code = "overloaded"


class BackendUnavailable(GatewayError):
    status = 503
    type = "service_unavailable"
    code = "backend_unavailable"


class StartTooSlow(GatewayError):
    """The backend is starting, and its learned start time outlasts the request's deadline:
    refused at once, `Retry-After` when the start should be over."""

    status = 503
    type = "service_unavailable"
    code = "cold_start_too_slow"


class StateUnavailable(GatewayError):
    status = 503
    type = "service_unavailable"
    code = "state_store_unavailable"


class UpstreamError(GatewayError):
    status = 502
    type = "upstream_error"
    code = "bad_gateway"


class UpstreamTimeout(GatewayError):
    status = 504
    type = "timeout_error"
    code = "upstream_timeout"


class DeadlineExceeded(GatewayError):
    status = 504
    type = "timeout_error"
    code = "deadline_exceeded"


class InternalError(GatewayError):
    status = 500
    type = "server_error"
    code = "internal_error"
