"""A Responses API request as a chat completions request (its answer: responses.py).

`instructions` become a system message; `input` (a string, or items) becomes
turns: messages (`input_text`, `input_image`, `output_text`), `function_call` items an
assistant turn's `tool_calls`, `function_call_output` items `tool` messages (reasoning
items are dropped: a chat backend cannot take them back). With `previous_response_id`, the
stored conversation of that response comes first (its instructions do not, as the API
says). `max_output_tokens`, function `tools`, `tool_choice`, `parallel_tool_calls`,
`text.format` and the sampling fields map to their chat fields. What a chat backend cannot
do (built-in tools, background responses, file ids, item references) is refused with a
400 that names it.
"""

from __future__ import annotations

from typing import Any

from gateway.errors import BadRequest

SAMPLING = ("temperature", "top_p")
ROLES = {"user": "user", "assistant": "assistant", "system": "system", "developer": "system"}


def input_items(value: Any) -> list[dict[str, Any]]:
    """`input` as a list of items (a string is one user message)."""
    if isinstance(value, str):
        return [{"type": "message", "role": "user", "content": value}]
    if not isinstance(value, list) or not all(isinstance(i, dict) for i in value):
        raise BadRequest("input: a string or a list of items", param="input")
    return value


def turns(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Input items as chat messages; consecutive function calls are one assistant turn."""
    messages: list[dict[str, Any]] = []
    for i, item in enumerate(items):
        kind, where = item.get("type", "message"), f"input.{i}"
        if kind == "message":
            messages.append(_message(item, where))
        elif kind == "function_call":
            _call(messages, item, where)
        elif kind == "function_call_output":
            messages.append(_call_output(item, where))
        elif kind != "reasoning":
            raise BadRequest(
                f"{where}: a '{kind}' item cannot be sent to a chat backend", param=where
            )
    return messages


def _message(item: dict[str, Any], where: str) -> dict[str, Any]:
    role = ROLES.get(item.get("role"))  # type: ignore[arg-type]
    if role is None:
        raise BadRequest(f"{where}.role: user, assistant, system or developer", param=where)
    content = item.get("content")
    if isinstance(content, str):
        return {"role": role, "content": content}
    if not isinstance(content, list):
        raise BadRequest(f"{where}.content: a string or content parts", param=where)
    parts = [_part(p, f"{where}.content.{j}") for j, p in enumerate(content)]
    if role != "user" or all(p["type"] == "text" for p in parts):
        return {"role": role, "content": "".join(p.get("text", "") for p in parts)}
    return {"role": role, "content": parts}


def _part(part: Any, where: str) -> dict[str, Any]:
    kind = part.get("type") if isinstance(part, dict) else None
    if kind in ("input_text", "output_text", "text", "refusal"):
        text = part.get("text", part.get("refusal"))
        if isinstance(text, str):
            return {"type": "text", "text": text}
    if kind == "input_image" and isinstance(part.get("image_url"), str):
        image = {"url": part["image_url"], "detail": part.get("detail") or "auto"}
        return {"type": "image_url", "image_url": image}
    raise BadRequest(f"{where}: a '{kind}' part cannot be sent to a chat backend", param=where)


def _call(messages: list[dict[str, Any]], item: dict[str, Any], where: str) -> None:
    name, arguments, call_id = item.get("name"), item.get("arguments"), item.get("call_id")
    if not (isinstance(name, str) and isinstance(arguments, str) and isinstance(call_id, str)):
        raise BadRequest(f"{where}: a function_call needs call_id, name and arguments", param=where)
    call = {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}
    last = messages[-1] if messages else None
    if last is not None and last["role"] == "assistant" and "tool_calls" in last:
        last["tool_calls"].append(call)
    else:
        messages.append({"role": "assistant", "content": None, "tool_calls": [call]})


def _call_output(item: dict[str, Any], where: str) -> dict[str, Any]:
    output, call_id = item.get("output"), item.get("call_id")
    if isinstance(output, list):
        output = "".join(_part(p, f"{where}.output").get("text", "") for p in output)
    if not (isinstance(output, str) and isinstance(call_id, str)):
        raise BadRequest(f"{where}: a function_call_output needs call_id and output", param=where)
    return {"role": "tool", "tool_call_id": call_id, "content": output}


def chat_options(fields: dict[str, Any]) -> dict[str, Any]:
    chat: dict[str, Any] = {k: fields[k] for k in SAMPLING if fields.get(k) is not None}
    if fields.get("max_output_tokens") is not None:
        chat["max_tokens"] = fields["max_output_tokens"]
    for name in ("user", "prompt_cache_key"):  # prompt_cache_key: the replica affinity's
        if isinstance(fields.get(name), str):
            chat[name] = fields[name]
    if fields.get("stream") is True:
        chat["stream"] = True
        chat["stream_options"] = {"include_usage": True}  # the final response's usage
    if fields.get("tools"):
        chat["tools"] = [_tool(t, f"tools.{i}") for i, t in enumerate(fields["tools"])]
    if fields.get("tool_choice") is not None:
        chat["tool_choice"] = _tool_choice(fields["tool_choice"])
    if fields.get("parallel_tool_calls") is not None:
        chat["parallel_tool_calls"] = fields["parallel_tool_calls"]
    chat.update(_format(fields.get("text")))
    return chat


def _tool(tool: Any, where: str) -> dict[str, Any]:
    kind = tool.get("type") if isinstance(tool, dict) else None
    if kind != "function" or not isinstance(tool.get("name"), str):
        raise BadRequest(
            f"{where}: only function tools (with a name) are available here", param=where
        )
    function = {"name": tool["name"], "parameters": tool.get("parameters") or {}}
    function.update({k: tool[k] for k in ("description", "strict") if tool.get(k) is not None})
    return {"type": "function", "function": function}


def _tool_choice(choice: Any) -> Any:
    if choice in ("auto", "none", "required"):
        return choice
    if (
        isinstance(choice, dict)
        and choice.get("type") == "function"
        and isinstance(choice.get("name"), str)
    ):
        return {"type": "function", "function": {"name": choice["name"]}}
    raise BadRequest("tool_choice: auto, none, required or a function by name", param="tool_choice")


def _format(text: Any) -> dict[str, Any]:
    shape = text.get("format") if isinstance(text, dict) else None
    kind = shape.get("type") if isinstance(shape, dict) else None
    if shape is None or kind == "text":
        return {}
    assert isinstance(shape, dict)
    if kind == "json_object":
        return {"response_format": {"type": "json_object"}}
    if kind == "json_schema":
        schema = {k: shape[k] for k in ("name", "schema", "strict", "description") if k in shape}
        return {"response_format": {"type": "json_schema", "json_schema": schema}}
    raise BadRequest("text.format: text, json_object or json_schema", param="text.format")


def refuse_unsupported(fields: dict[str, Any]) -> None:
    if fields.get("background") is True:
        raise BadRequest("background responses are not available here", param="background")
    if fields.get("conversation") is not None:
        raise BadRequest("conversation: use previous_response_id here", param="conversation")
