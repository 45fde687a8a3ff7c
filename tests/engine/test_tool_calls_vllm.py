"""Tool calls made by the real vLLM, through the gateway, with the official clients: chat
completions, Anthropic's Messages API and OpenAI's Responses API, plain and streamed, and
the call's result sent back.

A random model follows no tool format, so each request names its tool (`tool_choice`):
vLLM then constrains the output to the tool's JSON schema (its structured outputs,
xgrammar) and returns it as the tool call, which the shared engine's byte-level tokenizer
allows (tests/engine/shared.py). The schema's enum bounds the arguments: a string the
model wrote freely under the grammar could run to the token cap.

The Messages tests run twice: translated to chat completions, and passed through to vLLM's
own `/v1/messages` (`native_messages`, a gateway of its own on the same engine).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import anthropic
import httpx
import openai
import pytest

from bench.processes import Gateway, start_gateway
from tests.conftest import hash_of
from tests.engine.conftest import INTERACTIVE_KEY, claude_of, tenants, vllm_backend
from tests.engine.shared import MODEL, Engine

pytestmark = pytest.mark.serial

ADMIN_KEY = "sk-test-engine-admin-0123456789abcdef0123"
CITIES = ["Oslo", "Paris", "Rome"]
SCHEMA = {
    "type": "object",
    "properties": {"city": {"type": "string", "enum": CITIES}},
    "required": ["city"],
    "additionalProperties": False,
}
FUNCTION = {"name": "pick_city", "description": "Pick a city.", "parameters": SCHEMA}
TOOL = {"name": "pick_city", "description": "Pick a city.", "input_schema": SCHEMA}  # Anthropic's


@pytest.fixture(scope="module")
def native_gateway(
    vllm_engine: Engine, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Gateway]:
    """Messages requests passed through to the engine's own route; the interactive
    tenant's tokens counted (a daily budget it never reaches), for the admin API to read."""
    backend = vllm_backend(
        vllm_engine, max_concurrency=8, concurrency={"mode": "fixed"}, native_messages=True
    )
    counted = [
        {**tenant, "quotas": {"tokens_per_day": 10**9}}
        if tenant["name"] == "interactive"
        else tenant
        for tenant in tenants()
    ]
    config = {
        "state": {"url": "memory", "path": str(tmp_path_factory.mktemp("state") / "s.json")},
        "backends": [backend],
        "cache": {"enabled": False},
        "tenants": counted,
        "admin": {"keys": [{"sha256": hash_of(ADMIN_KEY)}]},
    }
    gateway = start_gateway(config, tmp_path_factory.mktemp("native-gateway"))
    yield gateway
    gateway.stop()


@pytest.fixture(scope="module", params=["translated", "passed through"])
def claude(request: pytest.FixtureRequest) -> Iterator[anthropic.Anthropic]:
    """The official Anthropic client, through each of this module's gateways."""
    name = "vllm_gateway" if request.param == "translated" else "native_gateway"
    with claude_of(request.getfixturevalue(name)) as client:
        yield client


def test_chat_completions_get_the_engines_tool_call(codex: openai.OpenAI) -> None:
    answer = codex.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Pick a city."}],
        tools=[{"type": "function", "function": FUNCTION}],  # type: ignore[list-item]
        tool_choice={"type": "function", "function": {"name": "pick_city"}},
        max_tokens=40,
    )
    calls = answer.choices[0].message.tool_calls
    assert calls is not None and len(calls) == 1
    call = calls[0]
    assert call.type == "function" and call.function.name == "pick_city"
    assert json.loads(call.function.arguments)["city"] in CITIES


def test_a_message_gets_a_tool_use_block_and_answers_its_result(
    claude: anthropic.Anthropic,
) -> None:
    asked: list[Any] = [{"role": "user", "content": "Pick a city."}]
    message = claude.messages.create(
        model=MODEL,
        max_tokens=40,
        tools=[TOOL],  # type: ignore[list-item]
        tool_choice={"type": "tool", "name": "pick_city"},
        messages=asked,
    )
    assert message.stop_reason == "tool_use"
    uses = [block for block in message.content if block.type == "tool_use"]
    assert len(uses) == 1 and uses[0].name == "pick_city"
    assert isinstance(uses[0].input, dict) and uses[0].input["city"] in CITIES
    assert message.usage.output_tokens > 0
    result = {"type": "tool_result", "tool_use_id": uses[0].id, "content": "Picked."}
    after = claude.messages.create(
        model=MODEL,
        max_tokens=5,
        tools=[TOOL],  # type: ignore[list-item]
        messages=[
            *asked,
            {"role": "assistant", "content": message.content},
            {"role": "user", "content": [result]},  # type: ignore[list-item]
        ],
    )
    assert after.stop_reason in ("end_turn", "max_tokens")  # an answer, free text this time
    assert all(block.type == "text" for block in after.content)
    assert after.usage.input_tokens > message.usage.input_tokens  # the call and its result


def test_a_streamed_message_sends_the_tool_use_as_input_json_deltas(
    claude: anthropic.Anthropic,
) -> None:
    with claude.messages.stream(
        model=MODEL,
        max_tokens=40,
        tools=[TOOL],  # type: ignore[list-item]
        tool_choice={"type": "tool", "name": "pick_city"},
        messages=[{"role": "user", "content": "Pick a city."}],
    ) as stream:
        events = list(stream)
        final = stream.get_final_message()
    types = [event.type for event in events]
    assert types[0] == "message_start" and types[-1] == "message_stop"
    partial = "".join(
        e.delta.partial_json
        for e in events
        if e.type == "content_block_delta" and e.delta.type == "input_json_delta"
    )
    uses = [block for block in final.content if block.type == "tool_use"]
    assert len(uses) == 1 and uses[0].name == "pick_city"
    assert json.loads(partial) == uses[0].input and uses[0].input["city"] in CITIES  # type: ignore[index]
    assert final.stop_reason == "tool_use"


def test_a_response_gets_a_function_call_plain_and_streamed(codex: openai.OpenAI) -> None:
    request: dict[str, Any] = {
        "model": MODEL,
        "input": "Pick a city.",
        "tools": [{"type": "function", **FUNCTION}],
        "tool_choice": {"type": "function", "name": "pick_city"},
        "max_output_tokens": 40,
        "store": False,
    }
    plain = codex.responses.create(**request)
    calls = [item for item in plain.output if item.type == "function_call"]
    assert len(calls) == 1 and calls[0].name == "pick_city"
    assert json.loads(calls[0].arguments)["city"] in CITIES
    events = list(codex.responses.create(**request, stream=True))
    assert events[-1].type == "response.completed"
    done = [e for e in events if e.type == "response.function_call_arguments.done"]
    deltas = [e.delta for e in events if e.type == "response.function_call_arguments.delta"]
    assert len(done) == 1 and "".join(deltas) == done[0].arguments
    assert json.loads(done[0].arguments)["city"] in CITIES


def test_a_message_passed_through_is_the_engines_own_and_charged_its_usage(
    native_gateway: Gateway, vllm_engine: Engine
) -> None:
    request: dict[str, Any] = {
        "model": MODEL,
        "max_tokens": 12,
        "temperature": 0,
        "messages": [{"role": "user", "content": "Name a city."}],
    }
    headers = {"x-api-key": INTERACTIVE_KEY}
    before = _tokens_today(native_gateway)
    through = httpx.post(f"{native_gateway.url}/v1/messages", json=request, headers=headers)
    streamed = httpx.post(
        f"{native_gateway.url}/v1/messages", json={**request, "stream": True}, headers=headers
    )
    own = httpx.post(f"{vllm_engine.url}/v1/messages", json=request, timeout=120)
    assert through.status_code == own.status_code == streamed.status_code == 200, through.text
    answer, reference = through.json(), own.json()
    # vLLM's own route names a message by its chat completion's id; the translation by msg_.
    assert answer["id"].startswith("chatcmpl-")
    assert answer["content"] == reference["content"]
    assert answer["usage"]["output_tokens"] == reference["usage"]["output_tokens"] == 12
    assert streamed.text.rstrip().endswith('{"type":"message_stop"}')  # no error event after
    assert "event: error" not in streamed.text
    charged = _tokens_today(native_gateway) - before
    assert charged == 2 * (_prompt(answer["usage"]) + 12)  # the stream's usage too


def test_errors_passed_through_are_anthropics(native_gateway: Gateway) -> None:
    headers = {"x-api-key": INTERACTIVE_KEY}
    too_long = {
        "model": MODEL,
        "max_tokens": 1_000_000,  # beyond the model's context: vLLM's own 400
        "messages": [{"role": "user", "content": "Name a city."}],
    }
    refused = httpx.post(f"{native_gateway.url}/v1/messages", json=too_long, headers=headers)
    assert refused.status_code == 400
    assert refused.json()["type"] == "error"
    assert refused.json()["error"]["type"] == "invalid_request_error"
    unknown = httpx.post(
        f"{native_gateway.url}/v1/messages", json={**too_long, "model": "nope"}, headers=headers
    )
    assert unknown.status_code == 404 and unknown.json()["error"]["type"] == "not_found_error"


def _tokens_today(gateway: Gateway) -> int:
    usage = httpx.get(
        f"{gateway.url}/admin/tenants/interactive/usage",
        headers={"authorization": f"Bearer {ADMIN_KEY}"},
    )
    assert usage.status_code == 200, usage.text
    used: int = usage.json()["tokens_today"]["used"]
    return used


def _prompt(usage: dict[str, int]) -> int:
    return usage["input_tokens"] + usage.get("cache_read_input_tokens", 0)
