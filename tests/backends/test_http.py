"""HttpUpstream.fetch against real aiohttp servers on loopback ports: body, status, timeout,
refused connection, one pooled connection (closed once idle past `idle_s`), and the API key
kept to the upstream's origin."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator

import pytest
from aiohttp import web

from backends.errors import UpstreamConnectError, UpstreamTimeoutError
from bench.processes import free_port
from gateway.backend_settings import Timeouts
from tests.support.aiohttp_server import opened, served

BIG = b"x" * 200_000 + b"\n"  # larger than one socket read: the body must come whole


@contextlib.asynccontextmanager
async def server() -> AsyncIterator[str]:
    """Root URL of a server: /big, /slow, /who (the caller's port and Authorization)."""

    async def big(request: web.Request) -> web.Response:
        return web.Response(body=BIG)

    async def slow(request: web.Request) -> web.Response:
        await asyncio.sleep(5)
        return web.Response(body=b"late")

    async def who(request: web.Request) -> web.Response:
        peer = request.transport.get_extra_info("peername") if request.transport else None
        auth = request.headers.get("Authorization", "-")
        return web.Response(text=f"{peer[1] if peer else '?'} {auth}")

    app = web.Application()
    app.router.add_get("/big", big)
    app.router.add_get("/slow", slow)
    app.router.add_get("/v1/who", who)
    app.router.add_get("/who", who)
    async with served(app) as root:
        yield root


async def test_fetch_answers_the_status_and_the_whole_body() -> None:
    async with server() as root, opened(root + "/v1") as upstream:
        assert await upstream.fetch(root + "/big", 5.0) == (200, BIG)
        status, body = await upstream.fetch(root + "/nothing", 5.0)
        assert status == 404
        assert body  # aiohttp's own error page, read like any body


async def test_a_path_is_under_the_base_url_and_the_connection_is_pooled() -> None:
    async with server() as root, opened(root + "/v1") as upstream:
        first = await upstream.fetch("/who", 5.0)
        second = await upstream.fetch(root + "/who", 5.0)
        assert first[0] == second[0] == 200
        # /v1/who answered the first: one connection, the same client port, for both
        assert first[1].split()[0] == second[1].split()[0]


async def test_a_connection_idle_past_idle_s_is_not_reused() -> None:
    """The gateway closes a pooled connection before the server would (`timeouts.idle_s`):
    one reused as the server closes it fails its request."""
    async with server() as root, opened(root, idle_s=0.3) as upstream:
        first = (await upstream.fetch("/who", 5.0))[1].split()[0]
        await asyncio.sleep(0.1)
        second = (await upstream.fetch("/who", 5.0))[1].split()[0]
        await asyncio.sleep(0.6)
        third = (await upstream.fetch("/who", 5.0))[1].split()[0]
    assert first == second  # idle under idle_s: the same connection
    assert third != second  # idle past it: a new one


def test_the_default_idle_time_is_under_uvicorns_keep_alive() -> None:
    # vLLM and SGLang serve with uvicorn, whose idle connections close at 5 s.
    assert Timeouts().idle_s < 5


async def test_a_fetch_past_its_timeout_raises_the_upstreams_timeout_error() -> None:
    async with server() as root, opened(root) as upstream:
        started = time.monotonic()
        with pytest.raises(UpstreamTimeoutError):
            await upstream.fetch("/slow", 0.2)
        assert time.monotonic() - started < 2
        assert (await upstream.fetch("/big", 5.0))[0] == 200  # the upstream still works


async def test_a_refused_connection_raises_the_upstreams_connect_error() -> None:
    async with opened(f"http://127.0.0.1:{free_port()}/v1") as upstream:
        with pytest.raises(UpstreamConnectError):
            await upstream.fetch("/metrics", 2.0)


async def test_the_api_key_goes_to_the_upstreams_own_origin_only() -> None:
    key = "sk-test-origin-0123456789"
    async with server() as root, server() as elsewhere, opened(root + "/v1", key) as upstream:
        own = (await upstream.fetch(root + "/who", 5.0))[1].decode()
        relative = (await upstream.fetch("/who", 5.0))[1].decode()
        other = (await upstream.fetch(elsewhere + "/who", 5.0))[1].decode()
    assert own.endswith(" Bearer sk-test-origin-0123456789")
    assert relative.endswith(" Bearer sk-test-origin-0123456789")
    assert other.endswith(" -")
