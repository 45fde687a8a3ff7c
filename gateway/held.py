"""Streamed requests held for a start (or a wake): SSE keep-alives, then the stream.

A request for a backend with no ready replica waits while one starts: a minute or more
for a large model. A streamed request's client reads nothing meanwhile, and clients and
proxies give up on a connection that stays silent that long (an SDK's read timeout, a
load balancer's idle timeout). So `HeldStream` sends an SSE comment line every
`interval_s` while the request waits, which SSE clients skip by the spec, and then the
stream itself:

    : waiting for model, 3 s
    : waiting for model, 6 s
    data: {"id": ..., "choices": [...]}
    ...
    data: [DONE]

Its status line (200, `text/event-stream`) goes out with the first keep-alive, so an
answer ready before that one is due (a refusal with 503 and `Retry-After`, a quick wake)
goes out as it is, status and headers included. After it the status cannot change: a
failure (the start failed, the deadline passed, the upstream refused) becomes a final
`data: {"error": ...}` event, as when an upstream breaks off a stream (gateway/relay.py),
which the `openai` SDK raises as `APIError`; the answer's own headers are not sent.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping

import anyio
import orjson
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import Message, Receive, Scope, Send

from gateway.disconnect import unless_disconnected
from gateway.errors import ClientGone, UpstreamError
from gateway.lifecycle import Exchange
from gateway.relay import CLIENT_GONE, Ending, RelayedStream, error_event

Answer = Callable[[], Awaitable[Response]]  # acquire, forward, relay: the real answer
_STREAM_HEADERS = {
    "cache-control": "no-cache",
    "x-accel-buffering": "no",  # nginx would hold the keep-alives back in its buffer
}


class HeldStream(Response):
    """The response to a streamed request held for a start; ends its exchange itself."""

    media_type = "text/event-stream"

    def __init__(
        self, answer: Answer, exchange: Exchange, headers: Mapping[str, str], interval_s: float
    ) -> None:
        self.status_code = 200
        self.background = None
        self.init_headers({**headers, **_STREAM_HEADERS, "x-request-id": exchange.request_id})
        self._answer = answer
        self._exchange = exchange
        self._interval_s = interval_s
        self._started = False  # the status line went out

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            outcome = await unless_disconnected(Request(scope, receive), self._hold(send))
        except ClientGone:
            await self._exchange.end(CLIENT_GONE)
            return
        except BaseException:  # cancelled (shutdown), or the connection failed under it
            await self._exchange.end(CLIENT_GONE)
            raise
        if isinstance(outcome, Exception):
            await self._failed(outcome, scope, receive, send)
            return
        try:
            if not self._started:
                await outcome(scope, receive, send)  # as if never held
            elif isinstance(outcome, RelayedStream):
                await outcome(scope, receive, _without_start(send))
            else:  # the upstream's own answer (a 4xx, say): its body as the closing event
                await self._last(send, _closing_event(outcome))
        finally:  # a relayed stream has ended the exchange; a whole answer ends it here
            ending = self._exchange.ending or Ending(outcome.status_code, None)
            await self._exchange.end(ending)

    async def _hold(self, send: Send) -> Response | Exception:
        """The answer (or the error it raised), with keep-alives while it is made."""
        outcome: list[Response | Exception] = []
        done = anyio.Event()

        async def answer() -> None:
            try:
                outcome.append(await self._answer())
            except Exception as exc:  # answered below, as the client will see it
                outcome.append(exc)
            finally:
                done.set()

        async with anyio.create_task_group() as group:
            group.start_soon(answer)
            while not done.is_set():
                with anyio.move_on_after(self._interval_s):
                    await done.wait()
                if not done.is_set():
                    await self._keep_alive(send)
        return outcome[0]

    async def _keep_alive(self, send: Send) -> None:
        if not self._started:
            self._started = True
            await send({"type": "http.response.start", "status": 200, "headers": self.raw_headers})
        waited = round(self._exchange.elapsed_s())
        line = f": waiting for model, {waited} s\n\n".encode()
        await send({"type": "http.response.body", "body": line, "more_body": True})

    async def _failed(self, exc: Exception, scope: Scope, receive: Receive, send: Send) -> None:
        error = await self._exchange.fail(exc)
        if self._started:
            await self._last(send, error_event(error))
        else:
            await error.to_response(self._exchange.request_id)(scope, receive, send)

    @staticmethod
    async def _last(send: Send, event: bytes) -> None:
        await send({"type": "http.response.body", "body": event, "more_body": False})


def _without_start(send: Send) -> Send:
    """`send` for a response whose status line went out already (with the keep-alives)."""

    async def body_only(message: Message) -> None:
        if message["type"] != "http.response.start":
            await send(message)

    return body_only


def _closing_event(answer: Response) -> bytes:
    """A whole answer as a stream's closing event: OpenAI's error JSON as it came (on one
    line, as an SSE data line must be), anything else as an upstream error."""
    try:
        parsed = orjson.loads(answer.body)
    except orjson.JSONDecodeError:
        parsed = None
    if isinstance(parsed, dict) and isinstance(parsed.get("error"), dict):
        return b"data: " + orjson.dumps(parsed) + b"\n\n"
    return error_event(UpstreamError(f"The upstream answered HTTP {answer.status_code}."))
