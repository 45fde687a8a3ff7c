"""Reading a request body: the time limit applies only while the body is still arriving."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from starlette.requests import Request

from gateway.body import BODY_RECEIVED, BodyReader
from gateway.errors import RequestTimeout

BODY = b'{"model": "echo"}'


def request(scope_extra: dict[str, Any]) -> Request:
    async def receive() -> dict[str, Any]:
        await asyncio.sleep(0.05)  # longer than the reader's limit below
        return {"type": "http.request", "body": BODY, "more_body": False}

    scope = {"type": "http", "method": "POST", "path": "/", "headers": [], **scope_extra}
    return Request(scope, receive)


async def test_a_body_still_arriving_is_read_under_the_time_limit() -> None:
    with pytest.raises(RequestTimeout):
        await BodyReader(max_bytes=1024, timeout_s=0.01).read(request({}))


async def test_a_body_the_server_holds_whole_is_read_without_a_timer() -> None:
    # gateway.server sets the flag once the whole body is buffered; then nothing can make
    # the read wait, and it skips the timer (a measurable cost per request).
    reader = BodyReader(max_bytes=1024, timeout_s=0.01)
    assert await reader.read(request({BODY_RECEIVED: True})) == BODY
