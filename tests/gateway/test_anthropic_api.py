"""Anthropic's Messages API through a real gateway process, driven by the official
`anthropic` client, in front of chat-only backends (the fake upstream and the rich one,
which calls tools): plain, streamed, a tool call and its result, errors in Anthropic's
shape, the key as `x-api-key`, token counting."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import anthropic
import httpx
import orjson
import pytest

from bench.processes import Gateway, start_gateway
from tests.conftest import fake_backend, hash_of, rich_backend

KEY = "sk-test-claude-0123456789abcdef"
WEATHER = {
    "name": "get_weather",
    "description": "The weather in a city.",
    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}},
}


@pytest.fixture(scope="module")
def gateway(
    fake_upstream: str, rich_upstream: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Gateway]:
    work = tmp_path_factory.mktemp("gw")
    config = {
        "state": {"url": "memory", "path": str(work / "state.json")},
        "backends": [fake_backend(fake_upstream), rich_backend(rich_upstream)],
        "cache": {"enabled": False},
        "tenants": [{"name": "claude", "keys": [{"sha256": hash_of(KEY)}]}],
    }
    gw = start_gateway(config, work)
    yield gw
    gw.stop()


@pytest.fixture
def client(gateway: Gateway) -> Iterator[anthropic.Anthropic]:
    with anthropic.Anthropic(base_url=gateway.url, api_key=KEY, max_retries=0) as client:
        yield client


def test_a_message(client: anthropic.Anthropic) -> None:
    message = client.messages.create(
        model="echo",
        max_tokens=64,
        system="be brief",
        messages=[{"role": "user", "content": "hello there"}],
    )
    assert message.type == "message" and message.role == "assistant"
    assert message.id.startswith("msg_") and message.model == "echo"
    assert [b.type for b in message.content] == ["text"]
    assert message.content[0].type == "text" and message.content[0].text == "echo: hello there"
    assert message.stop_reason == "end_turn"
    assert message.usage.output_tokens == 3 and message.usage.input_tokens > 0


def test_a_streamed_message(client: anthropic.Anthropic) -> None:
    with client.messages.stream(
        model="echo", max_tokens=64, messages=[{"role": "user", "content": "one two three"}]
    ) as stream:
        pieces = list(stream.text_stream)
        final = stream.get_final_message()
    assert pieces == ["echo:", " one", " two", " three"]
    assert final.content[0].type == "text" and final.content[0].text == "echo: one two three"
    assert final.stop_reason == "end_turn"
    assert final.usage.output_tokens == 4 and final.usage.input_tokens > 0


def test_the_stream_is_anthropics_event_sequence(gateway: Gateway) -> None:
    body = {"model": "echo", "max_tokens": 16, "stream": True, "messages": [_user("a b")]}
    response = httpx.post(f"{gateway.url}/v1/messages", json=body, headers={"x-api-key": KEY})
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/event-stream")
    names = [line[7:] for line in response.text.splitlines() if line.startswith("event: ")]
    assert names == [
        "message_start",
        "content_block_start",
        *["content_block_delta"] * 3,
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]
    datas = [orjson.loads(line[6:]) for line in response.text.splitlines() if line[:6] == "data: "]
    assert [d["type"] for d in datas] == names  # each event's data names its type too


def test_a_tool_call_and_its_result(client: anthropic.Anthropic) -> None:
    asked = [_user("Weather in Paris?")]
    message = client.messages.create(model="tools", max_tokens=64, tools=[WEATHER], messages=asked)
    assert message.stop_reason == "tool_use"
    calls = [b for b in message.content if b.type == "tool_use"]
    assert len(calls) == 1 and calls[0].name == "get_weather"
    assert calls[0].input == {"city": "Paris"} and calls[0].id == "call_w1"
    answered = [
        *asked,
        {"role": "assistant", "content": [c.model_dump() for c in message.content]},
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": calls[0].id, "content": "sunny"}],
        },
    ]
    again = client.messages.create(model="echo", max_tokens=64, tools=[WEATHER], messages=answered)
    # The echo upstream answers the last user message: the tool's result, as a chat
    # `tool` message, is not one; the turn before it is.
    assert again.content[0].type == "text" and again.content[0].text == "echo: Weather in Paris?"


def test_a_streamed_tool_call(client: anthropic.Anthropic) -> None:
    with client.messages.stream(
        model="tools", max_tokens=64, tools=[WEATHER], messages=[_user("Weather in Paris?")]
    ) as stream:
        kinds = [event.type for event in stream]
        final = stream.get_final_message()
    assert "input_json" in kinds  # the arguments arrived in pieces
    assert final.stop_reason == "tool_use" and final.usage.output_tokens == 12
    call = final.content[-1]
    assert call.type == "tool_use" and call.input == {"city": "Paris"}


def test_errors_are_anthropics_shape_and_status(client: anthropic.Anthropic) -> None:
    with pytest.raises(anthropic.BadRequestError) as missing:
        client.messages.create(model="echo", messages=[_user("hi")], max_tokens=0)
    kind, text = _error(missing.value)
    assert kind == "invalid_request_error" and text.startswith("max_tokens:")
    with pytest.raises(anthropic.NotFoundError) as unknown:
        client.messages.create(model="no-such-model", max_tokens=8, messages=[_user("hi")])
    assert _error(unknown.value)[0] == "not_found_error"
    document = {"type": "document", "source": {"type": "text", "data": "x", "media_type": "t"}}
    with pytest.raises(anthropic.BadRequestError) as refused:
        client.messages.create(
            model="echo", max_tokens=8, messages=[{"role": "user", "content": [document]}]
        )
    assert "'document' block" in _error(refused.value)[1]


def test_a_wrong_key_is_refused_in_anthropics_shape(gateway: Gateway) -> None:
    wrong = anthropic.Anthropic(base_url=gateway.url, api_key="sk-wrong", max_retries=0)
    with wrong, pytest.raises(anthropic.AuthenticationError) as refused:
        wrong.messages.create(model="echo", max_tokens=8, messages=[_user("hi")])
    assert _error(refused.value)[0] == "authentication_error"


def test_an_upstream_failure_midstream_is_an_error_event(client: anthropic.Anthropic) -> None:
    with (
        pytest.raises(anthropic.APIStatusError) as failed,
        client.messages.stream(
            model="die-midstream", max_tokens=64, messages=[_user("a b c d e f")]
        ) as stream,
    ):
        list(stream.text_stream)
    assert failed.value.body is not None


def test_count_tokens(client: anthropic.Anthropic) -> None:
    short = client.messages.count_tokens(model="echo", messages=[_user("hi")])
    long = client.messages.count_tokens(model="echo", messages=[_user("hello there " * 50)])
    assert 0 < short.input_tokens < long.input_tokens
    with pytest.raises(anthropic.NotFoundError):
        client.messages.count_tokens(model="no-such-model", messages=[_user("hi")])


def _user(text: str) -> dict[str, Any]:
    return {"role": "user", "content": text}


def _error(exc: anthropic.APIStatusError) -> tuple[str, str]:
    body = exc.response.json()
    assert body["type"] == "error", body
    return body["error"]["type"], body["error"]["message"]
