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

import json
import math
import re
from collections.abc import Iterable
from typing import Annotated, Any, ClassVar, Literal, Self

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
    model_validator,
)
from pydantic_core import ErrorDetails, PydanticCustomError

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
Dimensions = Annotated[StrictInt, Field(ge=1)]


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


UserPart = Annotated[TextPart | ImagePart | AudioPart | FilePart, Field(discriminator="type")]
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
    try:
        fields = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise _unparsable(raw, str(exc)) from exc
    if not isinstance(fields, dict):
        raise BadRequest(_NOT_PARSED.format(f"a JSON object, but got {_kind_of(fields)}"))
    try:
        request: OpenAIRequest = _ADAPTERS[kind].validate_python(fields)
    except ValidationError as exc:
        raise _bad_request(exc, fields) from exc
    request._json = fields
    return request


_NOT_PARSED = (
    "We could not parse the JSON body of your request. (HINT: This likely means you aren't "
    "using your HTTP library correctly. The API expects {}.)"
)


def _unparsable(raw: bytes, reason: str) -> BadRequest:
    """Why a body is not JSON, in the client's terms: bytes that are not UTF-8, an escaped
    lone surrogate (valid to some parsers, not UTF-8), or where the JSON breaks."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        return BadRequest(
            "The request body is not valid UTF-8 JSON: the byte at offset "
            f"{exc.start} is not UTF-8. Send JSON encoded as UTF-8."
        )
    try:
        json.dumps(json.loads(text), ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        return BadRequest(
            "The request body is not valid UTF-8 JSON: a string holds an unpaired "
            "surrogate escape (\\ud800 to \\udfff), which no UTF-8 text can encode."
        )
    except (ValueError, RecursionError):
        pass
    return BadRequest(_NOT_PARSED.format(f"a JSON object, but what was sent is not JSON: {reason}"))


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


def _bad_request(exc: ValidationError, body: dict[str, Any]) -> BadRequest:
    """The first thing wrong with the body, as OpenAI words it. A field of several types
    fails once per type; the error that got deepest into the value is the one meant (a
    part of an array of content parts, not "not a string"), and where all stop at the field
    itself, its type is wrong: the types it may have are listed together."""
    errors = [(_param(error, body), error) for error in exc.errors(include_url=False)]
    deepest = max(len(path) for path, _ in errors)
    at = [(path, error) for path, error in errors if len(path) == deepest]
    path, error = next(((p, e) for p, e in at if e["type"] not in _TYPES), at[0])
    param = _name(path)
    kind = error["type"]
    if kind in _TYPES:
        expected = list(dict.fromkeys(_TYPES[e["type"]] for _, e in at if e["type"] in _TYPES))
        return _invalid_type(param, expected, error["input"])
    if kind == "missing":
        return _missing(param)
    if kind in ("union_tag_not_found", "union_tag_invalid"):
        return _bad_tag(param, error)
    if kind == "literal_error":
        return _invalid_value(param, error["input"], error.get("ctx", {}).get("expected", ""))
    if kind == "assistant_content":
        param += ".content"
        why = " (an assistant message may go without it only with 'tool_calls' or 'function_call')"
        if not error.get("ctx", {}).get("given"):
            return _missing(param, why)
        return _invalid_type(param, ["a string", "an array"], None, why)
    if kind in ("string_too_short", "too_short"):
        what = "string" if kind == "string_too_short" else "array"
        return BadRequest(
            f"Invalid '{param}': empty {what}. Expected {_a(what)} with minimum length 1, "
            f"but got an empty {what} instead.",
            param=param,
            code=f"empty_{what}",
        )
    bound = _BOUNDS.get(kind)
    if bound is not None:
        return _out_of_range(param, error, *bound)
    return BadRequest(f"Invalid value for '{param}': {error['msg']}.", param=param)


# Where a discriminated union stands in the body, the field that tells its members apart:
# pydantic puts the member's tag into the error's location, after the item's index.
_TAGGED = {"messages": "role", "content": "type"}


def _param(error: ErrorDetails, body: dict[str, Any]) -> list[str | int]:
    """The error's location as a path into the body, without pydantic's own steps (the
    members of a union: `str`, `list[...]`, a tag): those that do not index the value."""
    path: list[str | int] = []
    value: Any = body
    tag: str | None = None
    loc = error["loc"]
    for at, part in enumerate(loc):
        if isinstance(part, int):
            tag = None
            if isinstance(value, list) and 0 <= part < len(value):
                key = _TAGGED.get(str(path[-1])) if path else None
                value = value[part]
                tag = value.get(key) if key is not None and isinstance(value, dict) else None
            path.append(part)
        elif isinstance(value, dict) and part == tag:
            tag = None  # the member of a discriminated union, named by its tag
        elif isinstance(value, dict) and part in value:
            value, tag = value[part], None
            path.append(part)
        elif isinstance(value, dict) and error["type"] == "missing" and at == len(loc) - 1:
            path.append(part)
    return path


def _name(path: list[str | int]) -> str:
    """OpenAI's name for a field: `messages[0].content[1].text`."""
    name = ""
    for part in path:
        name += f"[{part}]" if isinstance(part, int) else f".{part}" if name else part
    return name


# pydantic's type errors -> what the field takes, in OpenAI's words
_TYPES = {
    "string_type": "a string",
    "int_type": "an integer",
    "float_type": "a decimal",
    "bool_type": "a boolean",
    "list_type": "an array",
    "dict_type": "an object",
    "model_type": "an object",
    "model_attributes_type": "an object",
    "int_from_float": "an integer",
    "int_parsing": "an integer",
}


def _invalid_type(param: str, expected: list[str], given: object, why: str = "") -> BadRequest:
    """OpenAI's wording: "Invalid type for 'messages[0].content': expected a string or an
    array of content parts, but got null instead." with code `invalid_type`."""
    if param.endswith("content") and expected == ["a string", "an array"]:
        expected = ["a string", "an array of content parts"]
    wanted = " or ".join(expected) if len(expected) < 3 else _listed(expected, "or")
    return BadRequest(
        f"Invalid type for '{param}': expected {wanted}, but got {_kind_of(given)} instead{why}.",
        param=param,
        code="invalid_type",
    )


def _missing(param: str, why: str = "") -> BadRequest:
    return BadRequest(
        f"Missing required parameter: '{param}'{why}.",
        param=param,
        code="missing_required_parameter",
    )


def _bad_tag(param: str, error: ErrorDetails) -> BadRequest:
    """A message's `role` or a content part's `type`: missing, of the wrong type, unknown."""
    ctx = error.get("ctx", {})
    key = str(ctx.get("discriminator", "")).strip("'")
    param = f"{param}.{key}" if param else key
    given = error["input"]
    if not isinstance(given, dict):
        return _invalid_type(param.rsplit(".", 1)[0], ["an object"], given)
    if key not in given:
        return _missing(param)
    if not isinstance(given[key], str):
        return _invalid_type(param, ["a string"], given[key])
    return _invalid_value(param, given[key], str(ctx.get("expected_tags", "")))


def _invalid_value(param: str, given: object, expected: str) -> BadRequest:
    """OpenAI's wording: "Invalid value: 'wizard'. Supported values are: 'system',
    'developer', ... and 'function'." with code `invalid_value`."""
    supported = _listed(re.findall(r"'([^']*)'", expected), "and", quote=True)
    shown = f"'{_clipped(given)}'" if isinstance(given, str) else _kind_of(given)
    return BadRequest(
        f"Invalid value for '{param}': {shown}. Supported values are: {supported}.",
        param=param,
        code="invalid_value",
    )


def _listed(items: list[str], last: str, *, quote: bool = False) -> str:
    shown = [f"'{item}'" if quote else item for item in items]
    if len(shown) < 2:
        return "".join(shown)
    return ", ".join(shown[:-1]) + f"{',' if len(shown) > 2 else ''} {last} {shown[-1]}"


def _kind_of(value: object) -> str:
    """What a JSON value is, in OpenAI's words: null, a string, an integer, an array..."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int):
        return "an integer"
    if isinstance(value, float):
        return "a decimal"
    if isinstance(value, str):
        return "an empty string" if not value else "a string"
    if isinstance(value, list):
        return "an array"
    return "an object"


def _clipped(text: str, limit: int = 64) -> str:
    return text if len(text) <= limit else text[:limit] + "…"


def _a(noun: str) -> str:
    return ("an " if noun[0] in "aeiou" else "a ") + noun


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
