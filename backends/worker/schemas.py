"""OpenAI request bodies the worker accepts, validated at the edge.

Unknown fields are allowed (and ignored) so that clients sending newer or vendor fields
still get an answer.
"""

from __future__ import annotations

from typing import Literal, TypeVar

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictInt,
    ValidationError,
    ValidatorFunctionWrapHandler,
    field_validator,
)
from pydantic_core import PydanticCustomError

from backends.worker.errors import InvalidRequest

MAX_N = 128
# What OpenAI's completions accept as `prompt`: one text, several, one prompt as token ids,
# or several as token ids.
PromptValue = str | list[str] | list[StrictInt] | list[list[StrictInt]]


class Body(BaseModel):
    model_config = ConfigDict(extra="allow")


class StreamOptions(Body):
    include_usage: bool | None = False


class SamplingRequest(Body):
    model: str
    max_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0, le=2)
    top_p: float | None = Field(default=None, gt=0, le=1)
    # Answers per prompt; OpenAI's bound.
    n: int | None = Field(default=None, ge=1, le=MAX_N)
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    stop: str | list[str] | None = None
    seed: int | None = None

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)

    @property
    def stop_strings(self) -> tuple[str, ...]:
        stops = [self.stop] if isinstance(self.stop, str) else self.stop or []
        return tuple(stop for stop in stops if stop)


class ContentPart(Body):
    type: str
    text: str | None = None


class ChatMessage(Body):
    role: str
    content: str | list[ContentPart] | None = None

    def text(self) -> str:
        if self.content is None or isinstance(self.content, str):
            return self.content or ""
        if any(part.type != "text" for part in self.content):
            raise InvalidRequest("only text content parts are supported", "messages")
        return "".join(part.text or "" for part in self.content)


class ChatCompletionRequest(SamplingRequest):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)

    @property
    def token_limit(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens


class CompletionRequest(SamplingRequest):
    prompt: PromptValue

    @field_validator("prompt", mode="wrap")
    @classmethod
    def _one_of_the_prompt_forms(
        cls, value: object, handler: ValidatorFunctionWrapHandler
    ) -> PromptValue:
        # One message naming the forms, rather than pydantic's complaint about the first.
        try:
            prompt: PromptValue = handler(value)
        except ValidationError:
            raise PydanticCustomError(
                "prompt_form",
                "must be a string, a list of strings, a list of token ids "
                "or a list of lists of token ids",
            ) from None
        return prompt


class EmbeddingRequest(Body):
    model: str
    input: str | list[str] | list[int] | list[list[int]]
    encoding_format: Literal["float", "base64"] | None = "float"
    dimensions: int | None = None


BodyT = TypeVar("BodyT", bound=Body)


def parse_body(raw: bytes, schema: type[BodyT]) -> BodyT:
    try:
        return schema.model_validate_json(raw)
    except ValidationError as exc:
        raise _invalid_request(exc) from exc


def _invalid_request(exc: ValidationError) -> InvalidRequest:
    first = exc.errors()[0]
    if first["type"] == "json_invalid":
        return InvalidRequest("The request body is not valid JSON.")
    location = ".".join(str(part) for part in first["loc"])
    # OpenAI names the top-level field in `param`; the message keeps the full location.
    param = str(first["loc"][0]) if first["loc"] else None
    if first["type"] == "missing":
        return InvalidRequest(f"Missing required parameter: '{location}'.", param)
    if not location:
        return InvalidRequest(f"Invalid request body: {first['msg']}.")
    return InvalidRequest(f"Invalid value for '{location}': {first['msg']}.", param)
