"""The typed OpenAI request: the parts of each body the gateway checks, and what the
path needs of it (its kind, streaming, token sizes, cacheability inputs). Unknown
(vendor) fields pass through; the raw bytes are forwarded unchanged.

Sampling and size parameters are checked against OpenAI's own ranges (its error codes
too: `integer_below_min_value`, `decimal_above_max_value`...), all optional and nullable.
Token counts stop at `MAX_TOKENS` (2^31 - 1): OpenAI refuses anything above the model's
context, which the gateway does not know, and no model's context comes near this bound;
it keeps absurd values (a negative count, 2^70) from the quotas and the upstream.

Chat messages are checked as OpenAI checks them: the role (system, developer, user,
assistant, tool, the legacy function), the content each role may have (a string or an array
of the parts it takes; null only for an assistant message with `tool_calls` or
`function_call`), `tool_call_id` on tool messages. A refused body is a 400 in OpenAI's
words, with `param` the offending field as OpenAI names it (`messages[0].content[1].text`)
and OpenAI's code (`invalid_type`, `invalid_value`, `missing_required_parameter`...).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import TYPE_CHECKING, Annotated, Any, ClassVar, Literal, Self

from pydantic import (
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    StrictBool,
    StrictFloat,
    StrictInt,
    StrictStr,
    Tag,
    TypeAdapter,
    ValidationError,
    model_validator,
)
from pydantic_core import PydanticCustomError

from cache.policy import CacheInputs
from gateway.errors import BadRequest
from gateway.openai_errors import bad_request, json_object

NonEmptyStr = Annotated[StrictStr, Field(min_length=1)]
# A model name is a client's string until it routes; capped so that an unknown one costs
# little in the 404 and the log line (OpenAI's own model ids are far shorter).
MAX_MODEL_CHARS = 256
ModelName = Annotated[StrictStr, Field(min_length=1, max_length=MAX_MODEL_CHARS)]
MAX_TOKENS = 2**31 - 1
MAX_CHOICES = 128  # OpenAI's bound on `n`
TokenCount = Annotated[StrictInt, Field(ge=1, le=MAX_TOKENS)]
Choices = Annotated[StrictInt, Field(ge=1, le=MAX_CHOICES)]
Temperature = Annotated[StrictFloat, Field(ge=0, le=2)]
TopP = Annotated[StrictFloat, Field(ge=0, le=1)]
Penalty = Annotated[StrictFloat, Field(ge=-2, le=2)]
Dimensions = Annotated[StrictInt, Field(ge=1)]


Kind = Literal["chat", "completions", "embeddings"]
# Where a backend serves each kind (below its base URL, which ends in /v1).
UPSTREAM_PATHS: dict[Kind, str] = {
    "chat": "/chat/completions",
    "completions": "/completions",
    "embeddings": "/embeddings",
}


class _Body(BaseModel):
    model_config = ConfigDict(extra="allow")
    kind: ClassVar[Kind]
    model: ModelName
    stream: StrictBool | None = False
    # Plain slots, set once by `parse_request`, not pydantic private attributes: those are
    # set up for every instance and read through `BaseModel.__getattr__` (about 2 us a
    # read), together about 4% of a proxied request's CPU (py-spy, bench/proxy_overhead.py).
    __slots__ = ("_json", "_prompt_tokens")
    if TYPE_CHECKING:
        # The body as the client sent it, in JSON values (for the cache namespace's hash:
        # validation turns 0 into 0.0, and the hash must not change with the version).
        _json: dict[str, Any]
        # The prompt's size in tokens: routing by size and the quota reservation both ask.
        _prompt_tokens: int

    @property
    def streamed(self) -> bool:
        return self.stream is True

    @property
    def include_usage(self) -> bool:
        """Did a stream ask for a final `usage` chunk (`stream_options.include_usage`)?"""
        options = (self.model_extra or {}).get("stream_options")
        return isinstance(options, dict) and options.get("include_usage") is True

    def fields(self) -> dict[str, Any]:
        """The body as the client sent it, in JSON values."""
        return self._json

    def prompt_tokens(self) -> int:
        """The prompt's size in tokens, estimated: characters / 4, plus token ids."""
        return self._prompt_tokens

    def _received(self, fields: dict[str, Any]) -> None:
        """Keeps what `parse_request` knows beside the checked fields (past pydantic's
        `__setattr__`, 1.5 us a call, which has nothing to check on a slot)."""
        chars, ids = self._prompt_size()
        object.__setattr__(self, "_json", fields)
        object.__setattr__(self, "_prompt_tokens", math.ceil(chars / 4) + ids)

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


class _Open(BaseModel):
    model_config = ConfigDict(extra="allow")


# Content parts, told apart by `type`.
class TextPart(_Open):
    type: Literal["text"]
    text: StrictStr


class ImageURL(_Open):
    url: StrictStr
    detail: Literal["auto", "low", "high"] | None = None


class ImagePart(_Open):
    type: Literal["image_url"]
    image_url: ImageURL


class InputAudio(_Open):
    data: StrictStr
    format: Literal["wav", "mp3"]


class AudioPart(_Open):
    type: Literal["input_audio"]
    input_audio: InputAudio


class FileInput(_Open):
    file_data: StrictStr | None = None
    file_id: StrictStr | None = None
    filename: StrictStr | None = None


class FilePart(_Open):
    type: Literal["file"]
    file: FileInput


class RefusalPart(_Open):
    type: Literal["refusal"]
    refusal: StrictStr


class VendorPart(_Open):
    """A user content part of a type OpenAI does not have (vLLM's `video_url`, `audio_url`,
    `image_embeds`...): passed through for the engine to judge."""

    type: NonEmptyStr


_OPENAI_USER_PARTS = frozenset({"text", "image_url", "input_audio", "file"})


def _user_part(value: Any) -> str | None:
    """The union member for a user content part: its `type`, or "vendor" for one OpenAI
    does not have; None (refused: no tag) when `type` is missing or not a string."""
    tag = value.get("type") if isinstance(value, dict) else getattr(value, "type", None)
    if not isinstance(tag, str) or not tag:
        return None
    return tag if tag in _OPENAI_USER_PARTS else "vendor"


UserPart = Annotated[
    Annotated[TextPart, Tag("text")]
    | Annotated[ImagePart, Tag("image_url")]
    | Annotated[AudioPart, Tag("input_audio")]
    | Annotated[FilePart, Tag("file")]
    | Annotated[VendorPart, Tag("vendor")],
    Discriminator(_user_part),
]
AssistantPart = Annotated[TextPart | RefusalPart, Field(discriminator="type")]
TextContent = StrictStr | Annotated[list[TextPart], Field(min_length=1)]


class _Message(_Open):
    content: Any
    name: StrictStr | None = None

    def size(self) -> tuple[int, int]:
        return _text_size(self.content)


class SystemMessage(_Message):
    role: Literal["system"]
    content: TextContent


class DeveloperMessage(_Message):
    role: Literal["developer"]
    content: TextContent


class UserMessage(_Message):
    role: Literal["user"]
    content: StrictStr | Annotated[list[UserPart], Field(min_length=1)]


class AssistantMessage(_Message):
    """`content` may be null, or left out, only when the message has `tool_calls` (or the
    legacy `function_call`)."""

    role: Literal["assistant"]
    content: StrictStr | Annotated[list[AssistantPart], Field(min_length=1)] | None = None
    refusal: StrictStr | None = None
    tool_calls: list[dict[str, Any]] | None = None
    function_call: dict[str, Any] | None = None

    @model_validator(mode="after")
    def _says_something(self) -> Self:
        if self.content is None and not self.tool_calls and self.function_call is None:
            raise PydanticCustomError(
                "assistant_content",
                "an assistant message without tool_calls or function_call needs content",
                {"given": "content" in self.model_fields_set},
            )
        return self

    def size(self) -> tuple[int, int]:
        calls = [call.get("function") for call in self.tool_calls or ()]
        arguments = [call.get("arguments") for call in calls if isinstance(call, dict)]
        return _sum([_text_size(self.content), _text_size(arguments)])


class ToolMessage(_Message):
    role: Literal["tool"]
    content: TextContent
    tool_call_id: StrictStr


class FunctionMessage(_Message):
    """The legacy answer to a `function_call`: OpenAI still takes it."""

    role: Literal["function"]
    content: StrictStr | None
    name: StrictStr


Message = Annotated[
    SystemMessage
    | DeveloperMessage
    | UserMessage
    | AssistantMessage
    | ToolMessage
    | FunctionMessage,
    Field(discriminator="role"),
]


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
    dimensions: Dimensions | None = None

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
    fields = json_object(raw)
    try:
        request: OpenAIRequest = _ADAPTERS[kind].validate_python(fields)
    except ValidationError as exc:
        raise bad_request(exc, fields) from exc
    request._received(fields)
    return request


def _text_size(value: object) -> tuple[int, int]:
    """(characters of text, token ids) in a prompt, an input or a message's content."""
    if isinstance(value, str):
        return len(value), 0
    if isinstance(value, int) and not isinstance(value, bool):
        return 0, 1
    if isinstance(value, list):
        return _sum(_text_size(item) for item in value)
    if isinstance(value, TextPart):  # of content parts only text counts, not image data
        return len(value.text), 0
    return 0, 0


def _sum(sizes: Iterable[tuple[int, int]]) -> tuple[int, int]:
    chars = ids = 0
    for c, i in sizes:
        chars, ids = chars + c, ids + i
    return chars, ids
