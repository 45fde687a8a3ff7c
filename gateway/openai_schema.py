"""The parts of OpenAI's request bodies the gateway checks. Unknown fields pass through.

Sampling and size parameters are checked against OpenAI's own ranges (its error codes
too: `integer_below_min_value`, `decimal_above_max_value`...), all optional and nullable.
Token counts stop at `MAX_TOKENS` (2^31 - 1): OpenAI refuses anything above the model's
context, which the gateway does not know, and no model's context comes near this bound;
it keeps absurd values (a negative count, 2^70) from the quotas and the upstream.
"""

from __future__ import annotations

from typing import Annotated, Any

import orjson
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictFloat,
    StrictInt,
    StrictStr,
    TypeAdapter,
    ValidationError,
)
from pydantic_core import ErrorDetails

from gateway.errors import BadRequest

NonEmptyStr = Annotated[StrictStr, Field(min_length=1)]
MAX_TOKENS = 2**31 - 1
MAX_CHOICES = 128  # OpenAI's bound on `n`
TokenCount = Annotated[StrictInt, Field(ge=1, le=MAX_TOKENS)]
Choices = Annotated[StrictInt, Field(ge=1, le=MAX_CHOICES)]
Temperature = Annotated[StrictFloat, Field(ge=0, le=2)]
TopP = Annotated[StrictFloat, Field(ge=0, le=1)]
Penalty = Annotated[StrictFloat, Field(ge=-2, le=2)]


class _Body(BaseModel):
    model_config = ConfigDict(extra="allow")
    model: NonEmptyStr
    stream: StrictBool | None = False


class Message(BaseModel):
    model_config = ConfigDict(extra="allow")
    role: NonEmptyStr
    content: Any = None


class _Sampled(_Body):
    max_tokens: TokenCount | None = None
    n: Choices | None = None
    temperature: Temperature | None = None
    top_p: TopP | None = None
    presence_penalty: Penalty | None = None
    frequency_penalty: Penalty | None = None


class ChatRequest(_Sampled):
    messages: Annotated[list[Message], Field(min_length=1)]
    max_completion_tokens: TokenCount | None = None


class CompletionRequest(_Sampled):
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
    bound = _BOUNDS.get(error["type"])
    if bound is not None:
        return _out_of_range(param, error, *bound)
    return BadRequest(f"Invalid value for '{param}': {error['msg']}.", param=param)


# pydantic's error type -> (the limit in its context, how OpenAI names it, its comparison)
_BOUNDS = {
    "greater_than_equal": ("ge", "below_min_value", "minimum value", ">="),
    "less_than_equal": ("le", "above_max_value", "maximum value", "<="),
}


def _out_of_range(
    param: str, error: ErrorDetails, limit: str, code: str, name: str, sign: str
) -> BadRequest:
    """OpenAI's wording: "Invalid 'n': integer below minimum value. Expected a value >= 1,
    but got 0 instead." with code `integer_below_min_value` (or `decimal_...`)."""
    expected = error.get("ctx", {}).get(limit)
    number = "integer" if isinstance(expected, int) else "decimal"
    shown = int(expected) if isinstance(expected, float) and expected.is_integer() else expected
    message = (
        f"Invalid '{param}': {number} {code.split('_')[0]} {name}. "
        f"Expected a value {sign} {shown}, but got {error['input']} instead."
    )
    return BadRequest(message, param=param, code=f"{number}_{code}")
