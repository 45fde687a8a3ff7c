"""Anthropic's Messages API (`POST /v1/messages`) as chat completions, and back: the
request through gateway/dialects/anthropic_request.py; here its answer.

A chat completion becomes a `message` with `text` and `tool_use` blocks, and its
finish reason a `stop_reason`; a stream becomes `message_start`, a `content_block_start`
/ `content_block_delta` / `content_block_stop` run per block, `message_delta` (stop
reason and usage) and `message_stop`; an error, whole or mid-stream, Anthropic's error
JSON (`{"type": "error", "error": {"type", "message"}}`) with the gateway's status.
Passed through to a backend that serves the route itself (`Messages.pass_through`), the
answer is the backend's own, and only the gateway's errors are translated.

Reference: https://docs.anthropic.com/en/api/messages and /en/docs/build-with-claude/streaming
"""

from __future__ import annotations

from typing import Any

import orjson

from cache.sse import event_data
from gateway.dialects.anthropic_request import to_chat
from gateway.dialects.translated import ChatStream, sse_event
from gateway.errors import UpstreamError
from gateway.openai_errors import json_object
from gateway.usage import TokenUsage, token_usage

STOP_REASONS = {
    "stop": "end_turn",
    "length": "max_tokens",
    "tool_calls": "tool_use",
    "function_call": "tool_use",
    "content_filter": "refusal",
}
# Anthropic's error types by HTTP status (https://docs.anthropic.com/en/api/errors).
ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    402: "billing_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    503: "overloaded_error",
    504: "timeout_error",
    529: "overloaded_error",
}
# A stream's error event carries no status: its type says which it would have been.
_STREAM_ERRORS = {
    "invalid_request_error": 400,
    "rate_limit_error": 429,
    "service_unavailable": 503,
    "timeout_error": 504,
}


class Messages:
    """One `/v1/messages` request (`gateway.dialects.Dialect`)."""

    native_path: str | None = "/messages"

    def __init__(self, *, counting: bool = False) -> None:
        self.counting = counting  # /v1/messages/count_tokens: its answer is already its own
        self.model = ""
        self.stop_sequences: list[str] = []
        self._stream = _Stream(self)
        self._native = False  # passed through: the backend's answer is a message already

    def pass_through(self) -> None:
        self._native = True

    async def to_chat(self, raw: bytes, owner: str) -> bytes:
        fields = json_object(raw)
        if self.counting:  # a count's body has no max_tokens; it has no answer
            fields = {"max_tokens": 1, **fields}
        chat = to_chat(fields)
        self.model = chat["model"]
        self.stop_sequences = list(chat.get("stop", []))
        return orjson.dumps(chat)

    def whole(self, status: int, body: bytes) -> tuple[int, bytes]:
        if status != 200:
            return status, error_json(status, body)
        if self.counting or self._native:
            return status, body
        try:
            return status, orjson.dumps(self.message(orjson.loads(body)))
        except UpstreamError as error:
            return error.status, _error_object({"message": error.message}, error.status)
        except (orjson.JSONDecodeError, LookupError, TypeError, AttributeError):
            failure = {"message": "The backend's answer is not a chat completion."}
            return 502, _error_object(failure, 502)

    def message(self, answer: dict[str, Any]) -> dict[str, Any]:
        choice = answer["choices"][0]
        message = choice.get("message") or {}
        content: list[dict[str, Any]] = []
        text = (message.get("content") or "") + (message.get("refusal") or "")
        if text:
            content.append({"type": "text", "text": text})
        calls = message.get("tool_calls") or []
        content.extend(_tool_use(call) for call in calls)
        stop_reason, stop_sequence = self.stop_of(choice, called=bool(calls))
        return {
            "id": message_id(answer.get("id")),
            "type": "message",
            "role": "assistant",
            "model": self.model,
            "content": content,
            "stop_reason": stop_reason,
            "stop_sequence": stop_sequence,
            "usage": usage(answer.get("usage")),
        }

    def stop_of(
        self, choice: dict[str, Any], called: bool = False
    ) -> tuple[str | None, str | None]:
        """The stop reason and sequence of a chat choice that made tool calls or not
        (`called`). vLLM names the stop string that ended the answer in `stop_reason`;
        other servers say only `stop`. A call the request named (`tool_choice`) ends in
        `stop`, not `tool_calls` (OpenAI's API and vLLM alike), where Anthropic's says
        `tool_use` whenever the model called a tool."""
        reason = choice.get("finish_reason")
        if called and reason == "stop":
            return "tool_use", None
        matched = choice.get("stop_reason")
        if reason == "stop" and isinstance(matched, str) and matched in self.stop_sequences:
            return "stop_sequence", matched
        return STOP_REASONS.get(reason or "", "end_turn" if reason else None), None

    def events(self, events: list[bytes]) -> bytes:
        if self._native:
            return b"".join(self._passed(e) for e in events)
        return b"".join(self._stream.event(e) for e in events)

    def _passed(self, event: bytes) -> bytes:
        """An event of the backend's own stream, unchanged; one the gateway added (a
        deadline's cut, the upstream failing mid-stream: a chat error event, unnamed) as
        Anthropic's `error` event. Anthropic's events are all named."""
        data = event_data(event)
        if data is None or event.startswith(b"event:") or b'"error"' not in data:
            return event + b"\n\n"
        try:
            error = orjson.loads(data).get("error")
        except (orjson.JSONDecodeError, AttributeError):
            error = None
        return self._stream.failed(error) if isinstance(error, dict) else event + b"\n\n"

    def end(self) -> bytes:
        return b""

    async def sent(self) -> None:
        return None


class _Stream(ChatStream):
    """Chat chunks in, Anthropic stream events out, one block open at a time."""

    def __init__(self, request: Messages) -> None:
        super().__init__()
        self._request = request
        self._open: tuple[str, int] | None = None  # ("text", -1) or ("tool", chat index)
        self._blocks = 0
        self._choice: dict[str, Any] = {}
        self._called = False  # a tool call was streamed

    def failed(self, error: dict[str, Any]) -> bytes:
        status = _STREAM_ERRORS.get(str(error.get("type")), 502)
        return sse_event("error", _error_object(error, status))

    def start(self, chunk: dict[str, Any]) -> bytes:
        message: dict[str, Any] = {
            "id": message_id(chunk.get("id")),
            "type": "message",
            "role": "assistant",
            "model": self._request.model,
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": {"input_tokens": 0, "output_tokens": 0},
        }
        return _named("message_start", {"message": message})

    def delta(self, choice: dict[str, Any]) -> bytes:
        delta = choice.get("delta") or {}
        out = b""
        text = (delta.get("content") or "") + (delta.get("refusal") or "")
        if text:
            out += self._block(("text", -1), {"type": "text", "text": ""})
            out += self._content({"type": "text_delta", "text": text})
        for call in delta.get("tool_calls") or []:
            out += self._tool_delta(call)
        if choice.get("finish_reason"):
            self._choice = choice
        return out

    def _tool_delta(self, call: dict[str, Any]) -> bytes:
        self._called = True
        function = call.get("function") or {}
        block = {"type": "tool_use", "id": call.get("id"), "name": function.get("name")}
        out = self._block(("tool", call.get("index", 0)), {**block, "input": {}})
        arguments = function.get("arguments")
        if arguments:
            out += self._content({"type": "input_json_delta", "partial_json": arguments})
        return out

    def _block(self, key: tuple[str, int], start: dict[str, Any]) -> bytes:
        """Opens the block `key` unless it is the open one (closing that first)."""
        if self._open == key:
            return b""
        out = self._close()
        self._open = key
        return out + _named("content_block_start", {"index": self._blocks, "content_block": start})

    def _content(self, delta: dict[str, Any]) -> bytes:
        return _named("content_block_delta", {"index": self._blocks, "delta": delta})

    def _close(self) -> bytes:
        if self._open is None:
            return b""
        self._open = None
        self._blocks += 1
        return _named("content_block_stop", {"index": self._blocks - 1})

    def done(self) -> bytes:
        out = self._close()
        stop_reason, stop_sequence = self._request.stop_of(self._choice, self._called)
        delta = {"stop_reason": stop_reason, "stop_sequence": stop_sequence}
        out += _named("message_delta", {"delta": delta, "usage": usage(self.usage)})
        return out + _named("message_stop", {})


def _tool_use(call: dict[str, Any]) -> dict[str, Any]:
    function = call.get("function") or {}
    try:
        arguments = orjson.loads(function.get("arguments") or "{}")
    except orjson.JSONDecodeError:
        arguments = None
    if not isinstance(arguments, dict):
        raise UpstreamError("The model called a tool with arguments that are not a JSON object.")
    return {
        "type": "tool_use",
        "id": call.get("id"),
        "name": function.get("name"),
        "input": arguments,
    }


def usage(chat: Any) -> dict[str, int]:
    """Anthropic's usage for a chat `usage`: its input excludes what the prefix cache read."""
    used = token_usage(chat) or TokenUsage(0, 0)
    return {
        "input_tokens": used.prompt - used.cached,
        "output_tokens": used.completion,
        "cache_read_input_tokens": used.cached,
        "cache_creation_input_tokens": 0,
    }


def message_id(chat_id: Any) -> str:
    rest = chat_id.removeprefix("chatcmpl-") if isinstance(chat_id, str) else ""
    return f"msg_{rest}"


def error_json(status: int, body: bytes) -> bytes:
    """An OpenAI error body (the gateway's or an upstream's) as Anthropic's."""
    try:
        error = orjson.loads(body).get("error")
    except (orjson.JSONDecodeError, AttributeError):
        error = None
    return _error_object(error if isinstance(error, dict) else {}, status)


def _error_object(error: dict[str, Any], status: int) -> bytes:
    message = error.get("message") or f"The request failed with status {status}."
    kind = ERROR_TYPES.get(status, "api_error")
    return orjson.dumps({"type": "error", "error": {"type": kind, "message": message}})


def _named(kind: str, fields: dict[str, Any]) -> bytes:
    return sse_event(kind, orjson.dumps({"type": kind, **fields}))
