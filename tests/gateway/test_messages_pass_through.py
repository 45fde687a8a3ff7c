"""A Messages request passed through to a backend that serves `/v1/messages` itself: the
backend's answer reaches the client unchanged, the gateway's own errors in Anthropic's
shape, and the usage it reports is what quotas charge (gateway/dialects/anthropic.py,
gateway/usage.py). tests/engine/test_tool_calls_vllm.py passes requests through to the
real vLLM."""

from __future__ import annotations

import orjson

from gateway.dialects.anthropic import Messages
from gateway.errors import DeadlineExceeded
from gateway.relay import error_event
from gateway.usage import TokenUsage, UsageTap, token_usage

MESSAGE = orjson.dumps(
    {
        "id": "chatcmpl-1",
        "type": "message",
        "role": "assistant",
        "content": [{"type": "thinking", "thinking": "hm", "signature": ""}],
        "usage": {"input_tokens": 7, "output_tokens": 3, "cache_read_input_tokens": 16},
    }
)
START = (
    b'event: message_start\ndata: {"type":"message_start","message":{"id":"chatcmpl-2",'
    b'"usage":{"input_tokens":5,"output_tokens":0,"cache_read_input_tokens":16}}}'
)
DELTA = (
    b'event: content_block_delta\ndata: {"type":"content_block_delta","index":0,'
    b'"delta":{"type":"text_delta","text":"hi"}}'
)
END = b'event: message_delta\ndata: {"type":"message_delta","usage":{"output_tokens":9}}'


def _passed() -> Messages:
    messages = Messages()
    messages.pass_through()
    return messages


def test_the_backends_message_reaches_the_client_unchanged() -> None:
    assert _passed().whole(200, MESSAGE) == (200, MESSAGE)
    # Translated, the same body would be read as a chat completion, and fail.
    assert Messages().whole(200, MESSAGE)[0] == 502


def test_an_error_is_anthropics_whether_the_gateways_or_the_backends() -> None:
    gateways = orjson.dumps({"error": {"message": "slow down", "type": "rate_limit_error"}})
    status, body = _passed().whole(429, gateways)
    assert status == 429
    assert orjson.loads(body) == {
        "type": "error",
        "error": {"type": "rate_limit_error", "message": "slow down"},
    }
    backends = orjson.dumps({"type": "error", "error": {"type": "x", "message": "too long"}})
    assert orjson.loads(_passed().whole(400, backends)[1])["error"] == {
        "type": "invalid_request_error",
        "message": "too long",
    }


def test_the_backends_events_pass_and_the_gateways_error_event_becomes_anthropics() -> None:
    messages = _passed()
    keep_alive = b": keep-alive"
    assert messages.events([keep_alive, START, DELTA]) == keep_alive + b"\n\n" + START + (
        b"\n\n" + DELTA + b"\n\n"
    )
    cut = error_event(DeadlineExceeded("The deadline passed."))  # what the relay adds
    out = messages.events([cut.removesuffix(b"\n\n")])
    kind, data = out.split(b"\n")[:2]
    assert kind == b"event: error"
    assert orjson.loads(data.removeprefix(b"data: "))["error"]["type"] == "timeout_error"
    assert messages.end() == b""


def test_anthropic_usage_counts_the_cached_prompt_as_prompt() -> None:
    assert token_usage(orjson.loads(MESSAGE)["usage"]) == TokenUsage(23, 3, 16)
    assert token_usage({"input_tokens": "many", "output_tokens": 1}) is None
    assert token_usage({"prompt_tokens": 4, "completion_tokens": 2}) == TokenUsage(4, 2)


def test_a_streams_usage_comes_from_its_start_and_its_last_delta() -> None:
    tap = UsageTap()
    tap(START + b"\n\n" + DELTA + b"\n\n")
    assert tap.usage(100) == TokenUsage(21, 0, 16)
    tap(END + b"\n\n")  # the output so far; the input stays the start's
    assert tap.usage(100) == TokenUsage(21, 9, 16)
