"""The few raw-ASGI helpers the test and benchmark upstreams share, and how they are served."""

from __future__ import annotations

from typing import Any

import orjson


async def read_body(receive: Any) -> bytes:
    parts = []
    while True:
        message = await receive()
        parts.append(message.get("body", b""))
        if not message.get("more_body"):
            return b"".join(parts)


async def send_json(
    send: Any, status: int, body: Any, extra: list[tuple[bytes, bytes]] | None = None
) -> None:
    payload = orjson.dumps(body)
    headers = [(b"content-type", b"application/json"), *(extra or [])]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": payload})


async def run_lifespan(receive: Any, send: Any) -> None:
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return


def serve(app: Any, host: str, port: int, **options: Any) -> None:
    """Runs `app` as the benchmarks' upstreams run: uvloop and httptools, quiet, a deep
    backlog (a burst of connections is not refused), until stopped."""
    import uvicorn

    settings = {"loop": "uvloop", "http": "httptools", "log_level": "error", "backlog": 4096}
    uvicorn.run(app, host=host, port=port, access_log=False, **{**settings, **options})
