"""Streams beyond plain text, recorded by a real gateway and replayed from its cache, read
by the official `openai` client: reasoning, logprobs, tool calls and refusals come back as
they came, in several chunks; a stream whose text says `data: [DONE]` but never sends the
event is cut, and never stored. The upstream writes events the awkward ways the SSE spec
allows (several `data:` lines, CRLF): tests/support/rich_upstream.py."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import httpx
import openai
import pytest

from bench.processes import Gateway, start_gateway
from tests.conftest import hash_of, rich_backend
from tests.support import rich_upstream as rich

KEY = "sk-test-replay-0123456789abcdef"
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}
T = TypeVar("T")


@pytest.fixture(scope="module")
def gateway(rich_upstream: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    work = tmp_path_factory.mktemp("replay-gw")
    config = {
        "state": {"url": "memory", "path": str(work / "state.json")},
        "cache": {
            "enabled": True,
            "lookup_budget_ms": 3000,  # the shared test machine can be slow
            "cacheable_tools": ["get_weather"],
            "path": str(work / "cache"),
        },
        "backends": [rich_backend(rich_upstream)],
        "tenants": [{"name": "t", "keys": [{"sha256": hash_of(KEY)}]}],
    }
    gw = start_gateway(config, work, timeout_s=120)
    yield gw
    gw.stop()


@pytest.fixture
def client(gateway: Gateway) -> openai.OpenAI:
    return openai.OpenAI(base_url=gateway.base_url, api_key=KEY, max_retries=0)


def upstream_requests(rich_upstream: str) -> int:
    return int(httpx.get(rich_upstream.removesuffix("/v1") + "/_stats").json()["requests"])


def when_cached(ask: Callable[[], tuple[str, T]]) -> T:
    """Asks until the answer comes from the cache (it is stored after the first reply)."""
    deadline = time.monotonic() + 10
    while True:
        state, answer = ask()
        if state == "hit":
            return answer
        assert time.monotonic() < deadline, "the streamed answer was never stored"
        time.sleep(0.05)


def stream_chunks(client: openai.OpenAI, prompt: str) -> tuple[str, list[Any]]:
    raw = client.chat.completions.with_raw_response.create(
        model="rich",
        messages=[{"role": "user", "content": prompt}],
        stream=True,
        logprobs=True,
        stream_options={"include_usage": True},
    )
    return raw.headers["x-cache"], list(raw.parse())


def pieces(chunks: list[Any], field: str) -> list[str]:
    found = [getattr(c.choices[0].delta, field, None) for c in chunks if c.choices]
    return [piece for piece in found if piece]


def test_reasoning_and_logprobs_are_replayed_token_by_token(
    client: openai.OpenAI, rich_upstream: str
) -> None:
    prompt = "How does an SSE stream end?"
    state, first = stream_chunks(client, prompt)
    assert state == "miss"
    replayed = when_cached(lambda: stream_chunks(client, prompt))
    for chunks in (first, replayed):
        assert "".join(pieces(chunks, "reasoning_content")) == "".join(rich.REASONING)
        assert pieces(chunks, "content") == rich.TOKENS  # a chunk each, not one delta
        tokens = [c.choices[0].logprobs for c in chunks if c.choices and c.choices[0].logprobs]
        assert [t.content[0].token for t in tokens] == rich.TOKENS
        assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"
    assert replayed[0].choices[0].delta.role == "assistant"
    assert replayed[-1].usage is not None and replayed[-1].usage.total_tokens == 0
    before = upstream_requests(rich_upstream)
    whole = client.chat.completions.create(
        model="rich", messages=[{"role": "user", "content": prompt}], logprobs=True
    )  # not streamed: the recorded whole answer
    assert upstream_requests(rich_upstream) == before
    answer = whole.choices[0]
    assert answer.message.content == "".join(rich.TOKENS)
    assert (answer.message.model_extra or {})["reasoning_content"] == "".join(rich.REASONING)
    assert answer.logprobs is not None and answer.logprobs.content is not None
    assert [t.token for t in answer.logprobs.content] == rich.TOKENS


def final_completion(
    client: openai.OpenAI, rich_upstream: str, model: str, prompt: str, **extra: Any
) -> tuple[str, Any]:
    """The SDK's stream helper's accumulated answer; "hit" when no upstream request went."""
    before = upstream_requests(rich_upstream)
    messages = [{"role": "user", "content": prompt}]
    with client.chat.completions.stream(model=model, messages=messages, **extra) as stream:  # type: ignore[arg-type]
        final = stream.get_final_completion()
    return "hit" if upstream_requests(rich_upstream) == before else "miss", final


def test_tool_calls_are_replayed_for_the_sdks_stream_helper(
    client: openai.OpenAI, rich_upstream: str
) -> None:
    def ask() -> tuple[str, Any]:
        return final_completion(
            client, rich_upstream, "tools", "Weather in Paris?", tools=[WEATHER]
        )

    state, first = ask()
    assert state == "miss"
    final = when_cached(ask)
    for answer in (first, final):
        choice = answer.choices[0]
        assert choice.finish_reason == "tool_calls"
        calls = choice.message.tool_calls or []
        assert [(c.id, c.function.name) for c in calls] == [("call_w1", "get_weather")]
        assert calls[0].function.arguments == "".join(rich.ARGUMENTS)


def test_refusals_are_replayed(client: openai.OpenAI, rich_upstream: str) -> None:
    final = when_cached(lambda: final_completion(client, rich_upstream, "refuse", "Something bad"))
    message = final.choices[0].message
    assert message.refusal == "".join(rich.REFUSAL) and message.content is None


def test_text_saying_done_does_not_end_a_stream(client: openai.OpenAI, rich_upstream: str) -> None:
    messages = [{"role": "user", "content": "Cut this one"}]
    for _ in range(2):
        before = upstream_requests(rich_upstream)
        with pytest.raises(openai.APIError):
            list(client.chat.completions.create(model="rich-cut", messages=messages, stream=True))  # type: ignore[arg-type]
        assert upstream_requests(rich_upstream) == before + 1  # never stored, never a hit
        time.sleep(0.3)
