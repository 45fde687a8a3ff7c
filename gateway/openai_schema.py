"""The typed OpenAI request: the parts of each body the gateway checks, and what the
path needs of it (its kind, streaming, token sizes, cacheability inputs). Unknown
(vendor) fields pass through; the raw bytes are forwarded unchanged.

Sampling and size parameters are checked against OpenAI's own ranges (its error codes
too: `integer_below_min_value`, `decimal_above_max_value`...), all optional and nullable.
Token counts stop at `MAX_TOKENS` (2^31 - 1): OpenAI refuses anything above the model's
context, which the gateway does not know, and no model's context comes near this bound;
it keeps absurd values (a negative count, 2^70) from the quotas and the upstream.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Annotated, Any, ClassVar, Literal

import orjson
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    StrictBool,
    StrictFloat,
    StrictInt,
    StrictStr,
    TypeAdapter,
    ValidationError,
)
from pydantic_core import ErrorDetails

from cache.policy import CacheInputs
from gateway.errors import BadRequest

NonEmptyStr = Annotated[StrictStr, Field(min_length=1)]
MAX_TOKENS = 2**31 - 1
MAX_CHOICES = 128  # OpenAI's bound on `n`
TokenCount = Annotated[StrictInt, Field(ge=1, le=MAX_TOKENS)]
Choices = Annotated[StrictInt, Field(ge=1, le=MAX_CHOICES)]
Temperature = Annotated[StrictFloat, Field(ge=0, le=2)]
TopP = Annotated[StrictFloat, Field(ge=0, le=1)]
Penalty = Annotated[StrictFloat, Field(ge=-2, le=2)]


Kind = Literal["chat", "completions", "embeddings"]


class _Body(BaseModel):
    model_config = ConfigDict(extra="allow")
    kind: ClassVar[Kind]
    model: NonEmptyStr
    stream: StrictBool | None = False
    # The body as the client sent it, in JSON values (for the cache namespace's hash:
    # validation turns 0 into 0.0, and the hash must not change with the gateway's version).
    _json: dict[str, Any] = PrivateAttr(default_factory=dict)

    @property
    def streamed(self) -> bool:
        return self.stream is True

    @property
    def include_usage(self) -> bool:
        """Did a stream ask for a final `usage` chunk (`stream_options.include_usage`)?"""
        options = (self.model_extra or {}).get("stream_options")
        return isinstance(options, dict) and options.get("include_usage") is True

    def prompt_tokens(self) -> int:
        """The prompt's size in tokens, estimated: characters / 4, plus token ids."""
        chars, ids = self._prompt_size()
        return math.ceil(chars / 4) + ids

    def output_budget(self, default: int) -> int:
        """Tokens the answer may take at most: the request's cap (`default` when it sets
        none) times the number of choices; embeddings complete nothing."""
        return 0

    def reserved_tokens(self, default_output: int) -> int:
        """What quotas reserve before the answer is known: prompt plus output budget."""
        return self.prompt_tokens() + self.output_budget(default_output)

    def cache_inputs(self) -> CacheInputs:
        """What the cache policy decides on: the body as JSON values, as the client sent it."""
        extra = self.model_extra or {}
        temperature = getattr(self, "temperature", None)
        return CacheInputs(
            self.kind,
            1.0 if temperature is None else temperature,
            getattr(self, "n", None) or 1,
            extra.get("tools") or extra.get("functions") or [],
            self._json,
        )

    def _prompt_size(self) -> tuple[int, int]:
        raise NotImplementedError


class Message(BaseModel):
    model_config = ConfigDict(extra="allow")
    role: NonEmptyStr
    content: Any = None

    def size(self) -> tuple[int, int]:
        calls = (self.model_extra or {}).get("tool_calls")
        arguments = [
            c.get("function", {}).get("arguments") for c in _items(calls) if isinstance(c, dict)
        ]
        return _sum([_text_size(self.content), _text_size(arguments)])


class _Sampled(_Body):
    max_tokens: TokenCount | None = None
    n: Choices | None = None
    temperature: Temperature | None = None
    top_p: TopP | None = None
    presence_penalty: Penalty | None = None
    frequency_penalty: Penalty | None = None

    def output_budget(self, default: int) -> int:
        cap = getattr(self, "max_completion_tokens", None) or self.max_tokens
        best_of = (self.model_extra or {}).get("best_of")
        wider = best_of if isinstance(best_of, int) and not isinstance(best_of, bool) else 1
        return (default if cap is None else cap) * max(self.n or 1, wider, 1)


class ChatRequest(_Sampled):
    kind: ClassVar[Kind] = "chat"
    messages: Annotated[list[Message], Field(min_length=1)]
    max_completion_tokens: TokenCount | None = None

    def _prompt_size(self) -> tuple[int, int]:
        return _sum(message.size() for message in self.messages)


class CompletionRequest(_Sampled):
    kind: ClassVar[Kind] = "completions"
    prompt: StrictStr | list[StrictStr] | list[int] | list[list[int]]

    def _prompt_size(self) -> tuple[int, int]:
        return _text_size(self.prompt)


class EmbeddingRequest(_Body):
    kind: ClassVar[Kind] = "embeddings"
    input: StrictStr | list[StrictStr] | list[int] | list[list[int]]

    def _prompt_size(self) -> tuple[int, int]:
        return _text_size(self.input)


OpenAIRequest = ChatRequest | CompletionRequest | EmbeddingRequest

_ADAPTERS: dict[str, TypeAdapter[Any]] = {
    "chat": TypeAdapter(ChatRequest),
    "completions": TypeAdapter(CompletionRequest),
    "embeddings": TypeAdapter(EmbeddingRequest),
}


def parse_request(kind: Kind, raw: bytes) -> OpenAIRequest:
    """The checked body of a request to the `kind` endpoint; vendor fields pass through."""
    if not raw:
        raise BadRequest("The request body is empty; send a JSON object.")
    try:
        fields = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise BadRequest(f"We could not parse the JSON body of your request: {exc}") from exc
    try:
        request: OpenAIRequest = _ADAPTERS[kind].validate_python(fields)
    except ValidationError as exc:
        raise _bad_request(exc) from exc
    request._json = fields
    return request


def _text_size(value: object) -> tuple[int, int]:
    """(characters of text, token ids) in a prompt, an input or a message's content."""
    if isinstance(value, str):
        return len(value), 0
    if isinstance(value, int) and not isinstance(value, bool):
        return 0, 1
    if isinstance(value, list):
        return _sum(_text_size(item) for item in value)
    if isinstance(value, dict):  # a content part: only its text counts, not image data
        return _text_size(value.get("text"))
    return 0, 0


def _sum(sizes: Iterable[tuple[int, int]]) -> tuple[int, int]:
    chars = ids = 0
    for c, i in sizes:
        chars, ids = chars + c, ids + i
    return chars, ids


def _items(value: object) -> list[Any]:
    return value if isinstance(value, list) else []


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
