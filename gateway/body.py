"""Reading a request: its headers once (`header_map`), its body within the gateway's
limits of size (413) and time (408)."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping

from starlette.requests import Request
from starlette.types import Scope

from gateway.errors import BadRequest, BodyTooLarge, RequestTimeout

# Set in the scope by the server (gateway.server) once the whole body is buffered: the
# read cannot wait then, and skips its timeout (about 2% of a proxied request's CPU).
BODY_RECEIVED = "gateway.body_received"


def header_map(scope: Scope) -> dict[str, str]:
    """The request's headers as a plain dict, built once: lower-case names, the first of
    repeated ones (as Starlette's `Headers.get`, which scans the list on every call)."""
    headers: dict[str, str] = {}
    for name, value in reversed(scope["headers"]):
        headers[name.decode("latin-1")] = value.decode("latin-1")
    return headers


class BodyReader:
    def __init__(self, max_bytes: int, timeout_s: float) -> None:
        self._max = max_bytes
        self._timeout_s = timeout_s

    def check_declared(self, headers: Mapping[str, str]) -> None:
        """Refuses a body declared too large before reading it (or authenticating)."""
        declared = headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > self._max:
            raise BodyTooLarge(f"The request body exceeds {self._max} bytes.")

    async def read(self, request: Request) -> bytes:
        if request.scope.get(BODY_RECEIVED):
            return await self._receive(request)
        try:
            async with asyncio.timeout(self._timeout_s):
                return await self._receive(request)
        except TimeoutError as exc:
            # A body dribbled under the size limit would hold a connection (and its memory)
            # for as long as the client liked; the rest of it is not read, so hang up.
            raise RequestTimeout(
                f"The request body did not arrive within {self._timeout_s:g} s.",
                headers={"connection": "close"},
            ) from exc

    async def _receive(self, request: Request) -> bytes:
        # ASGI messages read directly: Starlette's `request.stream()` is an async
        # generator, a measurable cost per request for what is one message.
        parts: list[bytes] = []
        size = 0
        while True:
            message = await request.receive()
            if message["type"] == "http.disconnect":
                raise BadRequest("The client closed the connection before sending the body.")
            part = message.get("body", b"")
            size += len(part)
            if size > self._max:
                raise BodyTooLarge(f"The request body exceeds {self._max} bytes.")
            if not message.get("more_body", False):
                return part if not parts else b"".join([*parts, part])
            parts.append(part)
