"""The worker's access log: requests at debug level, probes not at all.

The gateway in front writes an access line for every request already, and probes the worker
every few seconds: uvicorn's access log (turned off) repeated the one and drowned the rest in
the other. So a request is logged at debug (`--log-level debug`), or at warning when
the worker failed it (5xx), and readiness probes (`/health`, `/startup`, `GET /v1/models`,
the gateway's default `health_path`) are never logged.
"""

from __future__ import annotations

import logging
import time

from starlette.types import ASGIApp, Message, Receive, Scope, Send

logger = logging.getLogger(__name__)

PROBE_PATHS = frozenset({"/health", "/startup", "/v1/models"})
_REQUEST_ID_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_.:")


def is_probe(method: str, path: str) -> bool:
    return method in ("GET", "HEAD") and path in PROBE_PATHS


class AccessLog:
    """ASGI middleware: one line per request once it has been answered (streams included)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or is_probe(scope["method"], scope["path"]):
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status = 500  # unless the app starts an answer: an exception left it without one

        async def watch(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, watch)
        finally:
            level = logging.WARNING if status >= 500 else logging.DEBUG
            if logger.isEnabledFor(level):
                elapsed_ms = (time.perf_counter() - started) * 1000
                logger.log(
                    level,
                    "%s %s %d %.1f ms request_id=%s",
                    scope["method"],
                    scope["path"],
                    status,
                    elapsed_ms,
                    _request_id(scope),
                )


def _request_id(scope: Scope) -> str:
    """The caller's `x-request-id` (the gateway's id for the request), if it is a sane one."""
    for name, value in scope["headers"]:
        if name == b"x-request-id":
            text = bytes(value).decode("latin-1")
            if 0 < len(text) <= 128 and set(text) <= _REQUEST_ID_CHARS:
                return text
    return "-"
