"""Runs the app under uvicorn (uvloop + httptools), with graceful shutdown."""

from __future__ import annotations

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
        log_level="warning",
        timeout_graceful_shutdown=10,
        backlog=2048,
    )
    server = uvicorn.Server(config)
    server.run()
    return 0 if server.started else 1
