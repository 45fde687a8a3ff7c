"""The parts of OpenAI's request bodies the gateway checks. Unknown fields pass through."""

from __future__ import annotations

from typing import Annotated, Any

import orjson
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictStr,
    TypeAdapter,
    ValidationError,
)

from gateway.errors import BadRequest

NonEmptyStr = Annotated[StrictStr, Field(min_length=1)]


class _Body(BaseModel):
    model_config = ConfigDict(extra="allow")
    model: NonEmptyStr
    stream: StrictBool | None = False


class Message(BaseModel):
    model_config = ConfigDict(extra="allow")
    role: NonEmptyStr
    content: Any = None


class ChatRequest(_Body):
    messages: Annotated[list[Message], Field(min_length=1)]


class CompletionRequest(_Body):
    prompt: StrictStr | list[StrictStr] | list[int] | list[list[int]]


class EmbeddingRequest(_Body):
    input: StrictStr | list[StrictStr] | list[int] | list[list[int]]


Body = ChatRequest | CompletionRequest | EmbeddingRequest

_ADAPTERS: dict[str, TypeAdapter[Any]] = {
    "chat": TypeAdapter(ChatRequest),
    "completions": TypeAdapter(CompletionRequest),
    "embeddings": TypeAdapter(EmbeddingRequest),
}


def parse_body(kind: str, raw: bytes) -> tuple[Body, dict[str, Any]]:
    """The checked body, and the same body as plain JSON values (for quotas and the cache)."""
    if not raw:
        raise BadRequest("The request body is empty; send a JSON object.")
    try:
        fields = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise BadRequest(f"We could not parse the JSON body of your request: {exc}") from exc
    try:
        body: Body = _ADAPTERS[kind].validate_python(fields)
    except ValidationError as exc:
        raise _bad_request(exc) from exc
    return body, fields


def _bad_request(exc: ValidationError) -> BadRequest:
    error = exc.errors(include_url=False)[0]
    if error["type"].startswith("json") or not error["loc"]:
        return BadRequest(f"We could not parse the JSON body of your request: {error['msg']}")
    param = ".".join(
        str(part) for part in error["loc"] if not str(part).startswith(("list[", "str"))
    )
    if error["type"] == "missing":
        return BadRequest(f"Missing required parameter: '{param}'.", param=param)
    return BadRequest(f"Invalid value for '{param}': {error['msg']}.", param=param)
