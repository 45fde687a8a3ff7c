"""Static OpenAI-compatible upstreams over HTTP: one pooled keep-alive client per backend.

aiohttp rather than httpx: measured here (DESIGN.md) it costs about a tenth of httpx's
CPU per proxied request, which is most of the gateway's budget.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Mapping
from dataclasses import dataclass
from urllib.parse import urlsplit

import aiohttp

from backends.errors import UpstreamConnectError, UpstreamProtocolError, UpstreamTimeoutError


@dataclass(frozen=True)
class HttpTimeouts:
    connect_s: float
    read_s: float
    total_s: float | None
    idle_s: float = 4.0  # pooled connections idle longer are closed (`timeouts.idle_s`)


class UpstreamResponse:
    """An upstream answer whose headers have arrived; the body is read or streamed by the caller."""

    def __init__(self, response: aiohttp.ClientResponse) -> None:
        self._response = response
        self.status = response.status
        self.headers: Mapping[str, str] = response.headers
        self._first = b""  # read by `first_chunk`, yielded first by `chunks`

    async def read(self) -> bytes:
        try:
            return await self._response.read()
        except Exception as exc:
            raise _translate(exc) from exc
        finally:
            self._response.release()

    async def first_chunk(self) -> None:
        """Waits for the body's first bytes (or its end); `chunks` yields them first."""
        try:
            self._first = await self._response.content.readany()
        except Exception as exc:
            raise _translate(exc) from exc

    async def chunks(self) -> AsyncIterator[bytes]:
        if self._first:
            first, self._first = self._first, b""
            yield first
        try:
            async for chunk in self._response.content.iter_any():
                yield chunk
        except Exception as exc:
            raise _translate(exc) from exc

    def close(self) -> None:
        """Drops the connection: an unread body must not go back to the pool."""
        self._response.close()

    def release(self) -> None:
        self._response.release()


class HttpUpstream:
    def __init__(
        self,
        base_url: str,
        api_key: str | None,
        timeouts: HttpTimeouts,
        max_connections: int,
    ) -> None:
        self.base_url = base_url
        self._auth = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._timeouts = timeouts
        self._max_connections = max_connections
        self._session: aiohttp.ClientSession | None = None

    def open(self) -> None:
        """Creates the pooled session (needs a running event loop; does not wait)."""
        connector = aiohttp.TCPConnector(
            limit=self._max_connections,
            limit_per_host=0,
            keepalive_timeout=self._timeouts.idle_s,
        )
        timeout = aiohttp.ClientTimeout(
            total=self._timeouts.total_s,
            sock_connect=self._timeouts.connect_s,
            sock_read=self._timeouts.read_s,
        )
        # No Accept-Encoding: bodies are relayed as they come, never decompressed here.
        self._session = aiohttp.ClientSession(
            connector=connector,
            timeout=timeout,
            skip_auto_headers=("Accept-Encoding", "User-Agent"),
            auto_decompress=False,
            cookie_jar=aiohttp.DummyCookieJar(),
        )

    @property
    def closed(self) -> bool:
        return self._session is None or self._session.closed

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()

    async def post(self, path: str, body: bytes, headers: Mapping[str, str]) -> UpstreamResponse:
        try:
            response = await self._request("POST", self.base_url + path, body, headers)
        except Exception as exc:
            raise _translate(exc) from exc
        return UpstreamResponse(response)

    async def get(self, path: str, timeout_s: float) -> int:
        """Status of a GET, for health probes."""
        try:
            async with asyncio.timeout(timeout_s):
                response = await self._request("GET", self.base_url + path, None, {})
        except TimeoutError as exc:
            raise UpstreamTimeoutError("health probe timed out") from exc
        except Exception as exc:
            raise _translate(exc) from exc
        response.release()
        return response.status

    async def fetch(self, url: str, timeout_s: float) -> tuple[int, bytes]:
        """Status and body of a GET, whole, within `timeout_s` (engine metrics); `url` is a
        path under the base URL or an absolute URL. The API key goes only to the base URL's
        own scheme, host and port."""
        absolute = url.startswith(("http://", "https://"))
        target = url if absolute else self.base_url + url
        auth = not absolute or _origin(url) == _origin(self.base_url)
        try:
            async with asyncio.timeout(timeout_s):
                response = await self._request("GET", target, None, {}, auth)
                try:
                    return response.status, await response.read()
                finally:
                    response.release()
        except TimeoutError as exc:
            raise UpstreamTimeoutError("fetch timed out") from exc
        except Exception as exc:
            raise _translate(exc) from exc

    def _request(
        self,
        method: str,
        url: str,
        body: bytes | None,
        headers: Mapping[str, str],
        auth: bool = True,
    ) -> Awaitable[aiohttp.ClientResponse]:
        # Not a coroutine of its own: one await level less on every request's path.
        assert self._session is not None, "open() the upstream first"
        return self._session.request(
            method,
            url,
            data=body,
            headers={**headers, **self._auth} if auth else headers,
            allow_redirects=False,
        )


def _origin(url: str) -> tuple[str, str]:
    parts = urlsplit(url)
    return parts.scheme, parts.netloc


def _translate(exc: Exception) -> Exception:
    """Maps aiohttp's errors onto ours; never includes credentials (URLs carry none)."""
    if isinstance(exc, asyncio.TimeoutError | aiohttp.ServerTimeoutError):
        return UpstreamTimeoutError("upstream timed out")
    if isinstance(exc, aiohttp.ClientConnectorError | aiohttp.ServerDisconnectedError):
        return UpstreamConnectError(f"cannot reach upstream: {type(exc).__name__}")
    if isinstance(exc, aiohttp.ClientPayloadError | aiohttp.ClientResponseError):
        return UpstreamProtocolError(f"upstream answer broke off: {type(exc).__name__}")
    if isinstance(exc, aiohttp.ClientError | OSError):
        return UpstreamConnectError(f"upstream connection failed: {type(exc).__name__}")
    return exc


def server_root(base_url: str) -> str:
    """The server an OpenAI-style base URL is on, without its `/v1`: where engines serve
    their own endpoints (vLLM's /metrics, /sleep, /wake_up)."""
    return base_url.rstrip("/").removesuffix("/v1").rstrip("/")
