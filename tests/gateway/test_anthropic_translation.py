"""Anthropic Messages requests as chat completions requests, and chat answers back:
the translation itself, without a gateway (gateway/dialects/anthropic.py)."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from gateway.dialects.anthropic import Messages, error_json
from gateway.dialects.anthropic_request import to_chat
from gateway.errors import BadRequest


def _request(**fields: Any) -> dict[str, Any]:
    return {
        "model": "m",
        "max_tokens": 9,
        "messages": [{"role": "user", "content": "hi"}],
        **fields,
    }


def test_system_blocks_tool_results_and_images_become_chat_messages() -> None:
    image = {
        "type": "image",
        "source": {"type": "base64", "media_type": "image/png", "data": "AA=="},
    }
    chat = to_chat(
        _request(
            system=[{"type": "text", "text": "one"}, {"type": "text", "text": "two"}],
            messages=[
                {"role": "user", "content": "weather?"},
                {
                    "role": "assistant",
                    "content": [
                        {"type": "thinking", "thinking": "hm", "signature": "s"},
                        {"type": "text", "text": "Let me look."},
                        {"type": "tool_use", "id": "t1", "name": "w", "input": {"city": "Oslo"}},
                    ],
                },
                {
                    "role": "user",
                    "content": [
                        {"type": "text", "text": "and this?"},
                        {
                            "type": "tool_result",
                            "tool_use_id": "t1",
                            "content": [{"type": "text", "text": "rain"}],
                        },
                        image,
                    ],
                },
            ],
        )
    )
    assert chat["messages"] == [
        {"role": "system", "content": "one\n\ntwo"},
        {"role": "user", "content": "weather?"},
        {
            "role": "assistant",
            "content": "Let me look.",
            "tool_calls": [
                {
                    "id": "t1",
                    "type": "function",
                    "function": {"name": "w", "arguments": '{"city":"Oslo"}'},
                }
            ],
        },
        {
            "role": "tool",
            "tool_call_id": "t1",
            "content": "rain",
        },  # before the turn's other content
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "and this?"},
                {"type": "image_url", "image_url": {"url": "data:image/png;base64,AA=="}},
            ],
        },
    ]


def test_options_map_to_their_chat_fields() -> None:
    tool = {"name": "w", "description": "weather", "input_schema": {"type": "object"}}
    chat = to_chat(
        _request(
            stop_sequences=["END"],
            stream=True,
            temperature=0,
            top_k=5,
            metadata={"user_id": "u-1"},
            tools=[tool],
            tool_choice={"type": "any", "disable_parallel_tool_use": True},
        )
    )
    assert chat["stop"] == ["END"] and chat["temperature"] == 0 and chat["top_k"] == 5
    assert chat["stream"] is True and chat["stream_options"] == {"include_usage": True}
    assert chat["user"] == "u-1" and chat["max_tokens"] == 9
    assert chat["tools"] == [
        {
            "type": "function",
            "function": {"name": "w", "parameters": {"type": "object"}, "description": "weather"},
        }
    ]
    assert chat["tool_choice"] == "required" and chat["parallel_tool_calls"] is False
    named = to_chat(_request(tool_choice={"type": "tool", "name": "w"}, tools=[tool]))
    assert named["tool_choice"] == {"type": "function", "function": {"name": "w"}}


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"max_tokens": None}, "max_tokens"),
        ({"messages": []}, "messages"),
        ({"messages": [{"role": "system", "content": "x"}]}, "messages.0"),
        ({"tools": [{"type": "web_search_20250305", "name": "web_search"}]}, "tools.0"),
        ({"tool_choice": {"type": "tool"}}, "tool_choice"),
        (
            {"messages": [{"role": "user", "content": [{"type": "document", "source": {}}]}]},
            "messages.0.content.0",
        ),
    ],
)
def test_what_a_chat_backend_cannot_take_is_refused_by_name(
    fields: dict[str, Any], param: str
) -> None:
    with pytest.raises(BadRequest) as refused:
        to_chat(_request(**fields))
    assert refused.value.param == param


async def test_an_answer_becomes_a_message_with_its_stop_sequence() -> None:
    messages = Messages()
    await messages.to_chat(orjson.dumps(_request(stop_sequences=["END"])), "t")
    answer = {
        "id": "chatcmpl-abc",
        "choices": [
            {
                "index": 0,
                "message": {"content": "done"},
                "finish_reason": "stop",
                "stop_reason": "END",
            }
        ],
        "usage": {
            "prompt_tokens": 10,
            "completion_tokens": 2,
            "prompt_tokens_details": {"cached_tokens": 4},
        },
    }
    status, body = messages.whole(200, orjson.dumps(answer))
    message = orjson.loads(body)
    assert status == 200
    assert message["id"] == "msg_abc" and message["model"] == "m"
    assert message["stop_reason"] == "stop_sequence" and message["stop_sequence"] == "END"
    assert message["usage"] == {
        "input_tokens": 6,
        "output_tokens": 2,
        "cache_read_input_tokens": 4,
        "cache_creation_input_tokens": 0,
    }
    length = {
        **answer,
        "choices": [{"index": 0, "message": {"content": "x"}, "finish_reason": "length"}],
    }
    assert orjson.loads(messages.whole(200, orjson.dumps(length))[1])["stop_reason"] == "max_tokens"


async def test_a_named_tool_call_that_ends_in_stop_is_a_tool_use_stop() -> None:
    """OpenAI's API and vLLM end a call the request named (`tool_choice`) in `stop`."""
    messages = Messages()
    await messages.to_chat(orjson.dumps(_request()), "t")
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    answer = {
        "id": "chatcmpl-abc",
        "choices": [{"index": 0, "message": {"tool_calls": [call]}, "finish_reason": "stop"}],
    }
    message = orjson.loads(messages.whole(200, orjson.dumps(answer))[1])
    assert message["stop_reason"] == "tool_use" and message["content"][0]["name"] == "f"
    chunks = [
        {"id": "c", "choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, **call}]}}]},
        {"id": "c", "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]},
    ]
    streamed = messages.events([b"data: " + orjson.dumps(c) + b"\n\n" for c in chunks])
    streamed += messages.events([b"data: [DONE]\n\n"])
    assert b'"stop_reason":"tool_use"' in streamed and b"input_json_delta" in streamed
    plain = {
        **answer,
        "choices": [{"index": 0, "message": {"content": "x"}, "finish_reason": "stop"}],
    }
    assert orjson.loads(messages.whole(200, orjson.dumps(plain))[1])["stop_reason"] == "end_turn"


def test_an_answer_a_message_cannot_express_is_a_502() -> None:
    call = {"id": "c", "type": "function", "function": {"name": "w", "arguments": "[1, 2"}}
    answer = {"choices": [{"message": {"tool_calls": [call]}, "finish_reason": "tool_calls"}]}
    status, body = Messages().whole(200, orjson.dumps(answer))
    assert status == 502 and b"not a JSON object" in body
    status, body = Messages().whole(200, b'{"object": "list"}')
    assert status == 502 and orjson.loads(body)["error"]["type"] == "api_error"


@pytest.mark.parametrize(
    ("status", "kind"),
    [
        (400, "invalid_request_error"),
        (401, "authentication_error"),
        (429, "rate_limit_error"),
        (503, "overloaded_error"),
        (504, "timeout_error"),
        (502, "api_error"),
    ],
)
def test_errors_keep_their_message_in_anthropics_shape(status: int, kind: str) -> None:
    body = orjson.dumps({"error": {"message": "why", "type": "x", "param": None, "code": None}})
    assert orjson.loads(error_json(status, body)) == {
        "type": "error",
        "error": {"type": kind, "message": "why"},
    }
