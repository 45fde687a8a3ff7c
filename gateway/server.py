"""Runs the app under uvicorn (uvloop + httptools), with graceful shutdown."""

from __future__ import annotations

import signal
import sys
from types import FrameType

import uvicorn

from gateway.accesslog import configure_logging
from gateway.app import create_app
from gateway.settings import Settings


def serve(settings: Settings, host: str, port: int) -> int:
    configure_logging(settings.log_level)
    config = uvicorn.Config(
        create_app(settings),
        host=host,
        port=port,
        loop="uvloop",
        http="httptools",
        lifespan="on",
        access_log=False,  # the gateway writes its own access line, without secrets
        proxy_headers=False,  # client addresses are not used; skip the per-request rewrite
        server_header=False,
        log_level="warning",
        timeout_graceful_shutdown=10,
        backlog=2048,
    )
    server = uvicorn.Server(config)
    # uvicorn drains on SIGTERM, restores this handler and raises the signal again: a
    # gateway that drained cleanly exits 0.
    signal.signal(signal.SIGTERM, _exit_after_drain)
    server.run()
    return 0 if server.started else 1


def _exit_after_drain(signum: int, frame: FrameType | None) -> None:
    sys.exit(0)
