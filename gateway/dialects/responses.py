"""OpenAI's Responses API (`POST /v1/responses`) as chat completions, and back: the
request through gateway/dialects/responses_request.py; here its answer, and its storing.

A chat completion becomes a `response` whose `output` holds a `message` item
(`output_text`) and a `function_call` item per tool call; `status` is `incomplete` when
the answer hit its token cap. A stream becomes the typed events in the API's order:
`response.created`, `response.in_progress`, per item `response.output_item.added`, its
deltas (`response.output_text.delta` after `response.content_part.added`, or
`response.function_call_arguments.delta`) and their `.done` events, then
`response.completed` (or `response.incomplete`, or `response.failed` for an error
mid-stream), each with its `sequence_number`. Errors before the answer are OpenAI's error
JSON already, and pass unchanged.

A response is stored (`store`, true by default) once it has been sent whole, for
`previous_response_id` and `GET /v1/responses/{id}` (gateway/dialects/stored.py).

Reference: https://platform.openai.com/docs/api-reference/responses
"""

from __future__ import annotations

import logging
import random
import time
from typing import Any

import orjson

from gateway.dialects.responses_request import (
    chat_options,
    input_items,
    refuse_unsupported,
    turns,
)
from gateway.dialects.stored import ResponseStore, Stored
from gateway.dialects.translated import ChatStream, sse_event
from gateway.errors import BadRequest, NotFound
from gateway.openai_errors import json_object
from gateway.usage import token_usage

_log = logging.getLogger(__name__)
ECHOED = ("instructions", "max_output_tokens", "metadata", "previous_response_id", "user")
INCOMPLETE = {"length": "max_output_tokens", "content_filter": "content_filter"}


def new_id(prefix: str) -> str:
    # Unique, not secret: a stored response is found only within its tenant.
    return f"{prefix}_{random.getrandbits(192):048x}"


class Responses:
    """One `/v1/responses` request (`gateway.dialects.Dialect`)."""

    # Always translated: the gateway keeps stored responses itself, for every backend and
    # replica (vLLM's own store is its process's: `previous_response_id` would name a
    # response another replica never saw).
    native_path: str | None = None

    def __init__(self, store: ResponseStore) -> None:
        self._store = store
        self.id = new_id("resp")
        self.created_at = int(time.time())
        self._fields: dict[str, Any] = {}
        self._owner = ""
        self._history: list[dict[str, Any]] = []  # the conversation, without instructions
        self._input: list[dict[str, Any]] = []
        self._final: dict[str, Any] | None = None  # the response, once complete
        self._stream = _Stream(self)

    def pass_through(self) -> None:
        raise AssertionError("the Responses API is always translated (native_path is None)")

    async def to_chat(self, raw: bytes, owner: str) -> bytes:
        fields = json_object(raw)
        self._owner, self._fields = owner, fields
        refuse_unsupported(fields)
        model = fields.get("model")
        if not isinstance(model, str) or not model:
            raise BadRequest("model: a model name is required", param="model")
        self._input = input_items(fields.get("input"))
        self._history = [*await self._previous(fields), *turns(self._input)]
        chat: dict[str, Any] = {"model": model, "messages": self._messages()}
        chat.update(chat_options(fields))
        return orjson.dumps(chat)

    async def _previous(self, fields: dict[str, Any]) -> list[dict[str, Any]]:
        previous = fields.get("previous_response_id")
        if previous is None:
            return []
        if not isinstance(previous, str):
            raise BadRequest("previous_response_id: a response id", param="previous_response_id")
        stored = await self._store.get(self._owner, previous)
        if stored is None:
            raise NotFound(f"Previous response with id '{previous}' not found.")
        return stored.history

    def _messages(self) -> list[dict[str, Any]]:
        instructions = self._fields.get("instructions")
        if instructions is None:
            return self._history
        if not isinstance(instructions, str):
            raise BadRequest("instructions: a string", param="instructions")
        return [{"role": "system", "content": instructions}, *self._history]

    def response(self, status: str, output: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
        """The response object with the request's own fields echoed, as the API does."""
        fields = self._fields
        return {
            "id": self.id,
            "object": "response",
            "created_at": self.created_at,
            "status": status,
            "model": fields.get("model"),
            "output": output,
            "error": None,
            "incomplete_details": None,
            "usage": None,
            **{k: fields.get(k) for k in ECHOED},
            "parallel_tool_calls": fields.get("parallel_tool_calls", True),
            "temperature": fields.get("temperature", 1.0),
            "top_p": fields.get("top_p", 1.0),
            "tool_choice": fields.get("tool_choice", "auto"),
            "tools": fields.get("tools") or [],
            "text": fields.get("text") or {"format": {"type": "text"}},
            "store": fields.get("store", True),
            "truncation": "disabled",
            "background": False,
            **extra,
        }

    def completed(self, output: list[dict[str, Any]], finish: Any, usage: Any) -> dict[str, Any]:
        """The final response, remembered to be stored once sent."""
        reason = INCOMPLETE.get(finish) if isinstance(finish, str) else None
        details = {"reason": reason} if reason else None
        status = "incomplete" if reason else "completed"
        final = self.response(
            status, output, incomplete_details=details, usage=response_usage(usage)
        )
        self._final = final
        return final

    def whole(self, status: int, body: bytes) -> tuple[int, bytes]:
        if status != 200:
            return status, body  # OpenAI's error JSON already
        try:
            answer = orjson.loads(body)
            choice = answer["choices"][0]
            output = output_items(choice.get("message") or {})
            final = self.completed(output, choice.get("finish_reason"), answer.get("usage"))
        except (orjson.JSONDecodeError, LookupError, TypeError, AttributeError):
            return 502, _error("The backend's answer is not a chat completion.", "upstream_error")
        return 200, orjson.dumps(final)

    def events(self, events: list[bytes]) -> bytes:
        return b"".join(self._stream.event(e) for e in events)

    def end(self) -> bytes:
        return b""

    async def sent(self) -> None:
        final = self._final
        if final is None or self._fields.get("store", True) is False:
            return
        history = [*self._history, assistant_turn(final["output"])]
        listed = [listed_item(item) for item in self._input]
        if not await self._store.put(self._owner, Stored(final, history, listed)):
            _log.warning("response %s not stored: over responses.max_bytes_per_tenant", self.id)


class _Stream(ChatStream):
    """Chat chunks in, the Responses API's typed events out, one output item at a time."""

    def __init__(self, request: Responses) -> None:
        super().__init__()
        self._request = request
        self._sequence = 0
        self._open: dict[str, Any] | None = None  # the output item being streamed
        self._open_key: tuple[str, int] | None = None  # ("text", -1) or ("tool", index)
        self._output: list[dict[str, Any]] = []
        self._finish: Any = None

    def _emit(self, kind: str, **fields: Any) -> bytes:
        data = {"type": kind, "sequence_number": self._sequence, **fields}
        self._sequence += 1
        return sse_event(kind, orjson.dumps(data))

    def start(self, chunk: dict[str, Any]) -> bytes:
        response = self._request.response("in_progress", [])
        out = self._emit("response.created", response=response)
        return out + self._emit("response.in_progress", response=response)

    def delta(self, choice: dict[str, Any]) -> bytes:
        delta = choice.get("delta") or {}
        out = b""
        text = (delta.get("content") or "") + (delta.get("refusal") or "")
        if text:
            out += self._text(text)
        for call in delta.get("tool_calls") or []:
            out += self._arguments(call)
        if choice.get("finish_reason"):
            self._finish = choice["finish_reason"]
        return out

    def _text(self, text: str) -> bytes:
        out = b""
        if self._open_key != ("text", -1):
            out += self._close()
            item = {"id": new_id("msg"), "type": "message", "status": "in_progress"}
            out += self._added(("text", -1), {**item, "role": "assistant", "content": []})
            part = {"type": "output_text", "text": "", "annotations": []}
            out += self._emit("response.content_part.added", **self._at(0), part=part)
        assert self._open is not None
        self._open["text"] = self._open.get("text", "") + text
        return out + self._emit(
            "response.output_text.delta", **self._at(0), delta=text, logprobs=[]
        )

    def _arguments(self, call: dict[str, Any]) -> bytes:
        out = b""
        function = call.get("function") or {}
        if self._open_key != ("tool", call.get("index", 0)):
            out += self._close()
            item: dict[str, Any] = {"id": new_id("fc"), "type": "function_call"}
            item.update(status="in_progress", call_id=call.get("id"), name=function.get("name"))
            item["arguments"] = ""
            out += self._added(("tool", call.get("index", 0)), item)
        assert self._open is not None
        piece = function.get("arguments") or ""
        if not piece:
            return out
        self._open["arguments"] += piece
        where = {"item_id": self._open["id"], "output_index": len(self._output)}
        return out + self._emit("response.function_call_arguments.delta", **where, delta=piece)

    def _added(self, key: tuple[str, int], item: dict[str, Any]) -> bytes:
        self._open, self._open_key = item, key
        return self._emit("response.output_item.added", output_index=len(self._output), item=item)

    def _at(self, content_index: int) -> dict[str, Any]:
        assert self._open is not None
        item_id, index = self._open["id"], len(self._output)
        return {"item_id": item_id, "output_index": index, "content_index": content_index}

    def _close(self) -> bytes:
        item = self._open
        if item is None:
            return b""
        out = b""
        if item["type"] == "message":
            text = item.pop("text", "")
            part = {"type": "output_text", "text": text, "annotations": []}
            out += self._emit("response.output_text.done", **self._at(0), text=text, logprobs=[])
            out += self._emit("response.content_part.done", **self._at(0), part=part)
            item["content"] = [part]
        else:
            where = {"item_id": item["id"], "output_index": len(self._output)}
            arguments, name = item["arguments"], item["name"]
            out += self._emit(
                "response.function_call_arguments.done", **where, arguments=arguments, name=name
            )
        item["status"] = "completed"
        out += self._emit("response.output_item.done", output_index=len(self._output), item=item)
        self._output.append(item)
        self._open = self._open_key = None
        return out

    def done(self) -> bytes:
        out = self._close()
        final = self._request.completed(self._output, self._finish, self.usage)
        kind = "response.completed" if final["status"] == "completed" else "response.incomplete"
        return out + self._emit(kind, response=final)

    def failed(self, error: dict[str, Any]) -> bytes:
        out = b"" if self.started else self.start({})
        failure = {"code": error.get("code") or "server_error", "message": error.get("message")}
        response = self._request.response("failed", self._output, error=failure)
        return out + self._emit("response.failed", response=response)


def listed_item(item: dict[str, Any]) -> dict[str, Any]:
    """An input item as `input_items` lists it: with an id, a message's text as a part."""
    listed = {"id": new_id("msg"), "type": "message", **item}
    if listed["type"] == "message" and isinstance(listed.get("content"), str):
        kind = "output_text" if listed.get("role") == "assistant" else "input_text"
        listed["content"] = [{"type": kind, "text": listed["content"]}]
    return listed


def output_items(message: dict[str, Any]) -> list[dict[str, Any]]:
    """A chat message as output items: its text, then a function call per tool call."""
    items: list[dict[str, Any]] = []
    text = (message.get("content") or "") + (message.get("refusal") or "")
    if text:
        part: dict[str, Any] = {"type": "output_text", "text": text, "annotations": []}
        item = {"id": new_id("msg"), "type": "message", "status": "completed"}
        items.append({**item, "role": "assistant", "content": [part]})
    for call in message.get("tool_calls") or []:
        function = call.get("function") or {}
        item = {"id": new_id("fc"), "type": "function_call", "status": "completed"}
        arguments = function.get("arguments") or ""
        items.append(
            {
                **item,
                "call_id": call.get("id"),
                "name": function.get("name"),
                "arguments": arguments,
            }
        )
    return items


def assistant_turn(output: list[dict[str, Any]]) -> dict[str, Any]:
    """Output items as the chat assistant message they came from (for the history)."""
    text = "".join(
        part["text"] for item in output if item["type"] == "message" for part in item["content"]
    )
    calls = [
        {
            "id": i["call_id"],
            "type": "function",
            "function": {"name": i["name"], "arguments": i["arguments"]},
        }
        for i in output
        if i["type"] == "function_call"
    ]
    turn: dict[str, Any] = {"role": "assistant", "content": text or None}
    if calls:
        turn["tool_calls"] = calls
    return turn


def response_usage(chat: Any) -> dict[str, Any] | None:
    """The Responses API's usage for a chat `usage` (None: the answer had none)."""
    used = token_usage(chat)
    if used is None:
        return None
    reasoning = (chat.get("completion_tokens_details") or {}).get("reasoning_tokens") or 0
    return {
        "input_tokens": used.prompt,
        "input_tokens_details": {"cached_tokens": used.cached},
        "output_tokens": used.completion,
        "output_tokens_details": {"reasoning_tokens": int(reasoning)},
        "total_tokens": used.total,
    }


def _error(message: str, kind: str) -> bytes:
    return orjson.dumps({"error": {"message": message, "type": kind, "param": None, "code": None}})
