"""A small, fast OpenAI-style upstream for tests and benchmarks (a test double, not a model).

It answers by echoing the last user message, so tests can check content end to end, and
misbehaves on purpose for some model names:

    echo            normal answers (chat, completions, embeddings), streamed word by word
    slow, slow-*    waits `x_delay` seconds (body field) before answering

and, for any model, on body fields: `x_chunk_delay` (seconds between a stream's chunks);
`"user": "fail-500"` answers HTTP 500 (after `x_delay`; `user` does not change a cache key,
so an identical cacheable request can fail where another succeeds).
    error-500       answers HTTP 500
    busy-429        answers HTTP 429 with Retry-After: 7
    always-503      answers HTTP 503 (no Retry-After): a backend that is down
    die-midstream   streams two chunks, then breaks the connection
    hang-midstream  streams two chunks, then waits until the client goes away
    no-done         streams the answer but ends without `data: [DONE]`
    malformed-json  answers 200 with a cut JSON body; streamed, one event is not JSON
    broken-sse      streams one chunk, then half an event, and ends (no blank line, no [DONE])

`GET /_last` returns the headers of the last request, `GET /_last_body` its body;
`GET /_stats` counts requests (by model, by the body's `user` when it has one, by the
`max_tokens` sent) and streams that the client abandoned (to check that the gateway
cancels upstream requests); `GET /_crash` kills the process at once.

Run: python -m bench.fake_upstream --port PORT [--echo-delay-ms MS] [--startup-delay-s S]
(`--echo-delay-ms`: `echo` answers after that long, as a model would take; `--startup-delay-s`:
it listens only after that long, as a model server loading its weights)
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import os
import struct
import time
from typing import Any

import orjson

from bench.asgi import read_body, run_lifespan, send_json, serve

Scope = dict[str, Any]

MODELS = [
    "echo",
    "slow",
    "error-500",
    "busy-429",
    "always-503",
    "die-midstream",
    "hang-midstream",
    "no-done",
    "malformed-json",
    "broken-sse",
]


def fake_backend(base_url: str, **overrides: Any) -> dict[str, Any]:
    """This fake upstream, already running at `base_url`, as an `http` backend serving
    every model in MODELS (`overrides` replace or add settings)."""
    backend: dict[str, Any] = {
        "name": "fake",
        "kind": "http",
        "base_url": base_url,
        "models": list(MODELS),
        "api_key": "upstream-secret-xyz",
    }
    backend.update(overrides)
    return backend


def on_demand_backend(models: list[str], scaling: dict[str, Any], **extra: Any) -> dict[str, Any]:
    """This fake upstream as a `process` backend: a model server the gateway starts on
    demand (from zero replicas, at most one) and stops when idle, as `scaling` says."""
    return {
        "name": "on-demand",
        "kind": "process",
        "command": ["{python}", "-m", "bench.fake_upstream", "--port", "{port}"],
        "ready_path": "/v1/models",
        "models": models,
        **extra,
        "scaling": {"min_replicas": 0, "max_replicas": 1, **scaling},
    }


class FakeUpstream:
    def __init__(self, echo_delay_s: float = 0.0) -> None:
        self.echo_delay_s = echo_delay_s
        self.last_headers: dict[str, str] = {}
        self.last_body: dict[str, Any] = {}
        self.stats = {"requests": 0, "abandoned_streams": 0, "active_streams": 0}

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            await run_lifespan(receive, send)
            return
        path, method = scope["path"], scope["method"]
        if method == "GET":
            await self._get(path, send)
            return
        self.stats["requests"] += 1
        self.last_headers = {k.decode(): v.decode() for k, v in scope["headers"]}
        body = self.last_body = orjson.loads(await read_body(receive))
        counted = f"model:{body.get('model')}"
        self.stats[counted] = self.stats.get(counted, 0) + 1
        if isinstance(body.get("user"), str):  # per caller-chosen tag (batch lines' custom_id)
            tagged = f"user:{body['user']}"
            self.stats[tagged] = self.stats.get(tagged, 0) + 1
        if isinstance(body.get("max_tokens"), int):  # the output cap it was sent (degraded?)
            capped = f"max_tokens:{body['max_tokens']}"
            self.stats[capped] = self.stats.get(capped, 0) + 1
        await self._post(path, body, receive, send)

    async def _get(self, path: str, send: Any) -> None:
        if path == "/v1/models":
            data = [{"id": m, "object": "model", "created": 0, "owned_by": "fake"} for m in MODELS]
            await send_json(send, 200, {"object": "list", "data": data})
        elif path == "/_last":
            await send_json(send, 200, self.last_headers)
        elif path == "/_last_body":
            await send_json(send, 200, self.last_body)
        elif path == "/_stats":
            await send_json(send, 200, self.stats)
        elif path == "/_crash":  # a model server dying at once, mid-whatever
            os._exit(3)
        else:
            await send_json(
                send, 404, {"error": {"message": "not found", "type": "invalid_request_error"}}
            )

    async def _post(self, path: str, body: dict[str, Any], receive: Any, send: Any) -> None:
        model = body.get("model", "")
        if model == "slow" or model.startswith("slow-"):  # `slow-*`: for other backends
            await asyncio.sleep(float(body.get("x_delay", 1.0)))
        elif model == "echo" and self.echo_delay_s:
            await asyncio.sleep(self.echo_delay_s)
        if model == "error-500" or body.get("user") == "fail-500":
            await send_json(
                send, 500, {"error": {"message": "internal failure", "type": "server_error"}}
            )
        elif model == "always-503":
            error = {"error": {"message": "down", "type": "server_error"}}
            await send_json(send, 503, error)
        elif model == "busy-429":
            error = {"error": {"message": "busy", "type": "rate_limit_error", "code": "busy"}}
            await send_json(send, 429, error, [(b"retry-after", b"7")])
        elif path == "/v1/embeddings":
            await send_json(send, 200, _embeddings(body))
        elif model == "malformed-json" and not body.get("stream"):
            await _send_raw(send, b"application/json", b'{"id": "fake-1", "choices": [{"mess')
        elif body.get("stream"):
            await self._stream(path, body, receive, send)
        else:
            await send_json(send, 200, _completion(path, body))

    async def _stream(self, path: str, body: dict[str, Any], receive: Any, send: Any) -> None:
        headers = [(b"content-type", b"text/event-stream")]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        model = body["model"]
        self.stats["active_streams"] += 1
        try:
            for index, event in enumerate(_chunks(path, body)):
                if index == 2 and model == "die-midstream":
                    # Let the two chunks reach the gateway first: a reset connection
                    # discards whatever its receiver has not read yet.
                    await asyncio.sleep(0.2)
                    raise ConnectionAbortedError("fake upstream dies mid-stream")
                if index == 2 and model == "hang-midstream":
                    await _until_disconnect(receive)
                    self.stats["abandoned_streams"] += 1
                    return
                if index == 1 and model == "malformed-json":
                    event = b'data: {"id": "fake-1", "choices": [{"delta": \n\n'
                if index == 1 and model == "broken-sse":
                    half = b'data: {"id": "fake-1", "cho'
                    await send({"type": "http.response.body", "body": half, "more_body": False})
                    return
                await send({"type": "http.response.body", "body": event, "more_body": True})
                if body.get("x_chunk_delay"):
                    await asyncio.sleep(float(body["x_chunk_delay"]))
            done = b"" if model == "no-done" else b"data: [DONE]\n\n"
            await send({"type": "http.response.body", "body": done, "more_body": False})
        finally:
            self.stats["active_streams"] -= 1


def _answer(path: str, body: dict[str, Any]) -> str:
    if path == "/v1/chat/completions":
        users = [m for m in body.get("messages", []) if m.get("role") == "user"]
        text = users[-1].get("content", "") if users else ""
    else:
        prompt = body.get("prompt", "")
        text = prompt if isinstance(prompt, str) else " ".join(map(str, prompt))
    return f"echo: {text}"


def _usage(path: str, body: dict[str, Any], answer: str) -> dict[str, int]:
    prompt_tokens = len(orjson.dumps(body.get("messages") or body.get("prompt")).split())
    completion_tokens = len(answer.split())
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


def _completion(path: str, body: dict[str, Any]) -> dict[str, Any]:
    answer = _answer(path, body)
    usage = _usage(path, body, answer)
    if path == "/v1/completions":
        choice: dict[str, Any] = {"index": 0, "text": answer, "finish_reason": "stop"}
        kind = "text_completion"
    else:
        message = {"role": "assistant", "content": answer}
        choice = {"index": 0, "message": message, "finish_reason": "stop"}
        kind = "chat.completion"
    created = int(time.time())
    return {
        "id": "fake-1",
        "object": kind,
        "created": created,
        "model": body["model"],
        "choices": [choice],
        "usage": usage,
    }


def _chunks(path: str, body: dict[str, Any]) -> list[bytes]:
    answer = _answer(path, body)
    words = answer.split(" ")
    pieces = [w if i == 0 else " " + w for i, w in enumerate(words)]
    chat = path == "/v1/chat/completions"
    events = [_chunk(body, chat, piece, None, first=i == 0) for i, piece in enumerate(pieces)]
    events.append(_chunk(body, chat, "", "stop", first=False))
    if (body.get("stream_options") or {}).get("include_usage"):
        usage = {
            "id": "fake-1",
            "object": "chat.completion.chunk" if chat else "text_completion",
            "created": 0,
            "model": body["model"],
            "choices": [],
            "usage": _usage(path, body, answer),
        }
        events.append(b"data: " + orjson.dumps(usage) + b"\n\n")
    return events


def _chunk(body: dict[str, Any], chat: bool, piece: str, finish: str | None, first: bool) -> bytes:
    if chat:
        delta: dict[str, Any] = {"content": piece} if piece or finish is None else {}
        if first:
            delta["role"] = "assistant"
        choice: dict[str, Any] = {"index": 0, "delta": delta, "finish_reason": finish}
        kind = "chat.completion.chunk"
    else:
        choice = {"index": 0, "text": piece, "finish_reason": finish}
        kind = "text_completion"
    chunk = {
        "id": "fake-1",
        "object": kind,
        "created": 0,
        "model": body["model"],
        "choices": [choice],
    }
    return b"data: " + orjson.dumps(chunk) + b"\n\n"


def _embeddings(body: dict[str, Any]) -> dict[str, Any]:
    texts = body["input"] if isinstance(body["input"], list) else [body["input"]]
    data = []
    for index, text in enumerate(texts):
        digest = hashlib.sha256(str(text).encode()).digest()
        vector = [b / 255.0 for b in digest[:8]]
        data.append({"object": "embedding", "index": index, "embedding": _encode(vector, body)})
    usage = {"prompt_tokens": len(texts), "total_tokens": len(texts)}
    return {"object": "list", "data": data, "model": body["model"], "usage": usage}


def _encode(vector: list[float], body: dict[str, Any]) -> Any:
    if body.get("encoding_format") == "base64":
        import base64

        return base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode()
    return vector


async def _send_raw(send: Any, content_type: bytes, body: bytes) -> None:
    headers = [(b"content-type", content_type)]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": body})


async def _until_disconnect(receive: Any) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--echo-delay-ms", type=float, default=0.0)
    parser.add_argument("--startup-delay-s", type=float, default=0.0)
    args = parser.parse_args()
    time.sleep(args.startup_delay_s)  # a model loading: its port opens only after this
    serve(FakeUpstream(args.echo_delay_ms / 1000.0), args.host, args.port, backlog=2048)


if __name__ == "__main__":
    main()
