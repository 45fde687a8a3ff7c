"""A small HTTP proxy in front of moto that misbehaves on request, and counts what it relays.

Faults apply to object reads only (GETs with a Range header), never to listings:

    fail_gets       the next N reads answer 500 InternalError
    stall_gets      the next N reads send the headers and a little of the body, then stall
    truncate_gets   the next N reads send half the body, then drop the connection
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter
from dataclasses import dataclass, field

import aiohttp
from aiohttp import web

_HOP_BY_HOP = {
    "host",
    "connection",
    "keep-alive",
    "transfer-encoding",
    "content-length",
    "content-encoding",
}
_S3_500 = (
    b'<?xml version="1.0" encoding="UTF-8"?><Error><Code>InternalError</Code>'
    b"<Message>We encountered an internal error. Please try again.</Message></Error>"
)


@dataclass
class Relayed:
    path: str
    range: str | None
    status: int
    body_bytes: int


@dataclass
class FaultProxy:
    upstream: str
    fail_gets: int = 0
    stall_gets: int = 0
    stall_s: float = 2.0
    truncate_gets: int = 0
    log: list[Relayed] = field(default_factory=list)
    url: str = ""
    _runner: web.AppRunner | None = None
    _session: aiohttp.ClientSession | None = None
    _active: int = 0

    async def start(self) -> FaultProxy:
        self._session = aiohttp.ClientSession(auto_decompress=False)
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        port = self._runner.addresses[0][1]
        self.url = f"http://127.0.0.1:{port}"
        return self

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
        if self._session is not None:
            await self._session.close()

    async def reset(self) -> None:
        """Forget what was relayed, once requests of cancelled clients have finished too."""
        while self._active:
            await asyncio.sleep(0.01)
        self.log.clear()

    def bytes_for(self, path_part: str, exclude: str | None = None) -> int:
        """Body bytes of successful reads whose path contains `path_part`."""
        return sum(
            r.body_bytes
            for r in self.log
            if r.range and r.status < 300 and path_part in r.path
            if not (exclude and exclude in r.path)
        )

    def statuses(self) -> Counter[int]:
        return Counter(r.status for r in self.log if r.range)

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        self._active += 1
        try:
            return await self._relay(request)
        finally:
            self._active -= 1

    async def _relay(self, request: web.Request) -> web.StreamResponse:
        is_read = request.method == "GET" and "Range" in request.headers
        if is_read and self.fail_gets > 0:
            self.fail_gets -= 1
            self.log.append(Relayed(request.path, request.headers["Range"], 500, 0))
            return web.Response(status=500, body=_S3_500, content_type="application/xml")
        status, headers, body = await self._forward(request)
        self.log.append(Relayed(request.path, request.headers.get("Range"), status, len(body)))
        if is_read and self.stall_gets > 0:
            self.stall_gets -= 1
            return await self._send_broken(request, status, headers, body, stall=True)
        if is_read and self.truncate_gets > 0:
            self.truncate_gets -= 1
            return await self._send_broken(request, status, headers, body, stall=False)
        return web.Response(status=status, headers=headers, body=body)

    async def _forward(self, request: web.Request) -> tuple[int, dict[str, str], bytes]:
        assert self._session is not None
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _HOP_BY_HOP}
        async with self._session.request(
            request.method,
            self.upstream + request.path_qs,
            headers=headers,
            data=await request.read(),
            allow_redirects=False,
        ) as answer:
            body = await answer.read()
            kept = {k: v for k, v in answer.headers.items() if k.lower() not in _HOP_BY_HOP}
            return answer.status, kept, body

    async def _send_broken(
        self, request: web.Request, status: int, headers: dict[str, str], body: bytes, stall: bool
    ) -> web.StreamResponse:
        response = web.StreamResponse(status=status, headers=headers)
        response.content_length = len(body)
        await response.prepare(request)
        with contextlib.suppress(ConnectionError):
            await response.write(body[: len(body) // 2])
            if stall:
                await asyncio.sleep(self.stall_s)
        # Close mid-body: the client sees fewer bytes than Content-Length promised.
        if request.transport is not None:
            request.transport.close()
        return response
