"""An upstream that streams what real model servers stream beyond plain text, written the
awkward ways the SSE spec allows (a test double, not a model):

    rich        `reasoning_content`, then the answer (which contains the text
                `data: [DONE]`) with a logprob per token; one event's JSON spans two
                `data:` lines, some events end in CRLF; usage when asked for
    rich-cut    the same, broken off before `[DONE]`
    tools       a `get_weather` tool call, its arguments in pieces; finish `tool_calls`
    refuse      a `refusal` in pieces, no content

A non-streamed request gets the whole answer its stream stands for (recorded by the
cache's `StreamRecorder`). `GET /_stats` counts requests.
Run: python -m tests.support.rich_upstream --port PORT
"""

from __future__ import annotations

import argparse
from typing import Any

import orjson
import uvicorn

from bench.asgi import read_body, run_lifespan, send_json
from cache.sse import StreamRecorder

MODELS = ["rich", "rich-cut", "tools", "refuse"]
REASONING = ["The user ", "wants the ", "SSE end marker."]
TOKENS = ["A stream", " ends with", " data: [DONE]", " on its", " own line."]
ARGUMENTS = ['{"city":', ' "Paris"', "}"]
REFUSAL = ["I can't ", "help with ", "that."]


class RichUpstream:
    def __init__(self) -> None:
        self.requests = 0

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            await run_lifespan(receive, send)
        elif scope["method"] == "GET":
            data = [{"id": m, "object": "model"} for m in MODELS]
            listing = {"requests": self.requests} if scope["path"] == "/_stats" else {"data": data}
            await send_json(send, 200, listing)
        else:
            self.requests += 1
            body = orjson.loads(await read_body(receive))
            await self._answer(body, send)

    async def _answer(self, body: dict[str, Any], send: Any) -> None:
        if not body.get("stream"):
            recorder = StreamRecorder("chat")
            for event in events({**body, "stream_options": {"include_usage": True}}):
                recorder.feed(event)
            whole = recorder.result()
            if whole is None:  # rich-cut: its stream is not a whole answer
                await send_json(send, 500, {"error": {"message": "cut", "type": "server_error"}})
            else:
                await send_json(send, 200, orjson.loads(whole))
            return
        headers = [(b"content-type", b"text/event-stream")]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        for event in events(body):
            await send({"type": "http.response.body", "body": event, "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})


def events(body: dict[str, Any]) -> list[bytes]:
    model = body["model"]
    deltas = {"tools": _tool_deltas, "refuse": _refusal_deltas}.get(model, _rich_deltas)()
    finish = "tool_calls" if model == "tools" else "stop"
    chunks = [_chunk(model, delta, logprobs) for delta, logprobs in deltas]
    chunks.append(_chunk(model, {}, None, finish))
    if (body.get("stream_options") or {}).get("include_usage"):
        usage = {"prompt_tokens": 9, "completion_tokens": 12, "total_tokens": 21}
        chunks.append({**_head(model), "choices": [], "usage": usage})
    written = [_written(chunk, i) for i, chunk in enumerate(chunks)]
    return written if model == "rich-cut" else [*written, b"data: [DONE]\r\n\r\n"]


def _rich_deltas() -> list[tuple[dict[str, Any], Any]]:
    deltas: list[tuple[dict[str, Any], Any]] = [({"role": "assistant", "content": ""}, None)]
    deltas += [({"reasoning_content": piece}, None) for piece in REASONING]
    for token in TOKENS:
        entry = {
            "token": token,
            "logprob": -0.25,
            "bytes": list(token.encode()),
            "top_logprobs": [],
        }
        deltas.append(({"content": token}, {"content": [entry], "refusal": None}))
    return deltas


def _tool_deltas() -> list[tuple[dict[str, Any], Any]]:
    function = {"name": "get_weather", "arguments": ""}
    call = {"index": 0, "id": "call_w1", "type": "function", "function": function}
    deltas: list[tuple[dict[str, Any], Any]] = [
        ({"role": "assistant", "content": None, "tool_calls": [call]}, None)
    ]
    for piece in ARGUMENTS:
        deltas.append(({"tool_calls": [{"index": 0, "function": {"arguments": piece}}]}, None))
    return deltas


def _refusal_deltas() -> list[tuple[dict[str, Any], Any]]:
    deltas: list[tuple[dict[str, Any], Any]] = [({"role": "assistant", "content": None}, None)]
    return deltas + [({"refusal": piece}, None) for piece in REFUSAL]


def _head(model: str) -> dict[str, Any]:
    return {"id": "rich-1", "object": "chat.completion.chunk", "created": 7, "model": model}


def _chunk(
    model: str, delta: dict[str, Any], logprobs: Any, finish: str | None = None
) -> dict[str, Any]:
    choice = {"index": 0, "delta": delta, "logprobs": logprobs, "finish_reason": finish}
    return {**_head(model), "choices": [choice]}


def _written(chunk: dict[str, Any], position: int) -> bytes:
    """Every third event's JSON on two `data:` lines, every other event ends in CRLF."""
    data = orjson.dumps(chunk)
    if position % 3 == 1:
        cut = data.index(b',"choices"') + 1
        data = data[:cut] + b"\ndata: " + data[cut:]
    end = b"\r\n" if position % 2 else b"\n"
    return b"data: " + data.replace(b"\n", end) + end + end


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args()
    uvicorn.run(RichUpstream(), host="127.0.0.1", port=args.port, log_level="error")


if __name__ == "__main__":
    main()
