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
from starlette.types import ASGIApp
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from gateway.accesslog import configure_logging
from gateway.body import BODY_RECEIVED
from gateway.disconnect import SERVER_CANCELS, cancel_on_disconnect

if TYPE_CHECKING:
    from gateway.settings import Settings


def serve(settings: Settings, host: str, port: int, source: str = "") -> int:
    """Serves until SIGTERM or Ctrl-C; `source` names the config file, for the one line
    that says the gateway is serving."""
    from gateway.app import create_app  # here: the bench's skeleton imports only the config

    configure_logging(settings.log_level)
    server = FreezingServer(uvicorn_config(create_app(settings), host, port))
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


def redacted_url(url: str) -> str:
    scheme, sep, rest = url.partition("://")
    _credentials, at, host = rest.rpartition("@")
    return f"{scheme}{sep}{host}" if at else url


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


def uvicorn_config(app: ASGIApp, host: str, port: int) -> uvicorn.Config:
    """The gateway's uvicorn settings (bench/skeleton_proxy.py serves its baseline with them)."""
    return uvicorn.Config(
        app,
        host=host,
        port=port,
        loop="uvloop",
        http=HeadersDeadlineProtocol,
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


class HeadersDeadlineProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol, closing connections whose headers do not arrive in
    time (idle connections between requests are uvicorn's keep-alive timeout's),
    cancelling a request whose client left before its answer began
    (`gateway.disconnect`), and saying in the scope when a request's whole body has
    arrived (`BODY_RECEIVED`: reading it then needs no timeout, `gateway.body`)."""

    _headers_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm()

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._arm()

    def on_headers_complete(self) -> None:
        self._disarm()
        super().on_headers_complete()
        self._mark(SERVER_CANCELS)  # no watcher task per request needed

    def on_message_complete(self) -> None:
        super().on_message_complete()
        self._mark(BODY_RECEIVED)

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


def _exit_after_drain(signum: int, frame: FrameType | None) -> None:
    sys.exit(0)
