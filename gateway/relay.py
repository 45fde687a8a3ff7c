"""Relays one request to an upstream and its answer back: whole, or as SSE event by event.

Streams are relayed in complete SSE events, so that if the upstream breaks off, the
client receives a well-formed `data: {"error": ...}` event rather than half an event.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass

from starlette.responses import Response, StreamingResponse
from starlette.types import Receive, Scope, Send

from backends.errors import BackendError, UpstreamTimeoutError
from backends.http import HttpUpstream, UpstreamResponse
from gateway.errors import GatewayError, UpstreamError, UpstreamTimeout, error_body
from gateway.metrics import Metrics

# Relayed from the upstream's answer; everything else (hop-by-hop, cookies, server) is not.
_RELAYED_HEADERS = ("content-type", "retry-after", "openai-processing-ms")
_RELAYED_PREFIXES = ("x-ratelimit-",)
_DONE = b"data: [DONE]"

StreamEnd = Callable[[int, str | None], None]


@dataclass(frozen=True)
class Outcome:
    status: int
    error: str | None


class Relay:
    def __init__(self, upstreams: Mapping[str, HttpUpstream], metrics: Metrics) -> None:
        self._upstreams = upstreams
        self._metrics = metrics

    async def send(
        self,
        backend: str,
        path: str,
        body: bytes,
        request_id: str,
        stream: bool,
        on_stream_end: StreamEnd,
    ) -> Response:
        started = time.perf_counter()
        headers = {"content-type": "application/json", "x-request-id": request_id}
        try:
            upstream = await self._upstreams[backend].post(path, body, headers)
        except BackendError as exc:
            raise self._failed(backend, exc) from exc
        if stream and upstream.status == 200:
            return self._stream(backend, upstream, request_id, started, on_stream_end)
        try:
            content = await upstream.read()
        except BackendError as exc:
            raise self._failed(backend, exc) from exc
        self._metrics.upstream_done(backend, time.perf_counter() - started)
        return self._whole(backend, upstream, content, request_id)

    def _whole(
        self, backend: str, upstream: UpstreamResponse, content: bytes, request_id: str
    ) -> Response:
        if upstream.status >= 500 and upstream.status != 503:
            self._metrics.upstream_error(backend, "status")
            raise UpstreamError(f"The upstream '{backend}' answered HTTP {upstream.status}.")
        return Response(content, upstream.status, _relayed_headers(upstream.headers, request_id))

    def _stream(
        self,
        backend: str,
        upstream: UpstreamResponse,
        request_id: str,
        started: float,
        on_stream_end: StreamEnd,
    ) -> Response:
        outcome: list[Outcome] = []

        async def close() -> None:
            upstream.close()
            self._metrics.upstream_done(backend, time.perf_counter() - started)
            result = outcome[0] if outcome else Outcome(499, "client_disconnected")
            on_stream_end(result.status, result.error)

        events = self._events(backend, upstream, outcome)
        headers = _relayed_headers(upstream.headers, request_id)
        headers["cache-control"] = "no-cache"
        return RelayedStream(events, close, headers=headers)

    async def _events(
        self, backend: str, upstream: UpstreamResponse, outcome: list[Outcome]
    ) -> AsyncIterator[bytes]:
        pending = b""
        saw_done = False
        try:
            async for chunk in upstream.chunks():
                pending += chunk
                cut = _event_boundary(pending)
                if cut:
                    ready, pending = pending[:cut], pending[cut:]
                    saw_done = saw_done or _DONE in ready
                    yield ready
        except BackendError as exc:
            failure = self._failed(backend, exc)
            outcome.append(Outcome(failure.status, failure.code))
            yield _error_event(failure)
            return
        saw_done = saw_done or _DONE in pending
        if pending:
            yield pending if pending.endswith(b"\n\n") else pending + b"\n\n"
        if saw_done:
            outcome.append(Outcome(200, None))
            return
        failure = UpstreamError(f"The upstream '{backend}' ended the stream before [DONE].")
        self._metrics.upstream_error(backend, "truncated")
        outcome.append(Outcome(502, failure.code))
        yield _error_event(failure)

    def _failed(self, backend: str, exc: BackendError) -> GatewayError:
        if isinstance(exc, UpstreamTimeoutError):
            self._metrics.upstream_error(backend, "timeout")
            return UpstreamTimeout(f"The upstream '{backend}' did not answer in time.")
        self._metrics.upstream_error(backend, type(exc).__name__)
        return UpstreamError(f"The upstream '{backend}' failed: {exc}.")


class RelayedStream(StreamingResponse):
    """A stream whose clean-up runs however it ends: done, upstream failure, or disconnect
    (even one that comes before the first chunk, when the body iterator never starts)."""

    def __init__(
        self,
        content: AsyncIterator[bytes],
        on_close: Callable[[], Awaitable[None]],
        headers: dict[str, str],
    ) -> None:
        super().__init__(content, 200, headers, media_type="text/event-stream")
        self._on_close = on_close

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            await self._on_close()


def _event_boundary(data: bytes) -> int:
    """Length of the prefix of `data` made of complete SSE events (0 if none)."""
    lf = data.rfind(b"\n\n")
    crlf = data.rfind(b"\r\n\r\n")
    return max(lf + 2 if lf >= 0 else 0, crlf + 4 if crlf >= 0 else 0)


def _error_event(error: GatewayError) -> bytes:
    return b"data: " + error_body(error.message, error.type, None, error.code) + b"\n\n"


def _relayed_headers(upstream: Mapping[str, str], request_id: str) -> dict[str, str]:
    headers = {"x-request-id": request_id}
    for name, value in upstream.items():
        lower = name.lower()
        if lower in _RELAYED_HEADERS or lower.startswith(_RELAYED_PREFIXES):
            headers[lower] = value
    return headers
