"""The typed request: kind from the model type, streaming, token sizes, cache inputs."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from gateway.errors import BadRequest
from gateway.openai_schema import ChatRequest, Kind, parse_request

IMAGE = {"type": "image_url", "image_url": {"url": "data:" + "A" * 9000}}


def parsed(kind: Kind, body: dict[str, Any]) -> Any:
    return parse_request(kind, orjson.dumps(body))


@pytest.mark.parametrize(
    ("kind", "body", "tokens"),
    [
        ("chat", {"messages": [{"role": "user", "content": "abcdefgh"}], "max_tokens": 10}, 12),
        ("chat", {"messages": [{"role": "user", "content": "abcde"}]}, 2 + 256),
        (
            "chat",
            {"messages": [{"role": "user", "content": "abcd"}], "max_completion_tokens": 3},
            4,
        ),
        (
            "chat",
            {
                "messages": [
                    {"role": "user", "content": [{"type": "text", "text": "abcd"}, IMAGE]},
                    {"role": "assistant", "tool_calls": [{"function": {"arguments": "{}xy"}}]},
                ],
                "max_tokens": 1,
            },
            3,  # image data is not text; tool-call arguments are
        ),
        ("completions", {"prompt": "abcdefgh", "max_tokens": 5, "n": 2}, 2 + 10),
        ("completions", {"prompt": "abcdefgh", "max_tokens": 5, "best_of": 3}, 2 + 15),
        ("completions", {"prompt": [[1, 2, 3], [4]], "max_tokens": 1}, 4 + 1),
        ("embeddings", {"input": ["abcd", "efgh"]}, 2),
        ("embeddings", {"input": [1, 2, 3]}, 3),
    ],
)
def test_reserved_tokens(kind: Kind, body: dict[str, Any], tokens: int) -> None:
    assert parsed(kind, {"model": "m", **body}).reserved_tokens(256) == tokens


def test_kind_comes_from_the_model_type_and_vendor_fields_pass() -> None:
    body = {
        "model": "m",
        "messages": [{"role": "user", "content": "hi", "name": "x"}],
        "stream": True,
        "stream_options": {"include_usage": True},
        "top_k": 40,  # a vendor field (vLLM)
    }
    request = parsed("chat", body)
    assert isinstance(request, ChatRequest) and request.kind == "chat"
    assert request.streamed and request.include_usage
    assert request.cache_inputs().body == body  # as the client sent it, nothing added
    plain = parsed("chat", {"model": "m", "messages": [{"role": "user", "content": "hi"}]})
    assert not plain.streamed and not plain.include_usage
    assert plain.cache_inputs().body == {
        "model": "m",
        "messages": [{"role": "user", "content": "hi"}],
    }


def test_cache_inputs_read_the_sampling_fields() -> None:
    request = parsed(
        "chat",
        {
            "model": "m",
            "messages": [{"role": "user", "content": "hi"}],
            "temperature": 0.5,
            "n": 2,
            "tools": [{"type": "function", "function": {"name": "f"}}],
        },
    )
    inputs = request.cache_inputs()
    assert (inputs.kind, inputs.temperature, inputs.choices) == ("chat", 0.5, 2)
    assert inputs.tools == [{"type": "function", "function": {"name": "f"}}]


def test_tool_calls_count_their_arguments_whatever_their_shape() -> None:
    calls = [
        {"id": "a", "type": "function", "function": {"name": "f", "arguments": "x" * 8}},
        {"id": "b", "type": "function", "function": "not an object"},  # the upstream's to judge
        {"id": "c"},
    ]
    body = {"messages": [{"role": "user", "content": "abcd"}], "max_tokens": 1}
    body["messages"].append({"role": "assistant", "content": None, "tool_calls": calls})
    request = parsed("chat", {"model": "m", **body})
    assert request.reserved_tokens(256) == 3 + 1
    assert request.cache_inputs().body == {"model": "m", **body}


def test_a_body_of_the_wrong_shape_is_a_400() -> None:
    with pytest.raises(BadRequest, match="Missing required parameter: 'messages'"):
        parsed("chat", {"model": "m"})
    with pytest.raises(BadRequest, match="could not parse"):
        parse_request("chat", b"{not json")
    with pytest.raises(BadRequest, match="expects a JSON object, but got an array") as caught:
        parse_request("embeddings", b'[{"model": "m", "input": "x"}]')
    assert caught.value.param is None


def test_an_integer_beyond_64_bits_is_out_of_range_not_a_decimal() -> None:
    raw = b'{"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": '
    with pytest.raises(BadRequest) as caught:
        parse_request("chat", raw + b"1180591620717411303424}")  # 2**70
    assert (caught.value.param, caught.value.code) == ("max_tokens", "integer_above_max_value")
