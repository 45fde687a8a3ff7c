"""The same-run baseline of bench/proxy_overhead.py: about the least a proxy in front of the
fake upstream has to do, served as the gateway is (`gateway.server.uvicorn_config`: uvloop,
its httptools protocol, the same settings), in its own process. A raw ASGI app: a bearer
check against one key, one counter, the request body relayed unparsed through one pooled
aiohttp session (the gateway's client settings), the answer relayed back as it comes, chunk
by chunk when the upstream streams (text/event-stream). GET /healthz answers 200.

Run: python -m bench.skeleton_proxy --port PORT --upstream BASE_URL --key KEY
"""

from __future__ import annotations

import argparse
import hmac
from typing import Any

import aiohttp
import uvicorn

from backends.http import HttpTimeouts
from bench.asgi import read_body, send_json
from gateway.server import uvicorn_config

UPSTREAM_HEADERS = {"Content-Type": "application/json"}


class Skeleton:
    def __init__(self, upstream: str, key: str) -> None:
        self.upstream = upstream  # ends with /v1, as the gateway's backend base_url
        self.auth = f"Bearer {key}".encode()
        self.requests = 0
        self.session: aiohttp.ClientSession | None = None

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            return await self.lifespan(receive, send)
        if scope["path"] == "/healthz":
            return await send_json(send, 200, {"status": "ok"})
        auth = next((v for k, v in scope["headers"] if k == b"authorization"), b"")
        if not hmac.compare_digest(auth, self.auth):
            return await send_json(send, 401, {"error": {"code": "invalid_api_key"}})
        self.requests += 1
        assert self.session is not None
        url = self.upstream + scope["path"].removeprefix("/v1")
        body = await read_body(receive)
        async with self.session.post(url, data=body, headers=UPSTREAM_HEADERS) as answer:
            kind = answer.headers.get("Content-Type", "application/json")
            headers = [(b"content-type", kind.encode())]
            stream = kind.startswith("text/event-stream")
            content = b"" if stream else await answer.read()
            if not stream:
                headers.append((b"content-length", str(len(content)).encode()))
            await send({"type": "http.response.start", "status": answer.status, "headers": headers})
            if stream:
                async for chunk in answer.content.iter_any():
                    await send({"type": "http.response.body", "body": chunk, "more_body": True})
            await send({"type": "http.response.body", "body": content})

    async def lifespan(self, receive: Any, send: Any) -> None:
        while (await receive())["type"] != "lifespan.shutdown":  # startup
            connector = aiohttp.TCPConnector(
                limit=256, limit_per_host=0, keepalive_timeout=HttpTimeouts.idle_s
            )
            self.session = aiohttp.ClientSession(
                connector=connector,
                timeout=aiohttp.ClientTimeout(total=None, sock_connect=5.0, sock_read=300.0),
                skip_auto_headers=("Accept-Encoding", "User-Agent"),
                auto_decompress=False,
                cookie_jar=aiohttp.DummyCookieJar(),
            )
            await send({"type": "lifespan.startup.complete"})
        if self.session is not None:
            await self.session.close()
        await send({"type": "lifespan.shutdown.complete"})


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--upstream", required=True)
    parser.add_argument("--key", required=True)
    args = parser.parse_args()
    uvicorn.Server(uvicorn_config(Skeleton(args.upstream, args.key), "127.0.0.1", args.port)).run()


if __name__ == "__main__":
    main()
