"""Long prompts to their own pool (gateway/prompt_size.py), end to end: a gateway as a real
server in front of two fake upstreams, one for `slow-chat`'s prompts above 50 tokens (one
request at a time) and one for the rest; each upstream's `/_stats` says which answered."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from bench.processes import OPERATOR, Gateway, free_port, start_fake_upstream
from tests.conftest import GatewayFactory, hash_of

KEY = "sk-test-prompt-size-0123456789"
SHORT, AT_THRESHOLD, LONG = "hello", "x" * 200, "word " * 60  # ~2, 50 and 75 tokens


@pytest.fixture
def short_up(fake_upstream: str) -> str:
    """The session's fake upstream serves the short prompts (the tests count its calls
    before and after); the long ones need an upstream of their own, to tell them apart."""
    return fake_upstream


@pytest.fixture(scope="module")
def long_up(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    server, base_url = start_fake_upstream(tmp_path_factory.mktemp("long"))
    yield base_url
    server.stop()


@pytest.fixture
def gateway(
    gateway_factory: GatewayFactory, short_up: str, long_up: str, tmp_path: Path
) -> Gateway:
    nowhere = f"http://127.0.0.1:{free_port()}/v1"  # no listener
    one_at_a_time = {"max_concurrency": 1, "concurrency": {"mode": "fixed"}}
    config = {
        "state": {"url": "memory", "path": str(tmp_path / "state.json")},
        "cache": {"enabled": False},
        "backends": [
            {"name": "short", "base_url": short_up, "models": ["slow-chat", "long-down"]},
            {
                "name": "long",
                "base_url": long_up,
                "models": ["slow-chat"],
                "prompt_tokens_above": 50,
                **one_at_a_time,
            },
            {
                "name": "down",
                "base_url": nowhere,
                "models": ["long-down"],
                "prompt_tokens_above": 50,
            },
            {"name": "gone", "base_url": nowhere, "models": ["gone"]},
        ],
        "fallbacks": {"gone": ["slow-chat"]},
        "tenants": [{"name": "a", "keys": [{"sha256": hash_of(KEY)}]}],
        "traffic": {"retry": {"max_attempts": 1}},
    }
    return gateway_factory(config)


def ask(gateway: Gateway, model: str, prompt: str, delay_s: float = 0.0) -> Any:
    """The raw response of a whole answer; the upstream takes `delay_s` to give it."""
    client = openai.OpenAI(base_url=gateway.base_url, api_key=KEY, max_retries=0, timeout=30)
    with client:
        raw = client.chat.completions.with_raw_response.create(
            model=model,
            messages=[{"role": "user", "content": prompt}],
            extra_body={"x_delay": delay_s},
        )
        raw.parse()
        return raw


def calls(upstream: str, model: str) -> int:
    stats = httpx.get(upstream.removesuffix("/v1") + "/_stats").json()
    return int(stats.get(f"model:{model}", 0))


def routed(gateway: Gateway, **labels: str) -> float:
    text = httpx.get(gateway.url + "/metrics", headers=OPERATOR).text
    total = 0.0
    pattern = r"^gateway_prompt_size_routed_total\{(.*)\} (\S+)$"
    for found, value in re.findall(pattern, text, re.M):
        if dict(re.findall(r'(\w+)="([^"]*)"', found)) == labels:
            total += float(value)
    return total


def test_long_prompts_go_to_their_backend_and_the_others_to_the_models_other(
    gateway: Gateway, short_up: str, long_up: str
) -> None:
    short_before, long_before = calls(short_up, "slow-chat"), calls(long_up, "slow-chat")
    for prompt in (SHORT, AT_THRESHOLD, LONG):
        answer = ask(gateway, "slow-chat", prompt).parse()
        assert answer.choices[0].message.content == f"echo: {prompt}"
    assert calls(short_up, "slow-chat") - short_before == 2  # exactly 50 tokens stays short
    assert calls(long_up, "slow-chat") - long_before == 1
    assert routed(gateway, model="slow-chat", backend="short") == 2
    assert routed(gateway, model="slow-chat", backend="long") == 1
    assert routed(gateway, model="gone", backend="gone") == 0  # not a model with sizes
    listed = httpx.get(gateway.base_url + "/models", headers={"authorization": f"Bearer {KEY}"})
    assert [m["id"] for m in listed.json()["data"]] == ["slow-chat", "long-down", "gone"]


def test_embeddings_are_routed_by_the_same_rule(
    gateway: Gateway, short_up: str, long_up: str
) -> None:
    short_before, long_before = calls(short_up, "slow-chat"), calls(long_up, "slow-chat")
    client = openai.OpenAI(base_url=gateway.base_url, api_key=KEY, max_retries=0, timeout=30)
    with client:
        for text in (SHORT, LONG):
            client.embeddings.create(model="slow-chat", input=text, extra_body={"x_delay": 0})
    assert calls(short_up, "slow-chat") - short_before == 1
    assert calls(long_up, "slow-chat") - long_before == 1


def test_short_requests_are_not_queued_behind_long_ones(
    gateway: Gateway, short_up: str, long_up: str
) -> None:
    """The long backend takes one request at a time: one long request holds it for 3 s and
    a second waits in its queue; a short request meanwhile is answered at once."""
    long_before = calls(long_up, "slow-chat")
    with ThreadPoolExecutor(2) as pool:
        held = [pool.submit(ask, gateway, "slow-chat", LONG, 3.0) for _ in range(2)]
        time.sleep(0.5)
        started = time.monotonic()
        ask(gateway, "slow-chat", SHORT)
        elapsed_s = time.monotonic() - started
        assert not any(future.done() for future in held)  # the long ones were still there
        assert [future.result().parse().model for future in held] == ["slow-chat"] * 2
    assert elapsed_s < 1.5
    assert calls(long_up, "slow-chat") - long_before == 2


def test_a_long_prompt_whose_backend_is_down_does_not_overflow_into_the_other(
    gateway: Gateway, short_up: str
) -> None:
    """The other backend's context may be too short for it: the client gets the error."""
    before = calls(short_up, "long-down")
    with pytest.raises(openai.APIStatusError) as failed:
        ask(gateway, "long-down", LONG)
    assert failed.value.status_code in (502, 503)
    assert calls(short_up, "long-down") == before
    ask(gateway, "long-down", SHORT)  # the short prompts' backend is up
    assert calls(short_up, "long-down") - before == 1


def test_a_fallback_is_routed_by_the_prompts_size_too(
    gateway: Gateway, short_up: str, long_up: str
) -> None:
    short_before, long_before = calls(short_up, "slow-chat"), calls(long_up, "slow-chat")
    for prompt in (LONG, SHORT):
        raw = ask(gateway, "gone", prompt)
        assert raw.headers["x-model-fallback"] == "slow-chat"
    assert calls(short_up, "slow-chat") - short_before == 1
    assert calls(long_up, "slow-chat") - long_before == 1
