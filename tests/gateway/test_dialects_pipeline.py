"""The Messages and Responses APIs take the chat path's steps, not a side door: the
semantic cache answers a repeated request (whole, and as the other API's stream), and
the tenant's quotas refuse in the dialect's own error shape (gateway/dialects/)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import anthropic
import httpx
import openai
import pytest

from bench.processes import Gateway, start_gateway
from tests.conftest import fake_backend, hash_of

KEY = "sk-test-dialects-0123456789abcdef"
TIGHT_KEY = "sk-test-dialects-tight-0123456789"


@pytest.fixture(scope="module")
def gateway(fake_upstream: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    work = tmp_path_factory.mktemp("gw")
    config = {
        "state": {"url": "memory", "path": str(work / "state.json")},
        "backends": [fake_backend(fake_upstream)],
        "cache": {"enabled": True, "lookup_budget_ms": 3000, "path": str(work / "cache")},
        "tenants": [
            {"name": "dialects", "keys": [{"sha256": hash_of(KEY)}]},
            {
                "name": "tight",
                "keys": [{"sha256": hash_of(TIGHT_KEY)}],
                "quotas": {"requests_per_minute": 1},
            },
        ],
    }
    gw = start_gateway(config, work, timeout_s=120)
    yield gw
    gw.stop()


def _messages(gateway: Gateway, key: str, **fields: Any) -> httpx.Response:
    body = {"model": "echo", "max_tokens": 32, "temperature": 0, **fields}
    return httpx.post(f"{gateway.url}/v1/messages", json=body, headers={"x-api-key": key})


def test_a_repeated_message_is_a_cache_hit_whole_and_streamed(gateway: Gateway) -> None:
    asked = [{"role": "user", "content": "what is the capital of peru"}]
    first = _messages(gateway, KEY, messages=asked)
    again = _messages(gateway, KEY, messages=asked)
    assert first.headers["x-cache"] == "miss" and again.headers["x-cache"] == "hit"
    assert again.json()["content"] == first.json()["content"]
    assert again.json()["type"] == "message"
    with anthropic.Anthropic(base_url=gateway.url, api_key=KEY, max_retries=0) as client:
        with client.messages.stream(
            model="echo", max_tokens=32, messages=asked, extra_body={"temperature": 0}
        ) as stream:
            text = "".join(stream.text_stream)
            raw = stream.response
        assert raw.headers["x-cache"] == "hit"  # the stored answer, replayed as events
        assert text == first.json()["content"][0]["text"]


def test_a_repeated_response_is_a_cache_hit_with_its_own_id(gateway: Gateway) -> None:
    with openai.OpenAI(base_url=gateway.base_url, api_key=KEY, max_retries=0) as client:
        first = client.responses.with_raw_response.create(
            model="echo", input="what is the capital of chile", temperature=0
        )
        again = client.responses.with_raw_response.create(
            model="echo", input="what is the capital of chile", temperature=0
        )
    assert first.headers["x-cache"] == "miss" and again.headers["x-cache"] == "hit"
    assert again.parse().output_text == first.parse().output_text
    assert again.parse().id != first.parse().id  # a new response, answered from the cache


def test_quotas_refuse_in_each_apis_shape(gateway: Gateway) -> None:
    asked = [{"role": "user", "content": "hello"}]
    assert _messages(gateway, TIGHT_KEY, messages=asked).status_code == 200
    refused = _messages(gateway, TIGHT_KEY, messages=asked)
    assert refused.status_code == 429 and "retry-after" in refused.headers
    assert refused.json()["error"]["type"] == "rate_limit_error"
    assert refused.json()["type"] == "error"
    with (
        openai.OpenAI(base_url=gateway.base_url, api_key=TIGHT_KEY, max_retries=0) as client,
        pytest.raises(openai.RateLimitError),
    ):
        client.responses.create(model="echo", input="hello")
