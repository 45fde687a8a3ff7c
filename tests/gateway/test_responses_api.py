"""OpenAI's Responses API through a real gateway process, driven by the official `openai`
client, in front of chat-only backends (the fake upstream and the rich one, which calls
tools): plain and streamed, a tool call and its output, stored responses continued with
`previous_response_id`, read, listed and deleted, and kept per tenant."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import openai
import orjson
import pytest

from bench.processes import Gateway, start_gateway
from tests.conftest import fake_backend, hash_of, rich_backend

KEY = "sk-test-codex-0123456789abcdef"
OTHER_KEY = "sk-test-other-0123456789abcdef"
WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "The weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
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
        "responses": {"max_per_tenant": 3},
        "tenants": [
            {"name": "codex", "keys": [{"sha256": hash_of(KEY)}]},
            {"name": "other", "keys": [{"sha256": hash_of(OTHER_KEY)}]},
        ],
    }
    gw = start_gateway(config, work)
    yield gw
    gw.stop()


@pytest.fixture
def client(gateway: Gateway) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=gateway.base_url, api_key=KEY, max_retries=0) as client:
        yield client


def last_upstream_body(fake_upstream: str) -> dict[str, object]:
    return httpx.get(fake_upstream.removesuffix("/v1") + "/_last_body").json()


def test_a_response(client: openai.OpenAI, fake_upstream: str) -> None:
    response = client.responses.create(
        model="echo", input="hello there", instructions="be brief", max_output_tokens=64
    )
    assert response.id.startswith("resp_") and response.object == "response"
    assert response.status == "completed" and response.model == "echo"
    assert response.output_text == "echo: hello there"
    assert response.output[0].type == "message" and response.output[0].role == "assistant"
    assert response.usage is not None and response.usage.output_tokens == 3
    assert response.usage.total_tokens == response.usage.input_tokens + 3
    sent = last_upstream_body(fake_upstream)
    assert sent["messages"] == [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "hello there"},
    ]
    assert sent["max_tokens"] == 64


def test_a_streamed_response_in_the_apis_event_order(client: openai.OpenAI) -> None:
    events = list(client.responses.create(model="echo", input="one two", stream=True))
    kinds = [e.type for e in events]
    assert kinds == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        *["response.output_text.delta"] * 3,
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    final = events[-1].response  # type: ignore[union-attr]
    assert final.output_text == "echo: one two" and final.usage.output_tokens == 3


def test_the_stream_helper_accumulates_it(client: openai.OpenAI) -> None:
    with client.responses.stream(model="echo", input="alpha beta") as stream:
        deltas = [e.delta for e in stream if e.type == "response.output_text.delta"]
        final = stream.get_final_response()
    assert "".join(deltas) == final.output_text == "echo: alpha beta"


def test_a_tool_call_and_its_output(client: openai.OpenAI, fake_upstream: str) -> None:
    asked = client.responses.create(model="tools", input="Weather in Paris?", tools=[WEATHER])
    calls = [item for item in asked.output if item.type == "function_call"]
    assert len(calls) == 1 and calls[0].name == "get_weather" and calls[0].call_id == "call_w1"
    assert orjson.loads(calls[0].arguments) == {"city": "Paris"}
    output = {"type": "function_call_output", "call_id": "call_w1", "output": "sunny"}
    answered = client.responses.create(
        model="echo", previous_response_id=asked.id, input=[output], tools=[WEATHER]
    )
    assert answered.output_text == "echo: Weather in Paris?"  # the last user turn
    sent = last_upstream_body(fake_upstream)["messages"]
    assert sent == [
        {"role": "user", "content": "Weather in Paris?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_w1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": calls[0].arguments},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_w1", "content": "sunny"},
    ]


def test_a_streamed_tool_call(client: openai.OpenAI) -> None:
    with client.responses.stream(
        model="tools", input="Weather in Paris?", tools=[WEATHER]
    ) as stream:
        kinds = [e.type for e in stream]
        final = stream.get_final_response()
    assert kinds.count("response.function_call_arguments.delta") == 3
    assert "response.function_call_arguments.done" in kinds
    call = final.output[0]
    assert call.type == "function_call" and orjson.loads(call.arguments) == {"city": "Paris"}


def test_stored_responses_continue_and_can_be_read_listed_and_deleted(
    client: openai.OpenAI, fake_upstream: str
) -> None:
    first = client.responses.create(model="echo", input="first question", instructions="A")
    second = client.responses.create(
        model="echo", input="second question", previous_response_id=first.id, instructions="B"
    )
    assert second.output_text == "echo: second question"
    assert last_upstream_body(fake_upstream)["messages"] == [
        {"role": "system", "content": "B"},  # the earlier instructions are not carried over
        {"role": "user", "content": "first question"},
        {"role": "assistant", "content": "echo: first question"},
        {"role": "user", "content": "second question"},
    ]
    read = client.responses.retrieve(second.id)
    assert read.id == second.id and read.output_text == "echo: second question"
    items = client.responses.input_items.list(second.id)
    assert [i.content[0].text for i in items.data] == ["second question"]  # type: ignore[union-attr]
    with pytest.raises(openai.BadRequestError, match="background"):
        client.responses.cancel(second.id)
    client.responses.delete(second.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(second.id)


def test_store_false_keeps_nothing(client: openai.OpenAI) -> None:
    response = client.responses.create(model="echo", input="forget me", store=False)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(response.id)
    with pytest.raises(openai.NotFoundError, match="not found"):
        client.responses.create(model="echo", input="and?", previous_response_id=response.id)


def test_a_tenant_keeps_its_newest_and_sees_no_others(
    client: openai.OpenAI, gateway: Gateway
) -> None:
    made = [client.responses.create(model="echo", input=f"n{i}").id for i in range(4)]
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(made[0])  # max_per_tenant: 3, the oldest forgotten
    assert client.responses.retrieve(made[-1]).id == made[-1]
    with openai.OpenAI(base_url=gateway.base_url, api_key=OTHER_KEY, max_retries=0) as other:
        with pytest.raises(openai.NotFoundError):
            other.responses.retrieve(made[-1])
        with pytest.raises(openai.NotFoundError):
            other.responses.create(model="echo", input="x", previous_response_id=made[-1])


def test_what_a_chat_backend_cannot_do_is_a_400(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError, match="function tools"):
        client.responses.create(model="echo", input="x", tools=[{"type": "web_search"}])
    with pytest.raises(openai.BadRequestError, match="background"):
        client.responses.create(model="echo", input="x", background=True)
    with pytest.raises(openai.NotFoundError):
        client.responses.create(model="no-such-model", input="x")


def test_an_upstream_failure_midstream_is_response_failed(client: openai.OpenAI) -> None:
    events = list(client.responses.create(model="die-midstream", input="a b c d", stream=True))
    assert events[0].type == "response.created"
    assert events[-1].type == "response.failed"
    assert events[-1].response.error is not None  # type: ignore[union-attr]
