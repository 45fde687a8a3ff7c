"""Bodies are checked as OpenAI checks them, through a real gateway process and the
official client: sampling and size parameters out of range, chat messages of an unknown role
or with content their role may not have, bodies that are not JSON objects. Each is a 400 in
OpenAI's words, with `param` naming the offending field and OpenAI's code."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import openai
import orjson
import pytest
from openai.types.chat import ChatCompletionMessageParam

from bench.processes import Gateway, start_gateway
from gateway.openai_schema import MAX_TOKENS, parse_request
from tests.conftest import fake_backend, hash_of

KEY = "sk-test-validation-0123456789abcdef"
MESSAGES: list[ChatCompletionMessageParam] = [{"role": "user", "content": "hi"}]


@pytest.fixture(scope="module")
def gateway(fake_upstream: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    work = tmp_path_factory.mktemp("validation")
    config = {
        "state": {"url": "memory", "path": str(work / "state.json")},
        "backends": [fake_backend(fake_upstream)],
        "cache": {"enabled": False},
        "tenants": [{"name": "alpha", "keys": [{"sha256": hash_of(KEY)}]}],
    }
    gw = start_gateway(config, work)
    yield gw
    gw.stop()


@pytest.fixture
def client(gateway: Gateway) -> openai.OpenAI:
    return openai.OpenAI(base_url=gateway.base_url, api_key=KEY, max_retries=0)


@pytest.mark.parametrize(
    ("field", "value", "code"),
    [
        ("max_tokens", -5, "integer_below_min_value"),
        ("max_tokens", 0, "integer_below_min_value"),
        ("max_tokens", MAX_TOKENS + 1, "integer_above_max_value"),
        ("max_completion_tokens", 2**62, "integer_above_max_value"),
        ("n", 0, "integer_below_min_value"),
        ("n", 129, "integer_above_max_value"),
        ("temperature", 2.5, "decimal_above_max_value"),
        ("temperature", -1, "decimal_below_min_value"),
        ("top_p", 1.01, "decimal_above_max_value"),
        ("presence_penalty", -2.5, "decimal_below_min_value"),
        ("frequency_penalty", 3, "decimal_above_max_value"),
        ("max_tokens", "5", "invalid_type"),  # OpenAI takes no strings for numbers
        ("max_tokens", 5.5, "invalid_type"),
        ("temperature", True, "invalid_type"),
    ],
)
def test_out_of_range_is_400_with_param(
    client: openai.OpenAI, field: str, value: Any, code: str | None
) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(model="echo", messages=MESSAGES, extra_body={field: value})
    error = caught.value.body
    assert isinstance(error, dict)
    assert error["type"] == "invalid_request_error"
    assert error["param"] == field
    assert error["code"] == code
    assert f"'{field}'" in error["message"]


def post(gateway: Gateway, path: str, body: Any = None, content: bytes | None = None) -> Any:
    """The error a raw body gets: always a 400 of type `invalid_request_error`."""
    answer = httpx.post(
        gateway.base_url + path,
        json=body,
        content=content,
        headers={"authorization": f"Bearer {KEY}", "content-type": "application/json"},
    )
    assert answer.status_code == 400, answer.text
    error = answer.json()["error"]
    assert error["type"] == "invalid_request_error"
    return error


USER = {"role": "user", "content": "hi"}
ROLES = "'system', 'developer', 'user', 'assistant', 'tool', and 'function'"


@pytest.mark.parametrize(
    ("messages", "param", "code", "message"),
    [
        (
            [{"role": "wizard", "content": "hi"}],
            "messages[0].role",
            "invalid_value",
            f"Invalid value for 'messages[0].role': 'wizard'. Supported values are: {ROLES}.",
        ),
        (
            [{"content": "hi"}],
            "messages[0].role",
            "missing_required_parameter",
            "Missing required parameter: 'messages[0].role'.",
        ),
        (
            [{"role": 5, "content": "hi"}],
            "messages[0].role",
            "invalid_type",
            "Invalid type for 'messages[0].role': expected a string, but got an integer instead.",
        ),
        (
            [{"role": "user", "content": None}],
            "messages[0].content",
            "invalid_type",
            "Invalid type for 'messages[0].content': expected a string or an array of content "
            "parts, but got null instead.",
        ),
        (
            [{"role": "user"}],
            "messages[0].content",
            "missing_required_parameter",
            "Missing required parameter: 'messages[0].content'.",
        ),
        (
            [USER, {"role": "user", "content": {"text": "hi"}}],
            "messages[1].content",
            "invalid_type",
            "Invalid type for 'messages[1].content': expected a string or an array of content "
            "parts, but got an object instead.",
        ),
        (
            [{"role": "user", "content": []}],
            "messages[0].content",
            "empty_array",
            "Invalid 'messages[0].content': empty array. Expected an array with minimum length "
            "1, but got an empty array instead.",
        ),
        (
            [{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": 5}]}],
            "messages[0].content[1].type",
            "invalid_type",
            "Invalid type for 'messages[0].content[1].type': expected a string, but got an "
            "integer instead.",
        ),
        (
            [{"role": "user", "content": [{"type": "text"}]}],
            "messages[0].content[0].text",
            "missing_required_parameter",
            "Missing required parameter: 'messages[0].content[0].text'.",
        ),
        (
            [{"role": "user", "content": [{"type": "text", "text": 7}]}],
            "messages[0].content[0].text",
            "invalid_type",
            "Invalid type for 'messages[0].content[0].text': expected a string, but got an "
            "integer instead.",
        ),
        (
            [{"role": "user", "content": ["hi"]}],
            "messages[0].content[0]",
            "invalid_type",
            "Invalid type for 'messages[0].content[0]': expected an object, but got a string "
            "instead.",
        ),
        (
            [
                {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "u"}}]},
                {"role": "user", "content": [{"type": "input_audio", "input_audio": {}}]},
            ],
            "messages[1].content[0].input_audio.data",
            "missing_required_parameter",
            "Missing required parameter: 'messages[1].content[0].input_audio.data'.",
        ),
        (
            [
                {
                    "role": "user",
                    "content": [{"type": "image_url", "image_url": {"url": "u", "detail": "x"}}],
                }
            ],
            "messages[0].content[0].image_url.detail",
            "invalid_value",
            "Invalid value for 'messages[0].content[0].image_url.detail': 'x'. Supported values "
            "are: 'auto', 'low', and 'high'.",
        ),
        (  # system (and developer) messages take text parts only
            [{"role": "system", "content": [{"type": "image_url", "image_url": {"url": "u"}}]}],
            "messages[0].content[0].type",
            "invalid_value",
            "Invalid value for 'messages[0].content[0].type': 'image_url'. Supported values "
            "are: 'text'.",
        ),
        (
            [USER, {"role": "assistant", "content": None}],
            "messages[1].content",
            "invalid_type",
            "Invalid type for 'messages[1].content': expected a string or an array of content "
            "parts, but got null instead (an assistant message may go without it only with "
            "'tool_calls' or 'function_call').",
        ),
        (
            [USER, {"role": "assistant", "tool_calls": []}],
            "messages[1].content",
            "missing_required_parameter",
            "Missing required parameter: 'messages[1].content' (an assistant message may go "
            "without it only with 'tool_calls' or 'function_call').",
        ),
        (
            [USER, {"role": "tool", "content": "42"}],
            "messages[1].tool_call_id",
            "missing_required_parameter",
            "Missing required parameter: 'messages[1].tool_call_id'.",
        ),
        (
            [USER, {"role": "function", "content": "42"}],
            "messages[1].name",
            "missing_required_parameter",
            "Missing required parameter: 'messages[1].name'.",
        ),
        (
            [USER, None],
            "messages[1]",
            "invalid_type",
            "Invalid type for 'messages[1]': expected an object, but got null instead.",
        ),
        (
            [],
            "messages",
            "empty_array",
            "Invalid 'messages': empty array. Expected an array with minimum length 1, but got "
            "an empty array instead.",
        ),
    ],
)
def test_messages_openai_refuses_are_400_naming_the_field(
    gateway: Gateway, messages: list[Any], param: str, code: str, message: str
) -> None:
    error = post(gateway, "/chat/completions", {"model": "echo", "messages": messages})
    assert (error["param"], error["code"], error["message"]) == (param, code, message)


def test_every_role_and_part_openai_takes_passes_with_vendor_fields(
    client: openai.OpenAI,
) -> None:
    messages: Any = [
        {"role": "system", "content": "be brief", "x_vendor_cache": True},
        {"role": "developer", "content": [{"type": "text", "text": "really"}]},
        {
            "role": "user",
            "name": "ann",
            "content": [
                {"type": "text", "text": "look"},
                {"type": "image_url", "image_url": {"url": "data:,x", "detail": "low"}},
                {"type": "input_audio", "input_audio": {"data": "AAAA", "format": "wav"}},
                {"type": "file", "file": {"file_id": "file-1"}},
                {"type": "text", "text": "this", "x_vendor_part": 1},
                # A part OpenAI does not have, that vLLM does: the engine judges it.
                {"type": "video_url", "video_url": {"url": "https://example.com/v.mp4"}},
            ],
        },
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": [{"type": "text", "text": "42"}]},
        {"role": "assistant", "function_call": {"name": "g", "arguments": "{}"}},
        {"role": "function", "name": "g", "content": None},
        {"role": "assistant", "content": [{"type": "refusal", "refusal": "no"}]},
        {"role": "user", "content": "hi"},
    ]
    answer = client.chat.completions.create(model="echo", messages=messages)
    assert answer.choices[0].message.content == "echo: hi"


@pytest.mark.parametrize(
    ("body", "param", "code", "message"),
    [
        (
            {"model": "", "messages": [USER]},
            "model",
            "empty_string",
            "Invalid 'model': empty string. Expected a string with minimum length 1, but got an "
            "empty string instead.",
        ),
        (
            {"messages": [USER]},
            "model",
            "missing_required_parameter",
            "Missing required parameter: 'model'.",
        ),
        (
            {"model": ["echo"], "messages": [USER]},
            "model",
            "invalid_type",
            "Invalid type for 'model': expected a string, but got an array instead.",
        ),
        (
            {"model": "echo", "messages": [USER], "stream": "yes"},
            "stream",
            "invalid_type",
            "Invalid type for 'stream': expected a boolean, but got a string instead.",
        ),
    ],
)
def test_the_model_and_flags_are_checked(
    gateway: Gateway, body: dict[str, Any], param: str, code: str, message: str
) -> None:
    error = post(gateway, "/chat/completions", body)
    assert (error["param"], error["code"], error["message"]) == (param, code, message)


@pytest.mark.parametrize(
    ("dimensions", "code", "message"),
    [
        (
            0,
            "integer_below_min_value",
            "Invalid 'dimensions': integer below minimum value. Expected a value >= 1, but got "
            "0 instead.",
        ),
        (-3, "integer_below_min_value", None),
        (
            "8",
            "invalid_type",
            "Invalid type for 'dimensions': expected an integer, but got a string instead.",
        ),
        (8.5, "invalid_type", None),
    ],
)
def test_embedding_dimensions_are_checked_and_named(
    gateway: Gateway, dimensions: Any, code: str, message: str | None
) -> None:
    body = {"model": "echo", "input": "hi", "dimensions": dimensions}
    error = post(gateway, "/embeddings", body)
    assert (error["param"], error["code"]) == ("dimensions", code)
    assert message is None or error["message"] == message


def test_embedding_dimensions_in_range_pass(client: openai.OpenAI) -> None:
    assert client.embeddings.create(model="echo", input="hi", dimensions=8).data
    both = client.embeddings.create(model="echo", input="hi", extra_body={"dimensions": None})
    assert both.data


NOT_PARSED = "We could not parse the JSON body of your request. (HINT: This likely means"


@pytest.mark.parametrize(
    ("content", "says"),
    [
        (
            b"[1, 2]",
            f"{NOT_PARSED} you aren't using your HTTP library correctly. The API "
            "expects a JSON object, but got an array.)",
        ),
        (b'"hi"', "The API expects a JSON object, but got a string.)"),
        (
            b"{not json",
            f"{NOT_PARSED} you aren't using your HTTP library correctly. The API "
            "expects a JSON object, but what was sent is not JSON: ",
        ),
        (
            b'{"model": "echo", "messages": [{"role": "user", "content": "\xff"}]}',
            "The request body is not valid UTF-8 JSON: the byte at offset",
        ),
        (
            b'{"model": "echo", "messages": [{"role": "user", "content": "\\ud800"}]}',
            "The request body is not valid UTF-8 JSON: a string holds an unpaired surrogate",
        ),
        (
            b'{"model": "echo", "messages": [{"role": "user", "content": "\\udc00 x"}]}',
            "The request body is not valid UTF-8 JSON: a string holds an unpaired surrogate",
        ),
    ],
)
def test_a_body_that_is_no_json_object_says_so_without_internals(
    gateway: Gateway, content: bytes, says: str
) -> None:
    error = post(gateway, "/chat/completions", content=content)
    assert says in error["message"]
    assert (error["param"], error["code"]) == (None, None)
    for internal in ("ChatRequest", "instance", "surrogates not allowed", "pydantic", "str is"):
        assert internal not in error["message"]


def test_completions_are_checked_too(gateway: Gateway) -> None:
    answer = httpx.post(
        gateway.base_url + "/completions",
        json={"model": "echo", "prompt": "hi", "max_tokens": -5},
        headers={"authorization": f"Bearer {KEY}"},
    )
    assert answer.status_code == 400
    assert answer.json()["error"]["param"] == "max_tokens"


def test_bounds_and_nulls_pass_and_unknown_fields_go_through(client: openai.OpenAI) -> None:
    for extra in [
        {"max_tokens": 1, "n": 128, "temperature": 0, "top_p": 1, "presence_penalty": -2},
        {"max_tokens": MAX_TOKENS, "temperature": 2.0, "top_p": 0.0, "frequency_penalty": 2},
        {"max_completion_tokens": 16, "n": 1},
        {k: None for k in ("max_tokens", "max_completion_tokens", "n", "temperature", "top_p")},
        {"presence_penalty": None, "frequency_penalty": None, "x_unknown": {"kept": True}},
    ]:
        answer = client.chat.completions.create(model="echo", messages=MESSAGES, extra_body=extra)
        assert answer.choices[0].message.content == "echo: hi", extra


def test_the_openapi_document_states_the_ranges(gateway: Gateway) -> None:
    schemas = httpx.get(gateway.url + "/openapi.json").json()["components"]["schemas"]
    chat = schemas["ChatRequest"]["properties"]
    assert {"type": "integer", "minimum": 1, "maximum": MAX_TOKENS} in chat["max_tokens"]["anyOf"]
    assert {"type": "number", "minimum": 0, "maximum": 2} in chat["temperature"]["anyOf"]
    roles = chat["messages"]["items"]["discriminator"]
    assert roles["propertyName"] == "role"
    assert set(roles["mapping"]) == {"system", "developer", "user", "assistant", "tool", "function"}
    assert {"content", "tool_call_id"} <= set(schemas["ToolMessage"]["required"])
    assert "content" not in schemas["AssistantMessage"]["required"]
    dimensions = schemas["EmbeddingRequest"]["properties"]["dimensions"]
    assert {"type": "integer", "minimum": 1} in dimensions["anyOf"]


def test_quota_estimates_follow_the_checked_values() -> None:
    body: dict[str, Any] = {"model": "m", "messages": [{"role": "user", "content": "x" * 40}]}

    def reserved(**fields: Any) -> int:
        return parse_request("chat", orjson.dumps({**body, **fields})).reserved_tokens(256)

    assert reserved(max_tokens=MAX_TOKENS, n=2) == 10 + 2 * MAX_TOKENS
    assert reserved(max_tokens=None) == 10 + 256
    assert reserved(max_completion_tokens=7, max_tokens=9) == 17
