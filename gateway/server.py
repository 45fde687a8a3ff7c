"""Runs the app under uvicorn (uvloop + httptools), with graceful shutdown."""

from __future__ import annotations

import asyncio
import gc
import signal
import socket
import sys
from types import FrameType
from typing import TYPE_CHECKING, Any

import uvicorn
from starlette.types import ASGIApp, Receive, Scope, Send
from uvicorn.protocols.http.flow_control import service_unavailable
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol, RequestResponseCycle

from common.redis_client import redacted_url
from gateway.accesslog import configure_logging
from gateway.body import BODY_RECEIVED
from gateway.disconnect import SERVER_CANCELS, cancel_on_disconnect
from gateway.errors import error_body, request_id

if TYPE_CHECKING:
    from gateway.settings import Settings


def serve(settings: Settings, host: str, port: int, source: str = "") -> int:
    """Serves until SIGTERM or Ctrl-C; `source` names the config file, for the one line
    that says the gateway is serving."""
    from gateway.app import create_app  # here: the bench's skeleton imports only the config

    configure_logging(settings.log_level)
    limits = settings.limits
    config = uvicorn_config(
        create_app(settings),
        host,
        port,
        max_head_bytes=limits.max_header_bytes,
        max_connections=limits.max_connections,
        keep_alive_s=limits.keep_alive_s,
    )
    server = FreezingServer(config)
    server.banner = serving_line(settings, host, port, source)
    # uvicorn drains on SIGTERM, restores this handler and raises the signal again: a
    # gateway that drained cleanly exits 0.
    signal.signal(signal.SIGTERM, _exit_after_drain)
    server.run()
    return 0 if server.started else 1


def serving_line(settings: Settings, host: str, port: int, source: str) -> str:
    """One line for a person: where it serves, from which config, to which backends, and
    where its state lives (never a key or a credential: URLs of Redis lose their password)."""
    backends = "; ".join(f"{b.name} [{', '.join(b.models)}]" for b in settings.backends)
    state = settings.state
    where = f"memory, {state.path}" if state.url == "memory" else redacted_url(state.url)
    config = f"config {source}; " if source else ""
    return (
        f"gateway: serving http://{host}:{port}/v1 ({config}backends: {backends}; state: {where})"
    )


class FreezingServer(uvicorn.Server):
    """Once the app's lifespan has built everything, moves what exists then (objects that
    live as long as the process) out of every garbage-collection pass, and makes the
    collector run less often: requests allocate many short-lived objects. Then says, in
    one line, that it is serving (`banner`)."""

    banner = ""

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        gc.collect()
        gc.freeze()
        gc.set_threshold(20_000, 20, 20)
        if self.banner and self.started:
            print(self.banner, file=sys.stderr, flush=True)


# Defaults of `limits.max_header_bytes`, `limits.max_connections` and
# `limits.keep_alive_s` (gateway/settings.py).
MAX_HEAD_BYTES = 64 * 1024
MAX_CONNECTIONS = 8192
KEEP_ALIVE_S = 75


def uvicorn_config(
    app: ASGIApp,
    host: str,
    port: int,
    *,
    max_head_bytes: int = MAX_HEAD_BYTES,
    max_connections: int = MAX_CONNECTIONS,
    keep_alive_s: int = KEEP_ALIVE_S,
) -> uvicorn.Config:
    """The gateway's uvicorn settings (bench/skeleton_proxy.py serves its baseline with them)."""
    protocol = type(
        "GatewayProtocol",
        (HeadersDeadlineProtocol,),
        {"max_head_bytes": max_head_bytes, "max_connections": max_connections},
    )
    return uvicorn.Config(
        app,
        host=host,
        port=port,
        loop="uvloop",
        http=protocol,
        # uvicorn answers 503 once this many connections are open, the asking one counted:
        # one more, so that `max_connections` are served.
        limit_concurrency=max_connections + 1,
        timeout_keep_alive=keep_alive_s,
        lifespan="on",
        access_log=False,  # the gateway writes its own access line, without secrets
        proxy_headers=False,  # client addresses are not used; skip the per-request rewrite
        server_header=False,
        log_level="warning",
        timeout_graceful_shutdown=10,
        backlog=2048,
    )


# How long a client may take to send a request's headers (nginx allows 60 s, Apache 20 to
# 40 s). uvicorn has no such limit: a client dribbling its headers a byte at a time
# (slowloris) would hold a connection and a descriptor for as long as it liked.
HEADERS_TIMEOUT_S = 10.0


# After a 431, how long the rest of what the client sends is read and dropped before the
# connection closes: closing with unread data would reset it, and the client would see a
# broken connection instead of the answer (nginx's lingering close).
LINGER_S = 2.0


class HeadersDeadlineProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol, closing connections whose headers do not arrive in
    time (idle connections between requests are uvicorn's keep-alive timeout's),
    answering 431 to a request line and headers over `max_head_bytes` (as they arrive,
    before any of it reaches the app), cancelling a request whose client left before its
    answer began (`gateway.disconnect`), saying in the scope when a request's whole body
    has arrived (`BODY_RECEIVED`: reading it then needs no timeout, `gateway.body`), and
    closing the connection idle longest when a new one would pass `max_connections`."""

    max_head_bytes = MAX_HEAD_BYTES
    max_connections = MAX_CONNECTIONS
    _headers_timer: asyncio.TimerHandle | None = None
    # The request line and headers of the request being read: as parsed (httptools hands
    # a header over only once it is whole), and as received (a header that never ends).
    _head_bytes = 0
    _raw_head_bytes = 0
    _reading_head = True
    _heads_read = 0
    _refused = False

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        if len(self.connections) > self.max_connections:
            _close_longest_idle(self.connections)
        self._arm()

    def data_received(self, data: bytes) -> None:
        if self._refused:
            return  # lingering: dropped
        reading, heads_read = self._reading_head, self._heads_read
        super().data_received(data)
        if reading and self._heads_read == heads_read and not self._refused:
            # A head was being read before and after: all of it belongs to that head.
            self._raw_head_bytes += len(data)
            if self._raw_head_bytes > self.max_head_bytes:
                self._refuse_head()

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._head_bytes = 0
        self._arm()

    def on_url(self, url: bytes) -> None:
        self._count_head(len(url))
        super().on_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        self._count_head(len(name) + len(value) + 4)  # ": " and CRLF
        if not self._refused:
            super().on_header(name, value)

    def on_headers_complete(self) -> None:
        self._disarm()
        self._reading_head, self._raw_head_bytes = False, 0
        self._heads_read += 1
        if self._refused:
            return  # answered 431: no request for the app
        super().on_headers_complete()
        self._mark(SERVER_CANCELS)  # no watcher task per request needed

    def on_body(self, body: bytes) -> None:
        if not self._refused:
            super().on_body(body)

    def on_message_complete(self) -> None:
        self._reading_head = True
        if self._refused:
            return
        super().on_message_complete()
        self._mark(BODY_RECEIVED)

    def _count_head(self, size: int) -> None:
        self._head_bytes += size
        if self._head_bytes > self.max_head_bytes and not self._refused:
            self._refuse_head()

    def _refuse_head(self) -> None:
        """431 in the API's error JSON, then the connection closes (after a linger)."""
        self._refused = True
        self._disarm()
        if self.cycle is not None and not self.cycle.response_complete:
            self.transport.close()  # an answer is being written here: no room for this one
            return
        message = f"The request line and headers are larger than {self.max_head_bytes} bytes."
        body = error_body(message, "invalid_request_error", None, "request_headers_too_large")
        self.transport.write(_HEAD_TOO_LARGE % len(body) + body)
        if self.transport.can_write_eof():
            self.transport.write_eof()
        self.loop.call_later(LINGER_S, self.transport.close)

    def _start_asgi_task(self, cycle: RequestResponseCycle, app: Any) -> None:
        # Past `limits.max_connections` uvicorn answers with its own plain-text 503: the
        # API's error JSON instead.
        if app is service_unavailable:
            app = _too_many_connections
        super()._start_asgi_task(cycle, app)

    def _mark(self, flag: str) -> None:
        """Sets `flag` in the scope of the request being parsed, for the app to read."""
        if self.cycle is not None:
            scope: dict[str, Any] = self.cycle.scope  # type: ignore[assignment]
            scope[flag] = True

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        cycle = self.cycle
        super().connection_lost(exc)
        if cycle is not None and not cycle.response_complete:
            # The answer being made, or a stream being relayed (each registers its task).
            cancel_on_disconnect(cycle.scope)  # type: ignore[arg-type]

    def _arm(self) -> None:
        self._disarm()
        self._headers_timer = self.loop.call_later(HEADERS_TIMEOUT_S, self._headers_too_slow)

    def _disarm(self) -> None:
        if self._headers_timer is not None:
            self._headers_timer.cancel()
            self._headers_timer = None

    def _headers_too_slow(self) -> None:
        if not self.transport.is_closing():
            self.transport.close()


def _close_longest_idle(connections: set[Any]) -> None:
    """Closes the connection waiting longest for its next request, if one is, so that a
    new client is served rather than answered 503: kept-alive connections then cost new
    clients nothing, however long `limits.keep_alive_s` (nginx does the same). Taken out of
    the count at once: uvicorn counts connections again when the new one's request
    arrives, which may come before this one's close is seen."""
    # (A connection upgraded to a WebSocket has no keep-alive timer: never idle here.)
    idle = [c for c in connections if getattr(c, "timeout_keep_alive_task", None) is not None]
    if idle:
        oldest = min(idle, key=lambda c: c.timeout_keep_alive_task.when())
        oldest.timeout_keep_alive_handler()
        connections.discard(oldest)


_HEAD_TOO_LARGE = (
    b"HTTP/1.1 431 Request Header Fields Too Large\r\ncontent-type: application/json\r\n"
    b"content-length: %d\r\nconnection: close\r\n\r\n"
)


_TOO_MANY_CONNECTIONS = error_body(
    "The gateway has as many connections open as it serves (limits.max_connections); "
    "try again shortly.",
    "service_unavailable",
    None,
    "too_many_connections",
)


async def _too_many_connections(scope: Scope, receive: Receive, send: Send) -> None:
    """uvicorn's 503 at its concurrency limit, in the API's error JSON."""
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", b"%d" % len(_TOO_MANY_CONNECTIONS)),
        (b"retry-after", b"1"),
        (b"x-request-id", request_id().encode()),
        (b"connection", b"close"),
    ]
    await send({"type": "http.response.start", "status": 503, "headers": headers})
    await send({"type": "http.response.body", "body": _TOO_MANY_CONNECTIONS})


def _exit_after_drain(signum: int, frame: FrameType | None) -> None:
    sys.exit(0)
