"""A Messages API request as a chat completions request (its answer: anthropic.py).

`system` becomes a system message; a user turn's `tool_result` blocks become
`tool` messages (before the turn's other content, as Anthropic orders them); text and
image blocks become content parts; an assistant turn's `tool_use` blocks become
`tool_calls` (thinking blocks are dropped: a chat backend cannot take them back);
`tools`, `tool_choice`, `stop_sequences`, `metadata.user_id` map to their chat fields. A
block or tool the chat API cannot carry (documents, server tools, images in a tool result)
is refused with a 400 that names it, never dropped.
"""

from __future__ import annotations

from typing import Any

import orjson

from gateway.errors import BadRequest

SAMPLING = ("temperature", "top_p", "top_k")


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
