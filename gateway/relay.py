"""Relays one upstream answer back to the client: whole, or as SSE event by event.

Streams are relayed in complete SSE events, so that if the upstream breaks off, the
client receives a well-formed `data: {"error": ...}` event rather than half an event.
An upstream that answers 200 with a body (or an event) that is not JSON gets the same
treatment as one that breaks off: 502, never its garbage relayed as an answer.
`Finish` hooks run once when the answer is over, however it ended (done, failed, client
gone), with the status and the body or stream it carried. A `Shared` stream is one that
identical requests read too (gateway/coalesce.py): the upstream may then outlive this
client, and is closed only once no one reads it.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Protocol

import orjson
from starlette.responses import Response, StreamingResponse
from starlette.types import Receive, Scope, Send

from backends.errors import BackendError
from backends.http import UpstreamResponse
from cache.sse import event_data, split_events
from gateway.disconnect import SERVER_CANCELS, cancelled_by_server
from gateway.errors import ClientGone, DeadlineExceeded, GatewayError, UpstreamError, error_body
from gateway.metrics import Metrics
from gateway.traffic.forward import translate
from gateway.upstream_body import without_usage_chunks
from gateway.usage import TokenUsage, usage_in

# Relayed from the upstream's answer; everything else (hop-by-hop, cookies, server) is not.
# Nor its `x-ratelimit-*`: they are the upstream account's limits, not the tenant's (the
# gateway's own quota headers, gateway/tenancy/quotas.py), which they would override.
_RELAYED_HEADERS = ("content-type", "retry-after", "openai-processing-ms")


@dataclass(frozen=True)
class Ending:
    """How an answer ended. `body` is the whole answer (non-streamed, or None)."""

    status: int
    error: str | None
    body: bytes | None = None
    usage: TokenUsage | None = None  # what the answer says it used, when read already


# The client went away before its answer ended: recorded as ClientGone's 499, never sent.
CLIENT_GONE = Ending(ClientGone.status, ClientGone.code)

Finish = Callable[[Ending], Awaitable[None]]
# How a stream's end shows: OpenAI's `data: [DONE]`, or the `message_stop` event of an
# Anthropic stream (a Messages request passed through).
ANTHROPIC_END = b"event: message_stop"
Tap = Callable[[bytes], None]  # sees every relayed piece of a stream, in order


class Shared(Protocol):
    """A stream that identical requests read too (gateway/coalesce.py)."""

    def relay(self, events: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
        """The events the client gets: `events`, recorded (and read by another task once
        others read them too: so the upstream may outlive this client)."""
        ...

    async def done(self) -> None:
        """This client's stream is over; returns once no one reads the upstream any more."""
        ...


async def whole(
    backend: str, upstream: UpstreamResponse, request_id: str, metrics: Metrics
) -> tuple[Response, Ending]:
    """The answer as a response, and how it ended (its body, and its usage when the body
    was parsed to check it)."""
    try:
        content = await upstream.read()
    except BackendError as exc:
        raise translate(backend, exc, metrics) from exc
    if upstream.status >= 500 and upstream.status != 503:
        metrics.upstream_error(backend, "status")
        raise UpstreamError(f"The upstream '{backend}' answered HTTP {upstream.status}.")
    usage = None
    if upstream.status == 200 and "json" in upstream.headers.get("content-type", "").lower():
        try:
            usage = usage_in(orjson.loads(content))
        except orjson.JSONDecodeError as exc:
            metrics.upstream_error(backend, "malformed")
            message = f"The upstream '{backend}' answered 200 with a body that is not JSON."
            raise UpstreamError(message) from exc
    response = Response(content, upstream.status, relayed_headers(upstream.headers, request_id))
    return response, Ending(upstream.status, None, content, usage)


def stream(
    backend: str,
    upstream: UpstreamResponse,
    request_id: str,
    metrics: Metrics,
    tap: Tap | None,
    finish: Finish,
    shared: Shared | None = None,
    strip_usage: bool = False,
    cut_at: float | None = None,
) -> Response:
    """`strip_usage`: the gateway asked for the usage chunk, the client did not: its tap
    sees it (quotas), the client does not. `cut_at` (monotonic): the client's deadline for
    the whole answer (`Deadline.stream_cut`); a stream still flowing then ends with a
    `deadline_exceeded` event, and the upstream is closed as if the client had left."""
    ended: list[Ending] = []

    async def close() -> None:
        if shared is not None:
            await shared.done()
        upstream.close()
        await finish(ended[0] if ended else CLIENT_GONE)

    events = _events(backend, upstream, metrics, tap, ended, strip_usage)
    if shared is not None:
        events = shared.relay(events)
    if cut_at is not None:
        events = until(events, cut_at, ended)
    headers = relayed_headers(upstream.headers, request_id)
    headers["cache-control"] = "no-cache"
    return RelayedStream(events, close, headers=headers)


async def _events(
    backend: str,
    upstream: UpstreamResponse,
    metrics: Metrics,
    tap: Tap | None,
    ended: list[Ending],
    strip_usage: bool = False,
) -> AsyncIterator[bytes]:
    pending = b""
    saw_done = False
    try:
        async for chunk in upstream.chunks():
            pending += chunk
            cut = _event_boundary(pending)
            if cut:
                ready, pending = pending[:cut], pending[cut:]
                malformed, done = _scan_events(ready)
                if malformed:
                    yield _malformed_end(backend, metrics, ended)
                    return
                saw_done = saw_done or done
                if tap is not None:
                    tap(ready)
                if strip_usage:
                    ready = without_usage_chunks(ready)
                if ready:
                    yield ready
    except BackendError as exc:
        failure = translate(backend, exc, metrics)
        ended.append(Ending(failure.status, failure.code))
        yield error_event(failure)
        return
    malformed, done = _scan_events(pending + b"\n\n")  # the last event, if unterminated
    if malformed:  # half an event: the upstream stopped mid-write
        yield _malformed_end(backend, metrics, ended)
        return
    saw_done = saw_done or done
    if pending:
        rest = pending if pending.endswith(b"\n\n") else pending + b"\n\n"
        if tap is not None:
            tap(rest)
        if strip_usage:
            rest = without_usage_chunks(rest)
        if rest:
            yield rest
    if saw_done:
        ended.append(Ending(200, None))
        return
    failure = UpstreamError(
        f"The upstream '{backend}' ended the stream before [DONE] (Messages: message_stop)."
    )
    metrics.upstream_error(backend, "truncated")
    ended.append(Ending(502, failure.code))
    yield error_event(failure)


async def until(
    events: AsyncIterator[bytes], cut_at: float, ended: list[Ending]
) -> AsyncIterator[bytes]:
    """`events` until `cut_at` (monotonic), then a `deadline_exceeded` event, its ending
    in `ended`. The wait for the next piece is cancelled as a client leaving cancels it,
    so the stream's close hook ends the upstream (or leaves a shared one to those still
    reading it)."""
    pieces = aiter(events)
    while True:
        try:
            async with asyncio.timeout(max(0.0, cut_at - time.monotonic())):
                piece = await anext(pieces)
        except StopAsyncIteration:
            return
        except TimeoutError:
            break
        yield piece
    failure = DeadlineExceeded(
        "The request's deadline (x-request-timeout) passed before its stream ended; "
        "the answer is cut here."
    )
    ended[:] = [Ending(failure.status, failure.code)]
    yield error_event(failure)


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
            if scope.get(SERVER_CANCELS):
                await self._stream_until_cancelled(scope, send)
            else:  # Starlette's: a second task listens for the disconnect
                await super().__call__(scope, receive, send)
        finally:
            await self._on_close()

    async def _stream_until_cancelled(self, scope: Scope, send: Send) -> None:
        """Under the gateway's own server, which cancels this task when the client leaves
        (gateway/disconnect.py): no listener task per stream."""
        with contextlib.suppress(ClientGone):  # the close hook records it (499)
            await cancelled_by_server(scope, self.stream_response(send))


def _event_boundary(data: bytes) -> int:
    """Length of the prefix of `data` made of complete SSE events (0 if none)."""
    lf = data.rfind(b"\n\n")
    crlf = data.rfind(b"\r\n\r\n")
    return max(lf + 2 if lf >= 0 else 0, crlf + 4 if crlf >= 0 else 0)


def _malformed_end(backend: str, metrics: Metrics, ended: list[Ending]) -> bytes:
    failure = UpstreamError(f"The upstream '{backend}' sent a stream event that is not JSON.")
    metrics.upstream_error(backend, "malformed")
    ended.append(Ending(502, failure.code))
    return error_event(failure)


def _scan_events(events: bytes) -> tuple[bool, bool]:
    """(malformed, done) of complete SSE events: is an event's data neither `[DONE]` nor
    JSON; is one of them the stream's end (`[DONE]` itself, not text that merely contains
    it, or Anthropic's `message_stop`)?
    An event's data may span several `data:` lines (the SSE spec joins them)."""
    done = False
    for event in split_events(events)[0]:
        data = event_data(event)
        if data is None or not data.strip():
            continue
        if data.strip() == b"[DONE]" or event.startswith(ANTHROPIC_END):
            done = True
            continue
        try:
            orjson.loads(data)
        except orjson.JSONDecodeError:
            return True, done
    return False, done


def error_event(error: GatewayError) -> bytes:
    return b"data: " + error_body(error.message, error.type, None, error.code) + b"\n\n"


def relayed_headers(upstream: Mapping[str, str], request_id: str) -> dict[str, str]:
    headers = {"x-request-id": request_id}
    for name, value in upstream.items():
        lower = name.lower()
        if lower in _RELAYED_HEADERS:
            headers[lower] = value
    return headers
