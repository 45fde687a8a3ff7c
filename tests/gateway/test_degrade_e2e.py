"""Degradation under overload (gateway/degrade.py), end to end: a gateway as a real server
in front of the fake upstream, whose `slow-*` models take one request at a time; a first
request holds the slot, and the next one finds a queue that is long for its deadline."""

from __future__ import annotations

import re
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from bench.processes import OPERATOR, Gateway, start_fake_upstream
from tests.conftest import GatewayFactory, hash_of
from tests.support.slots import holding

KEY, ROUTED = "sk-test-degrade-a-0123456789", "sk-test-degrade-r-0123456789"


@pytest.fixture(scope="module")
def upstream(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    server, base_url = start_fake_upstream(tmp_path_factory.mktemp("up"))
    yield base_url
    server.stop()


@pytest.fixture
def gateway(gateway_factory: GatewayFactory, upstream: str, tmp_path: Path) -> Gateway:
    one = {"max_concurrency": 1, "concurrency": {"mode": "fixed"}}
    route = {"when_wait_over": 0.1, "model": "small"}
    config = {
        "state": {"url": "memory", "path": str(tmp_path / "state.json")},
        "cache": {"enabled": False},
        "backends": [
            {"name": "busy", "base_url": upstream, "models": ["slow-busy"], **one},
            {"name": "plain", "base_url": upstream, "models": ["slow-plain"], **one},
            {"name": "spare", "base_url": upstream, "models": ["small"]},
        ],
        "degrade": {"slow-busy": {"when_wait_over": 0.1, "max_tokens": 16}},
        "tenants": [
            {"name": "a", "priority": "batch", "keys": [{"sha256": hash_of(KEY)}]},
            {
                "name": "r",
                "priority": "batch",
                "degrade": route,
                "keys": [{"sha256": hash_of(ROUTED)}],
            },
        ],
    }
    return gateway_factory(config)


def ask(gateway: Gateway, model: str, key: str = KEY, **extra: Any) -> Any:
    client = openai.OpenAI(base_url=gateway.base_url, api_key=key, max_retries=0, timeout=30)
    with client:
        raw = client.chat.completions.with_raw_response.create(
            model=model, messages=[{"role": "user", "content": "hi"}], max_tokens=500, **extra
        )
        raw.parse()
        return raw


def behind_a_busy_slot(gateway: Gateway, model: str, timeout_s: str, key: str = KEY) -> Any:
    """The answer to a request sent while another holds `model`'s one slot (~1.5 s more);
    expected wait: one mean service time (1 s before any is measured)."""
    holder = threading.Thread(
        target=ask, args=(gateway, model), kwargs={"extra_body": {"x_delay": 1.5}}
    )
    holder.start()
    try:
        holding(gateway, model.removeprefix("slow-"))
        headers = {"x-request-timeout": timeout_s}
        return ask(gateway, model, key, extra_headers=headers, extra_body={"x_delay": 0.05})
    finally:
        holder.join()


def capped(upstream: str, tokens: int) -> int:
    stats = httpx.get(upstream.removesuffix("/v1") + "/_stats").json()
    return int(stats.get(f"max_tokens:{tokens}", 0))


def degraded(gateway: Gateway, **labels: str) -> float:
    text = httpx.get(gateway.url + "/metrics", headers=OPERATOR).text
    total = 0.0
    for found, value in re.findall(r"^gateway_degraded_total\{(.*)\} (\S+)$", text, re.M):
        if dict(re.findall(r'(\w+)="([^"]*)"', found)) == labels:
            total += float(value)
    return total


def test_without_a_policy_the_request_waits_as_asked(gateway: Gateway, upstream: str) -> None:
    before = capped(upstream, 500)
    raw = behind_a_busy_slot(gateway, "slow-plain", "5")
    assert "x-degraded" not in raw.headers
    assert capped(upstream, 500) - before == 2  # the holder and this one, uncapped


def test_a_long_queue_caps_the_output_of_a_batch_request(gateway: Gateway, upstream: str) -> None:
    before = capped(upstream, 16)
    raw = behind_a_busy_slot(gateway, "slow-busy", "5")
    assert raw.headers["x-degraded"] == "max_tokens=16"
    assert raw.parse().model == "slow-busy"
    assert capped(upstream, 16) - before == 1
    assert degraded(gateway, tenant="a", model="slow-busy", action="max_tokens") == 1


def test_a_long_queue_sends_the_request_to_the_cheaper_model(gateway: Gateway) -> None:
    raw = behind_a_busy_slot(gateway, "slow-busy", "5", key=ROUTED)
    assert raw.headers["x-degraded"] == "model=small"
    assert raw.parse().model == "small"
    assert degraded(gateway, tenant="r", model="slow-busy", action="model") == 1


def test_a_request_even_the_degraded_form_cannot_serve_in_time_is_shed(gateway: Gateway) -> None:
    with pytest.raises(openai.APIStatusError) as shed:
        behind_a_busy_slot(gateway, "slow-busy", "1")
    assert shed.value.status_code == 503
