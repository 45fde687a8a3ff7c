"""In-process aiohttp servers on loopback ports, and an HttpUpstream opened on one, for tests
that need a real HTTP peer inside the test's own event loop."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

from aiohttp import web

from backends.http import HttpTimeouts, HttpUpstream


@contextlib.asynccontextmanager
async def served(app: web.Application, path: str = "") -> AsyncIterator[str]:
    """`app` on a free loopback port, for the block; yields its root URL plus `path`."""
    runner = web.AppRunner(app, shutdown_timeout=0.1)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    try:
        yield f"http://127.0.0.1:{runner.addresses[0][1]}{path}"
    finally:
        await runner.cleanup()


@contextlib.asynccontextmanager
async def opened(
    base_url: str, api_key: str | None = None, idle_s: float = HttpTimeouts.idle_s
) -> AsyncIterator[HttpUpstream]:
    """An open HttpUpstream on `base_url` (1 s to connect, 30 s to read, connections kept
    `idle_s` when idle, 4 connections)."""
    upstream = HttpUpstream(base_url, api_key, HttpTimeouts(1.0, 30.0, None, idle_s), 4)
    upstream.open()
    try:
        yield upstream
    finally:
        await upstream.close()
