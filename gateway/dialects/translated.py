"""A response of the chat pipeline, sent in another API's shape.

The pipeline answers a dialect's request (gateway/dialects/) as chat completions: a whole
JSON body (an answer or an error) or an SSE stream (chunks, an error event, `[DONE]`),
from whichever of its responses it chose (relayed, held for a start, replayed from the
cache, a coalesced leader's stream). `Translated` wraps that response at the ASGI level,
so every one of them is translated by the same code, and hands what it sends to a
`Translator`: a whole body once complete (its content-length recomputed), a stream's
complete events as they come.
"""

from __future__ import annotations

from typing import Any, Protocol

import orjson
from starlette.responses import Response
from starlette.types import Message, Receive, Scope, Send

from cache.sse import event_data, split_events

SSE = b"text/event-stream"


class Translator(Protocol):
    def whole(self, status: int, body: bytes) -> tuple[int, bytes]:
        """A whole body (an answer or an error JSON) in the dialect's shape, with its status
        (an answer the dialect cannot express becomes an error)."""
        ...

    def events(self, events: list[bytes]) -> bytes:
        """Complete chat SSE events (without their blank lines), as the dialect's events."""
        ...

    def end(self) -> bytes:
        """The stream is over: what the dialect still sends (nothing if it has ended)."""
        ...

    async def sent(self) -> None:
        """Called once the whole response has been sent (a dialect that stores it does)."""
        ...


class Translated(Response):
    def __init__(self, inner: Response, translator: Translator) -> None:
        # Not Response.__init__: this response sends nothing of its own.
        self.inner = inner
        self.translator = translator
        self.background = None
        self._start: Message | None = None
        self._streamed = False
        self._pending = b""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        async def relay(message: Message) -> None:
            if message["type"] == "http.response.start":
                await self._started(message, send)
            elif message["type"] == "http.response.body":
                await self._body(message, send)
            else:
                await send(message)

        await self.inner(scope, receive, relay)
        await self.translator.sent()

    async def _started(self, message: Message, send: Send) -> None:
        headers = dict(message.get("headers", []))
        self._streamed = headers.get(b"content-type", b"").startswith(SSE)
        if self._streamed:
            # A replayed stream (a cache hit) may state its length: the translation's differs.
            await send({**message, "headers": _without_length(message["headers"])})
        else:
            self._start = message  # sent with the translated body's length

    async def _body(self, message: Message, send: Send) -> None:
        self._pending += message.get("body", b"")
        more = bool(message.get("more_body", False))
        if self._streamed:
            events, self._pending = split_events(self._pending)
            out = self.translator.events(events)
            if not more:
                out += self.translator.end()
            await send({"type": "http.response.body", "body": out, "more_body": more})
            return
        if more:
            return
        assert self._start is not None
        status, body = self.translator.whole(self._start["status"], self._pending)
        headers = _with_length(self._start["headers"], len(body))
        await send({**self._start, "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body, "more_body": False})


def _with_length(headers: list[tuple[bytes, bytes]], length: int) -> list[tuple[bytes, bytes]]:
    return [*_without_length(headers), (b"content-length", str(length).encode())]


def _without_length(headers: list[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
    return [(k, v) for k, v in headers if k.lower() != b"content-length"]


def sse_event(kind: str, data: bytes) -> bytes:
    """One SSE event with a name, as both dialects send them."""
    return b"event: " + kind.encode() + b"\ndata: " + data + b"\n\n"


class ChatStream:
    """A chat stream's events, one at a time, as a dialect's: comments (keep-alives) pass
    on; the first chunk `start`s, each chunk's first choice is a `delta` (its `usage` kept);
    `[DONE]` is `done`, an error event `failed`; nothing follows either."""

    def __init__(self) -> None:
        self.started = False
        self.over = False
        self.usage: Any = None  # the chat usage chunk's, once it came

    def event(self, event: bytes) -> bytes:
        data = event_data(event)
        if data is None:
            return event + b"\n\n"
        if self.over:
            return b""
        if data.strip() == b"[DONE]":
            self.over = True
            return self.done()
        chunk = orjson.loads(data)
        if "error" in chunk:
            self.over = True
            error = chunk["error"]
            return self.failed(error if isinstance(error, dict) else {})
        out = b""
        if not self.started:
            self.started = True
            out += self.start(chunk)
        self.usage = chunk.get("usage") or self.usage
        for choice in chunk.get("choices") or []:
            if choice.get("index", 0) == 0:
                out += self.delta(choice)
        return out

    def start(self, chunk: dict[str, Any]) -> bytes:
        raise NotImplementedError

    def delta(self, choice: dict[str, Any]) -> bytes:
        raise NotImplementedError

    def done(self) -> bytes:
        raise NotImplementedError

    def failed(self, error: dict[str, Any]) -> bytes:
        raise NotImplementedError
