"""Anthropic's Messages API and OpenAI's Responses API through the gateway, in front of the
real vLLM, with the official clients: plain, streamed, and a conversation that holds a
tool call and its result.

vLLM serves both routes itself; the gateway translates them to chat completions instead
(gateway/dialects/). The engine is the reference: greedy decoding of the same request
through the gateway and straight to the engine must give the same text and token counts,
against its own `/v1/messages`, and against its chat route for the Responses API (its own
`/v1/responses` tokenizes the prompt with the tokenizer's special tokens where a
tokenizer adds them, which its chat route leaves to the chat template).

The engine makes tool calls in test_tool_calls_vllm.py."""

from __future__ import annotations

from typing import Any

import anthropic
import httpx
import openai
import pytest

from tests.engine.shared import MODEL, Engine

# Beside the other real-engine tests: one engine, started once, for the serial phase.
pytestmark = pytest.mark.serial

SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}


def test_a_message_matches_the_engines_own_messages_route(
    claude: anthropic.Anthropic, vllm_engine: Engine
) -> None:
    request: dict[str, Any] = {
        "model": MODEL,
        "max_tokens": 12,
        "temperature": 0,
        "system": "You answer briefly.",
        "messages": [{"role": "user", "content": "Name a city."}],
    }
    # This client has no `temperature` argument any more; the API still takes the field.
    fields = {k: v for k, v in request.items() if k != "temperature"}
    through = claude.messages.create(**fields, extra_body={"temperature": 0})
    native = httpx.post(
        f"{vllm_engine.base_url.removesuffix('/v1')}/v1/messages", json=request, timeout=120
    )
    assert native.status_code == 200, native.text
    reference = native.json()
    assert through.content[0].type == "text"
    assert through.content[0].text == reference["content"][0]["text"]
    assert through.usage.input_tokens == reference["usage"]["input_tokens"]
    assert through.usage.output_tokens == 12 and through.stop_reason == "max_tokens"


def test_a_streamed_conversation_with_a_tool_result_matches_the_engines_own(
    claude: anthropic.Anthropic, vllm_engine: Engine
) -> None:
    tool = {"name": "pick_city", "description": "Pick a city.", "input_schema": SCHEMA}
    call = {"type": "tool_use", "id": "call_1", "name": "pick_city", "input": {"city": "Oslo"}}
    result = {"type": "tool_result", "tool_use_id": "call_1", "content": "Oslo is picked."}
    request: dict[str, Any] = {
        "model": MODEL,
        "max_tokens": 10,
        "tools": [tool],
        "messages": [
            {"role": "user", "content": "Pick one."},
            {"role": "assistant", "content": [{"type": "text", "text": "Let me pick."}, call]},
            {"role": "user", "content": [result, {"type": "text", "text": "Now say why."}]},
        ],
    }
    with claude.messages.stream(**request, extra_body={"temperature": 0}) as stream:
        pieces = list(stream.text_stream)
        final = stream.get_final_message()
    native = _native(vllm_engine, "/v1/messages", {**request, "temperature": 0})
    assert "".join(pieces) == native["content"][0]["text"]
    assert final.usage.input_tokens == native["usage"]["input_tokens"]
    assert final.usage.output_tokens == 10 and final.stop_reason == "max_tokens"


def test_a_response_matches_the_engines_chat_route(
    codex: openai.OpenAI, vllm_engine: Engine
) -> None:
    through = codex.responses.create(
        model=MODEL,
        input="Name a city.",
        instructions="You answer briefly.",
        max_output_tokens=12,
        temperature=0,
        store=False,
    )
    messages = [
        {"role": "system", "content": "You answer briefly."},
        {"role": "user", "content": "Name a city."},
    ]
    chat = {"model": MODEL, "messages": messages, "max_tokens": 12, "temperature": 0}
    reference = _native(vllm_engine, "/v1/chat/completions", chat)
    assert through.output_text == reference["choices"][0]["message"]["content"]
    assert through.usage is not None
    assert through.usage.input_tokens == reference["usage"]["prompt_tokens"]
    assert through.status == "incomplete" and through.incomplete_details is not None
    assert through.incomplete_details.reason == "max_output_tokens"


def test_a_streamed_conversation_with_a_function_call_continued_from_storage(
    codex: openai.OpenAI,
) -> None:
    tool = {"type": "function", "name": "pick_city", "parameters": SCHEMA}
    call = {
        "type": "function_call",
        "call_id": "call_1",
        "name": "pick_city",
        "arguments": '{"city": "Oslo"}',
    }
    output = {"type": "function_call_output", "call_id": "call_1", "output": "Oslo is picked."}
    events = list(
        codex.responses.create(
            model=MODEL,
            input=[{"role": "user", "content": "Pick one."}, call, output],  # type: ignore[list-item]
            tools=[tool],  # type: ignore[list-item]
            max_output_tokens=6,
            temperature=0,
            stream=True,
        )
    )
    # The model never stops on its own: the answer hits its cap, and the stream ends in
    # `response.incomplete` (the SDK's stream helper waits for `response.completed` only).
    assert events[-1].type == "response.incomplete"
    final = events[-1].response
    deltas = [e.delta for e in events if e.type == "response.output_text.delta"]
    assert "".join(deltas) == final.output_text and final.usage is not None
    assert final.usage.output_tokens == 6
    after = codex.responses.create(
        model=MODEL, previous_response_id=final.id, input="And then?", max_output_tokens=4
    )
    assert after.usage is not None and after.usage.output_tokens == 4
    assert after.usage.input_tokens > final.usage.input_tokens + 6  # the whole conversation


def _native(engine: Engine, path: str, body: dict[str, Any]) -> dict[str, Any]:
    answer = httpx.post(f"{engine.url}{path}", json=body, timeout=120)
    assert answer.status_code == 200, answer.text
    result: dict[str, Any] = answer.json()
    return result
