"""Model fallbacks (gateway/fallback.py), end to end: a gateway as a real server in front of
a backend with no listener, and of the fake upstream as three more backends; the official
`openai` client reads the answers."""

from __future__ import annotations

import re
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from bench.processes import OPERATOR, Gateway, free_port, start_fake_upstream
from tests.conftest import GatewayFactory, hash_of
from tests.support.slots import holding

KEY, NARROW = "sk-test-fallback-a-0123456789", "sk-test-fallback-c-0123456789"


@pytest.fixture(scope="module")
def upstream(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    server, base_url = start_fake_upstream(tmp_path_factory.mktemp("up"))
    yield base_url
    server.stop()


@pytest.fixture
def gateway(gateway_factory: GatewayFactory, upstream: str, tmp_path: Path) -> Gateway:
    def backend(name: str, base_url: str, models: list[str], **extra: Any) -> dict[str, Any]:
        return {"name": name, "base_url": base_url, "models": models, **extra}

    busy = {"max_concurrency": 1, "concurrency": {"mode": "fixed"}}
    config = {
        "state": {"url": "memory", "path": str(tmp_path / "state.json")},
        "cache": {"enabled": False},
        "backends": [
            backend("primary", f"http://127.0.0.1:{free_port()}/v1", ["big"]),  # no listener
            backend("busy", upstream, ["slow-busy"], **busy),
            backend("flaky", upstream, ["die-midstream"], fallbacks={"die-midstream": ["small"]}),
            backend("spare", upstream, ["small"]),
        ],
        "fallbacks": {"big": ["small"], "slow-busy": ["small"]},
        "tenants": [
            {"name": "a", "keys": [{"sha256": hash_of(KEY)}]},
            {"name": "c", "models": ["big", "slow-busy"], "keys": [{"sha256": hash_of(NARROW)}]},
        ],
        # One retry token, refilled over 10 s, and no retries of its own: the budget
        # allows one more upstream attempt, and a fallback is one.
        "traffic": {"retry_budget_ratio": 0, "retry_min_per_s": 0.1, "retry": {"max_attempts": 1}},
    }
    return gateway_factory(config)


def client(gateway: Gateway, key: str = KEY) -> openai.OpenAI:
    return openai.OpenAI(base_url=gateway.base_url, api_key=key, max_retries=0, timeout=30)


def ask(gateway: Gateway, model: str, key: str = KEY, **extra: Any) -> Any:
    """The raw response of a whole answer (read: its client is closed after)."""
    with client(gateway, key) as openai_client:
        raw = openai_client.chat.completions.with_raw_response.create(
            model=model, messages=[{"role": "user", "content": "hello there"}], **extra
        )
        raw.parse()
        return raw


def small_calls(upstream: str) -> int:
    return int(httpx.get(upstream.removesuffix("/v1") + "/_stats").json().get("model:small", 0))


def metric(gateway: Gateway, name: str, **labels: str) -> float:
    text = httpx.get(gateway.url + "/metrics", headers=OPERATOR).text
    total = 0.0
    for line in re.findall(rf"^{name}\{{(.*)\}} (\S+)$", text, re.M):
        found = dict(re.findall(r'(\w+)="([^"]*)"', line[0]))
        if all(found.get(k) == v for k, v in labels.items()):
            total += float(line[1])
    return total


def test_a_model_that_is_down_is_answered_by_its_fallback_within_the_budget(
    gateway: Gateway, upstream: str
) -> None:
    before = small_calls(upstream)
    raw = ask(gateway, "big")
    assert raw.headers["x-model-fallback"] == "small"
    answer = raw.parse()
    assert answer.model == "small"
    assert answer.choices[0].message.content == "echo: hello there"
    # The budget's one token went to that fallback: the next request gets the model's error.
    with pytest.raises(openai.APIStatusError) as failed:
        ask(gateway, "big")
    assert failed.value.status_code == 502
    assert small_calls(upstream) - before == 1
    assert metric(gateway, "gateway_upstream_errors_total", backend="primary") == 2
    labels = {"model": "big", "fallback": "small", "reason": "failing"}
    assert metric(gateway, "gateway_model_fallbacks_total", **labels) == 1


def test_a_model_that_would_shed_the_request_is_answered_by_its_fallback(
    gateway: Gateway, upstream: str
) -> None:
    """`slow-busy` takes one request at a time: a second one, whose deadline its queue
    cannot meet, is shed on arrival, and the fallback answers it."""
    first: list[Any] = []
    holder = threading.Thread(
        target=lambda: first.append(ask(gateway, "slow-busy", extra_body={"x_delay": 2}))
    )
    holder.start()
    holding(gateway, "busy")
    raw = ask(gateway, "slow-busy", extra_headers={"x-request-timeout": "1"})
    assert raw.headers["x-model-fallback"] == "small"
    assert raw.parse().model == "small"
    holder.join()
    assert "x-model-fallback" not in first[0].headers
    assert first[0].parse().model == "slow-busy"
    labels = {"model": "slow-busy", "fallback": "small", "reason": "overloaded"}
    assert metric(gateway, "gateway_model_fallbacks_total", **labels) == 1


def test_a_tenant_not_allowed_the_fallback_gets_the_models_error(
    gateway: Gateway, upstream: str
) -> None:
    before = small_calls(upstream)
    with pytest.raises(openai.APIStatusError) as failed:
        ask(gateway, "big", key=NARROW)
    assert failed.value.status_code == 502
    assert small_calls(upstream) == before
    # The budget was there: a tenant allowed the fallback gets it.
    assert ask(gateway, "big").headers["x-model-fallback"] == "small"


def test_no_fallback_once_the_answer_has_begun(gateway: Gateway, upstream: str) -> None:
    """The stream breaks off after two chunks: the client has them, and gets the error
    event; no other model is asked."""
    before = small_calls(upstream)
    text = ""
    with client(gateway) as openai_client:
        stream = openai_client.chat.completions.with_raw_response.create(
            model="die-midstream", messages=[{"role": "user", "content": "hi"}], stream=True
        )
        assert "x-model-fallback" not in stream.headers
        with pytest.raises(openai.APIError):
            for chunk in stream.parse():
                text += chunk.choices[0].delta.content or "" if chunk.choices else ""
    assert text.startswith("echo:")
    assert small_calls(upstream) == before


def test_a_model_whose_circuit_is_open_costs_its_fallbacks_no_retry_budget(
    gateway_factory: GatewayFactory, upstream: str, tmp_path: Path
) -> None:
    """The first request's call to the dead primary fails and opens its circuit (one
    failure opens it); its fallback spends the budget's one token. After that the primary
    calls no upstream at all, so each later request's fallback is its first and only
    upstream call: all are answered, none costs a token (there is none left)."""
    config = {
        "state": {"url": "memory", "path": str(tmp_path / "state.json")},
        "cache": {"enabled": False},
        "backends": [
            {
                "name": "primary",
                "base_url": f"http://127.0.0.1:{free_port()}/v1",
                "models": ["big"],
            },
            {"name": "spare", "base_url": upstream, "models": ["small"]},
        ],
        "fallbacks": {"big": ["small"]},
        "tenants": [{"name": "a", "keys": [{"sha256": hash_of(KEY)}]}],
        "traffic": {
            "retry_budget_ratio": 0,
            "retry_min_per_s": 0.1,
            "retry": {"max_attempts": 1},
            "breaker_failures": 1,
            "breaker_open_s": 60,
        },
    }
    gateway = gateway_factory(config)
    before = small_calls(upstream)
    answers = [ask(gateway, "big") for _ in range(6)]
    assert [raw.headers["x-model-fallback"] for raw in answers] == ["small"] * 6
    assert small_calls(upstream) - before == 6
    assert metric(gateway, "gateway_upstream_errors_total", backend="primary") == 1
    assert metric(gateway, "gateway_model_fallbacks_total", reason="unavailable") == 5
