"""Between streamed and whole answers: a stream is recorded into the whole answer it
stands for (that is what the cache stores), and a stored answer is replayed as a stream
with the same chunk schema the upstream uses (OpenAI's `chat.completion.chunk` or
`text_completion`).
"""

from __future__ import annotations

from typing import Any

import orjson

DONE = b"data: [DONE]\n\n"


class StreamRecorder:
    """Feeds on relayed SSE bytes; `result()` is the whole answer, or None if the stream
    was not a complete, successful one (cut off, an error event, unparsable)."""

    def __init__(self, kind: str) -> None:
        self._chat = kind == "chat"
        self._buffer = b""
        self._head: dict[str, Any] = {}
        self._texts: dict[int, list[str]] = {}
        self._finish: dict[int, str | None] = {}
        self._usage: dict[str, Any] | None = None
        self._done = False
        self._broken = False

    def feed(self, data: bytes) -> None:
        if self._broken:
            return
        self._buffer += data
        *events, self._buffer = self._buffer.replace(b"\r\n", b"\n").split(b"\n\n")
        for event in events:
            self._event(event)

    def _event(self, event: bytes) -> None:
        for line in event.split(b"\n"):
            if not line.startswith(b"data:"):
                continue
            payload = line[5:].strip()
            if payload == b"[DONE]":
                self._done = True
            else:
                self._chunk(payload)

    def _chunk(self, payload: bytes) -> None:
        try:
            chunk = orjson.loads(payload)
        except orjson.JSONDecodeError:
            self._broken = True
            return
        if not isinstance(chunk, dict) or "error" in chunk:
            self._broken = True
            return
        if not self._head:
            self._head = {k: chunk.get(k) for k in ("id", "created", "model", "system_fingerprint")}
        if chunk.get("usage"):
            self._usage = chunk["usage"]
        for choice in chunk.get("choices") or []:
            self._choice(choice)

    def _choice(self, choice: dict[str, Any]) -> None:
        index = int(choice.get("index", 0))
        piece = (choice.get("delta") or {}).get("content") if self._chat else choice.get("text")
        if isinstance(piece, str):
            self._texts.setdefault(index, []).append(piece)
        if choice.get("finish_reason") is not None:
            self._finish[index] = choice["finish_reason"]
        if self._chat and (choice.get("delta") or {}).get("tool_calls"):
            self._broken = True  # tool calls are not cached

    def result(self) -> bytes | None:
        if self._broken or not self._done or not self._texts:
            return None
        if set(self._finish) != set(self._texts):
            return None
        choices = [self._whole_choice(i) for i in sorted(self._texts)]
        body = {
            **{k: v for k, v in self._head.items() if v is not None},
            "object": "chat.completion" if self._chat else "text_completion",
            "choices": choices,
        }
        if self._usage is not None:
            body["usage"] = self._usage
        return orjson.dumps(body)

    def _whole_choice(self, index: int) -> dict[str, Any]:
        text = "".join(self._texts[index])
        if self._chat:
            message = {"role": "assistant", "content": text}
            return {"index": index, "message": message, "finish_reason": self._finish[index]}
        return {"index": index, "text": text, "finish_reason": self._finish[index]}


def replay(kind: str, answer: dict[str, Any], include_usage: bool) -> list[bytes]:
    """SSE events for a stored whole answer: content first, then finish, usage, [DONE]."""
    chat = kind == "chat"
    head: dict[str, Any] = {k: answer[k] for k in ("id", "created", "model") if k in answer}
    head["object"] = "chat.completion.chunk" if chat else "text_completion"
    events = []
    for choice in answer.get("choices", []):
        index = choice.get("index", 0)
        if chat:
            text = (choice.get("message") or {}).get("content") or ""
            first = {
                "index": index,
                "delta": {"role": "assistant", "content": text},
                "finish_reason": None,
            }
            last = {"index": index, "delta": {}, "finish_reason": choice.get("finish_reason")}
        else:
            first = {"index": index, "text": choice.get("text", ""), "finish_reason": None}
            last = {"index": index, "text": "", "finish_reason": choice.get("finish_reason")}
        events += [_event({**head, "choices": [first]}), _event({**head, "choices": [last]})]
    if include_usage and "usage" in answer:
        events.append(_event({**head, "choices": [], "usage": answer["usage"]}))
    events.append(DONE)
    return events


def _event(chunk: dict[str, Any]) -> bytes:
    return b"data: " + orjson.dumps(chunk) + b"\n\n"
