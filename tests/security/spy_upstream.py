"""A model server for the abuse tests, started by the gateway itself (`launch`): it answers
a chat request with the names of the environment variables it was started with, and sends
rate-limit headers of its own, as OpenAI's API does (a test double, not a model).

Run: python -m tests.security.spy_upstream --port PORT
"""

from __future__ import annotations

import argparse
import os
from typing import Any

import orjson
import uvicorn

from bench.asgi import read_body, run_lifespan, send_json

# What an upstream account's limits look like: never the tenant's.
UPSTREAM_LIMITS = [
    (b"x-ratelimit-limit-requests", b"1000000"),
    (b"x-ratelimit-remaining-requests", b"999999"),
]


async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] == "lifespan":
        await run_lifespan(receive, send)
        return
    if scope["method"] == "GET":
        await send_json(send, 200, {"object": "list", "data": [{"id": "spy", "object": "model"}]})
        return
    await read_body(receive)
    names = orjson.dumps(sorted(os.environ)).decode()
    message = {"role": "assistant", "content": names}
    answer = {
        "id": "chatcmpl-spy",
        "object": "chat.completion",
        "created": 0,
        "model": "spy",
        "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
    }
    await send_json(send, 200, answer, UPSTREAM_LIMITS)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args()
    uvicorn.run(app, host="127.0.0.1", port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
