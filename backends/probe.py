"""Readiness probe: a GET that passes only on 200 (a server that is loading answers 503).
The one probe of a model server the gateway starts: by the process provider and by a
backend's `launch` (backends/launcher.py)."""

from __future__ import annotations

import aiohttp


class ReadinessProbe:
    def __init__(self, timeout_s: float) -> None:
        self._timeout = aiohttp.ClientTimeout(total=timeout_s)
        self._session: aiohttp.ClientSession | None = None

    async def open(self) -> None:
        # No keep-alive: each probe must reach the server as it is now, not a pooled socket.
        connector = aiohttp.TCPConnector(force_close=True)
        self._session = aiohttp.ClientSession(
            connector=connector, timeout=self._timeout, cookie_jar=aiohttp.DummyCookieJar()
        )

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def passes(self, url: str) -> bool:
        assert self._session is not None, "open() the probe first"
        try:
            async with self._session.get(url, allow_redirects=False) as response:
                return response.status == 200
        except (aiohttp.ClientError, TimeoutError, OSError):
            return False
