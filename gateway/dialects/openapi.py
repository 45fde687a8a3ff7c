"""The OpenAPI description of the dialects' routes (gateway/dialects/): Anthropic's Messages
API, with its own error shape, and OpenAI's Responses API with its stored responses. Part
of the document gateway/openapi.py serves, which passes its error and answer builders."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

Schema = dict[str, Any]
Errors = Callable[..., Schema]  # statuses (and `schema=`) -> their documented error answers
Ok = Callable[[Schema, str], Schema]  # (schema, description) -> the 200 answer
_JSON = "application/json"


def dialect_paths(errors: Errors, ok: Ok) -> Schema:
    return {**_anthropic_paths(errors, ok), **_responses_paths(errors, ok)}


_ANTHROPIC_ERROR = {
    "type": "object",
    "required": ["type", "error"],
    "properties": {
        "type": {"const": "error"},
        "error": {
            "type": "object",
            "required": ["type", "message"],
            "properties": {"type": {"type": "string"}, "message": {"type": "string"}},
        },
    },
}
_TURN = {
    "type": "object",
    "required": ["role", "content"],
    "properties": {
        "role": {"enum": ["user", "assistant"]},
        "content": {"anyOf": [{"type": "string"}, {"type": "array", "items": {"type": "object"}}]},
    },
}


def _anthropic_paths(errors_of: Errors, ok_of: Ok) -> dict[str, Any]:
    """Anthropic's Messages API (gateway/dialects/anthropic.py): its own error shape."""
    request = {
        "type": "object",
        "required": ["model", "messages"],
        "properties": {
            "model": {"type": "string"},
            "max_tokens": {"type": "integer", "minimum": 1},
            "messages": {"type": "array", "items": _TURN, "minItems": 1},
            "system": {"anyOf": [{"type": "string"}, {"type": "array"}]},
            "stream": {"type": "boolean"},
            "tools": {"type": "array", "items": {"type": "object"}},
        },
    }

    def post(summary: str, answer: dict[str, Any], streams: bool) -> dict[str, Any]:
        content: dict[str, Any] = {_JSON: {"schema": answer}}
        if streams:
            content["text/event-stream"] = {"schema": {"type": "string"}}
        ok = ok_of(answer, summary)
        ok["200"]["content"] = content
        statuses = (400, 401, 403, 404, 408, 413, 429, 502, 503, 504)
        return {
            "post": {
                "summary": summary,
                "tags": ["anthropic"],
                "security": [{"anthropicKey": []}, {"tenantKey": []}],
                "requestBody": {"required": True, "content": {_JSON: {"schema": request}}},
                "responses": {**ok, **errors_of(*statuses, schema=_ANTHROPIC_ERROR)},
            }
        }

    message = {
        "type": "object",
        "required": ["id", "type", "role", "content", "stop_reason", "usage"],
        "properties": {"type": {"const": "message"}, "content": {"type": "array"}},
    }
    counted = {
        "type": "object",
        "required": ["input_tokens"],
        "properties": {"input_tokens": {"type": "integer"}},
    }
    return {
        "/v1/messages": post("Create a message (SSE when `stream` is true)", message, True),
        "/v1/messages/count_tokens": post("Estimate a message's input tokens", counted, False),
    }


_RESPONSES_REQUEST = {
    "type": "object",
    "required": ["model", "input"],
    "properties": {
        "model": {"type": "string"},
        "input": {"anyOf": [{"type": "string"}, {"type": "array", "items": {"type": "object"}}]},
        "instructions": {"type": "string"},
        "max_output_tokens": {"type": "integer", "minimum": 1},
        "previous_response_id": {"type": "string"},
        "store": {"type": "boolean"},
        "stream": {"type": "boolean"},
        "tools": {"type": "array", "items": {"type": "object"}},
    },
}
_RESPONSE = {
    "type": "object",
    "required": ["id", "object", "status", "output"],
    "properties": {"object": {"const": "response"}, "output": {"type": "array"}},
}
_DELETED = {
    "type": "object",
    "required": ["id", "object", "deleted"],
    "properties": {"deleted": {"const": True}},
}
_ITEMS = {
    "type": "object",
    "required": ["object", "data"],
    "properties": {"data": {"type": "array"}},
}
_RESPONSE_ID = {"name": "response_id", "in": "path", "required": True, "schema": {"type": "string"}}


def _responses_paths(errors_of: Errors, ok_of: Ok) -> dict[str, Any]:
    """OpenAI's Responses API (gateway/dialects/responses.py, stored.py)."""
    created = ok_of(_RESPONSE, "The response (SSE of typed events when `stream` is true).")
    created["200"]["content"].update({"text/event-stream": {"schema": {"type": "string"}}})

    def operation(summary: str, ok: dict[str, Any], *errors: int, **extra: Any) -> dict[str, Any]:
        return {
            "summary": summary,
            "tags": ["responses"],
            "security": [{"tenantKey": []}],
            "responses": {**ok, **errors_of(401, 503, *errors)},
            **extra,
        }

    body = {"requestBody": {"required": True, "content": {_JSON: {"schema": _RESPONSES_REQUEST}}}}
    errors = (400, 403, 404, 408, 413, 429, 502, 504)
    one = [_RESPONSE_ID]
    return {
        "/v1/responses": {"post": operation("Create a response", created, *errors, **body)},
        "/v1/responses/{response_id}": {
            "parameters": one,
            "get": operation("A stored response", ok_of(_RESPONSE, "The response."), 404),
            "delete": operation("Delete a stored response", ok_of(_DELETED, "Deleted."), 404),
        },
        "/v1/responses/{response_id}/input_items": {
            "parameters": one,
            "get": operation("A stored response's input items", ok_of(_ITEMS, "The items."), 404),
        },
        "/v1/responses/{response_id}/cancel": {
            "parameters": one,
            "post": operation("Cancel (background responses only: none here)", {}, 400, 404),
        },
    }
