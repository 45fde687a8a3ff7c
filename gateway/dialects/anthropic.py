"""Anthropic's Messages API (`POST /v1/messages`) as chat completions, and back.

Request: `system` becomes a system message; a user turn's `tool_result` blocks become
`tool` messages (before the turn's other content, as Anthropic orders them); text and
image blocks become content parts; an assistant turn's `tool_use` blocks become
`tool_calls` (thinking blocks are dropped: a chat backend cannot take them back);
`tools`, `tool_choice`, `stop_sequences`, `metadata.user_id` map to their chat fields. A
block or tool the chat API cannot carry (documents, server tools, images in a tool result)
is refused with a 400 that names it, never dropped.

Answer: a chat completion becomes a `message` with `text` and `tool_use` blocks, and its
finish reason a `stop_reason`; a stream becomes `message_start`, a `content_block_start`
/ `content_block_delta` / `content_block_stop` run per block, `message_delta` (stop
reason and usage) and `message_stop`; an error, whole or mid-stream, Anthropic's error
JSON (`{"type": "error", "error": {"type", "message"}}`) with the gateway's status.

Reference: https://docs.anthropic.com/en/api/messages and /en/docs/build-with-claude/streaming
"""

from __future__ import annotations

from typing import Any

import orjson

from gateway.dialects import json_object
from gateway.dialects.translated import ChatStream, sse_event
from gateway.errors import BadRequest, UpstreamError

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
SAMPLING = ("temperature", "top_p", "top_k")


class Messages:
    """One `/v1/messages` request (`gateway.dialects.Dialect`)."""

    def __init__(self, *, counting: bool = False) -> None:
        self.counting = counting  # /v1/messages/count_tokens: its answer is already its own
        self.model = ""
        self.stop_sequences: list[str] = []
        self._stream = _Stream(self)

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
        if self.counting:
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
        content.extend(_tool_use(call) for call in message.get("tool_calls") or [])
        stop_reason, stop_sequence = self.stop_of(choice)
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

    def stop_of(self, choice: dict[str, Any]) -> tuple[str | None, str | None]:
        """The stop reason and sequence of a chat choice. vLLM names the stop string that
        ended the answer in `stop_reason`; other servers say only `stop`."""
        reason = choice.get("finish_reason")
        matched = choice.get("stop_reason")
        if reason == "stop" and isinstance(matched, str) and matched in self.stop_sequences:
            return "stop_sequence", matched
        return STOP_REASONS.get(reason or "", "end_turn" if reason else None), None

    def events(self, events: list[bytes]) -> bytes:
        return b"".join(self._stream.event(e) for e in events)

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
        stop_reason, stop_sequence = self._request.stop_of(self._choice)
        delta = {"stop_reason": stop_reason, "stop_sequence": stop_sequence}
        out += _named("message_delta", {"delta": delta, "usage": usage(self.usage)})
        return out + _named("message_stop", {})


def to_chat(fields: dict[str, Any]) -> dict[str, Any]:
    """The chat completions request for a Messages request (checked as the API checks it)."""
    model, max_tokens = fields.get("model"), fields.get("max_tokens")
    _require(isinstance(model, str) and model != "", "model: a model name is required", "model")
    _require(_count(max_tokens), "max_tokens: a positive integer is required", "max_tokens")
    turns = fields.get("messages")
    if not isinstance(turns, list) or not turns:
        raise BadRequest("messages: a list of turns is required", param="messages")
    messages = _system(fields.get("system"))
    for i, turn in enumerate(turns):
        messages.extend(_turn(turn, f"messages.{i}"))
    chat: dict[str, Any] = {"model": model, "messages": messages, "max_tokens": max_tokens}
    chat.update({k: fields[k] for k in SAMPLING if fields.get(k) is not None})
    chat.update(_options(fields))
    return chat


def _options(fields: dict[str, Any]) -> dict[str, Any]:
    chat: dict[str, Any] = {}
    stop = fields.get("stop_sequences")
    if stop:
        _require(_strings(stop), "stop_sequences: a list of strings", "stop_sequences")
        chat["stop"] = stop
    if fields.get("stream") is True:
        chat["stream"] = True
        chat["stream_options"] = {"include_usage": True}  # message_delta's usage
    metadata = fields.get("metadata")
    user = metadata.get("user_id") if isinstance(metadata, dict) else None
    if isinstance(user, str):
        chat["user"] = user
    if fields.get("tools"):
        chat["tools"] = [_tool(t, f"tools.{i}") for i, t in enumerate(fields["tools"])]
    chat.update(_tool_choice(fields.get("tool_choice")))
    return chat


def _system(system: Any) -> list[dict[str, Any]]:
    if system is None or system == "":
        return []
    if isinstance(system, list):
        _require(all(_is_text(b) for b in system), "system: text blocks only", "system")
        system = "\n\n".join(b["text"] for b in system)
    _require(isinstance(system, str), "system: a string or text blocks", "system")
    return [{"role": "system", "content": system}]


def _turn(turn: Any, where: str) -> list[dict[str, Any]]:
    _require(isinstance(turn, dict), f"{where}: an object with role and content", where)
    role, content = turn.get("role"), turn.get("content")
    _require(role in ("user", "assistant"), f"{where}.role: 'user' or 'assistant'", where)
    if isinstance(content, str):
        return [{"role": role, "content": content}]
    _require(isinstance(content, list), f"{where}.content: a string or blocks", where)
    blocks = [
        (f"{where}.content.{i}", _block(b, f"{where}.content.{i}")) for i, b in enumerate(content)
    ]
    return _assistant([b for _, b in blocks]) if role == "assistant" else _user(blocks)


def _block(block: Any, where: str) -> dict[str, Any]:
    _require(isinstance(block, dict) and "type" in block, f"{where}: a typed block", where)
    assert isinstance(block, dict)
    return block


def _user(blocks: list[tuple[str, dict[str, Any]]]) -> list[dict[str, Any]]:
    """A user turn's blocks (each with where it is in the request)."""
    results = [_tool_result(b, at) for at, b in blocks if b["type"] == "tool_result"]
    parts = [_part(b, at) for at, b in blocks if b["type"] != "tool_result"]
    if not parts:
        return results
    if all(p["type"] == "text" for p in parts):
        return [*results, {"role": "user", "content": "\n\n".join(p["text"] for p in parts)}]
    return [*results, {"role": "user", "content": parts}]


def _assistant(blocks: list[dict[str, Any]]) -> list[dict[str, Any]]:
    text = "".join(b["text"] for b in blocks if _is_text(b))
    calls = [_tool_call(b) for b in blocks if b["type"] == "tool_use"]
    message: dict[str, Any] = {"role": "assistant", "content": text or None}
    if calls:
        message["tool_calls"] = calls
    return [message]


def _part(block: dict[str, Any], where: str) -> dict[str, Any]:
    kind = block["type"]
    if _is_text(block):
        return {"type": "text", "text": block["text"]}
    if kind == "image":
        return {"type": "image_url", "image_url": {"url": _image_url(block, where)}}
    raise BadRequest(f"{where}: a '{kind}' block cannot be sent to a chat backend.", param=where)


def _image_url(block: dict[str, Any], where: str) -> str:
    source = block.get("source") or {}
    if source.get("type") == "url" and isinstance(source.get("url"), str):
        return str(source["url"])
    media, data = source.get("media_type"), source.get("data")
    ok = source.get("type") == "base64" and isinstance(media, str) and isinstance(data, str)
    _require(ok, f"{where}.source: base64 data with a media_type, or a url", where)
    return f"data:{media};base64,{data}"


def _tool_result(block: dict[str, Any], where: str) -> dict[str, Any]:
    content = block.get("content", "")
    if isinstance(content, list):
        texts = [b for b in content if _is_text(b)]
        _require(len(texts) == len(content), f"{where}: a tool_result of text only", where)
        content = "\n\n".join(b["text"] for b in texts)
    _require(isinstance(content, str), f"{where}: a tool_result's content", where)
    call_id = block.get("tool_use_id")
    _require(isinstance(call_id, str), f"{where}: a tool_result needs tool_use_id", where)
    return {"role": "tool", "tool_call_id": call_id, "content": content}


def _tool_call(block: dict[str, Any]) -> dict[str, Any]:
    arguments = orjson.dumps(block.get("input") or {}).decode()
    function = {"name": block.get("name"), "arguments": arguments}
    return {"id": block.get("id"), "type": "function", "function": function}


def _tool(tool: Any, where: str) -> dict[str, Any]:
    ok = isinstance(tool, dict) and isinstance(tool.get("name"), str)
    _require(ok, f"{where}: a tool needs a name", where)
    kind = tool.get("type", "custom")
    _require(kind == "custom", f"{where}: the server tool '{kind}' is not available here", where)
    function = {"name": tool["name"], "parameters": tool.get("input_schema") or {}}
    if tool.get("description"):
        function["description"] = tool["description"]
    return {"type": "function", "function": function}


def _tool_choice(choice: Any) -> dict[str, Any]:
    if not isinstance(choice, dict):
        return {}
    kind = choice.get("type")
    chat: dict[str, Any] = {}
    if kind in ("auto", "none"):
        chat["tool_choice"] = kind
    elif kind == "any":
        chat["tool_choice"] = "required"
    elif kind == "tool" and isinstance(choice.get("name"), str):
        chat["tool_choice"] = {"type": "function", "function": {"name": choice["name"]}}
    else:
        raise BadRequest(
            "tool_choice: type auto, any, tool (with a name) or none.", param="tool_choice"
        )
    if choice.get("disable_parallel_tool_use") is True:
        chat["parallel_tool_calls"] = False
    return chat


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
    chat = chat if isinstance(chat, dict) else {}
    prompt = int(chat.get("prompt_tokens") or 0)
    cached = int((chat.get("prompt_tokens_details") or {}).get("cached_tokens") or 0)
    return {
        "input_tokens": prompt - cached,
        "output_tokens": int(chat.get("completion_tokens") or 0),
        "cache_read_input_tokens": cached,
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


def _is_text(block: Any) -> bool:
    return (
        isinstance(block, dict)
        and block.get("type") == "text"
        and isinstance(block.get("text"), str)
    )


def _strings(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(v, str) for v in value)


def _count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def _require(condition: bool, message: str, param: str | None) -> None:
    if not condition:
        raise BadRequest(message, param=param)
