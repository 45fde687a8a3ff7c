"""Spend budgets through a real gateway process: every answer is charged what the engine
counted at the model's price (whole and streamed), the remainder is in each answer's
headers and the admin API, and a request that could exceed the budget is refused before
it is sent. Prices: $0.01 a prompt token and $0.02 an output token, so that a handful of
requests spends a budget of $1."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import openai
import pytest

from bench.processes import Gateway, start_gateway
from gateway.settings import Settings
from tests.conftest import fake_backend, hash_of

KEY = "sk-test-spender-0123456789abcdef"
ADMIN_KEY = "sk-test-spend-admin-0123456789abcdef"
PRICE = {"input_per_1m_tokens": 10_000, "output_per_1m_tokens": 20_000}


@pytest.fixture(scope="module")
def gateway(fake_upstream: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    work = tmp_path_factory.mktemp("gw")
    config = {
        "state": {"url": "memory", "path": str(work / "state.json")},
        "backends": [fake_backend(fake_upstream)],
        "cache": {"enabled": False},
        "pricing": {"echo": PRICE},
        "admin": {"keys": [{"sha256": hash_of(ADMIN_KEY)}]},
        "tenants": [
            {
                "name": "spender",
                "models": ["echo"],
                "keys": [{"sha256": hash_of(KEY)}],
                "quotas": {"usd_per_day": 1.0},
            }
        ],
    }
    gw = start_gateway(config, work)
    yield gw
    gw.stop()


def spent(gateway: Gateway) -> dict[str, float]:
    headers = {"authorization": f"Bearer {ADMIN_KEY}"}
    usage = httpx.get(f"{gateway.url}/admin/tenants/spender/usage", headers=headers).json()
    assert usage["usd_this_month"] is None  # no monthly budget
    return usage["usd_today"]


def cost(prompt: int, completion: int) -> float:
    return prompt * 0.01 + completion * 0.02


def upstream_requests(fake_upstream: str) -> int:
    stats = httpx.get(fake_upstream.removesuffix("/v1") + "/_stats").json()
    return int(stats["requests"])


def test_answers_are_charged_what_the_engine_counted_and_a_costly_one_is_refused(
    gateway: Gateway, fake_upstream: str
) -> None:
    client = openai.OpenAI(base_url=gateway.base_url, api_key=KEY, max_retries=0)
    with client:
        whole = client.chat.completions.with_raw_response.create(
            model="echo", messages=[{"role": "user", "content": "one two"}], max_tokens=5
        )
        answer = whole.parse()
        assert answer.usage is not None
        charged = cost(answer.usage.prompt_tokens, answer.usage.completion_tokens)
        assert spent(gateway)["used_usd"] == pytest.approx(charged)
        left = float(whole.headers["x-budget-remaining-usd-day"])
        assert left < 1.0  # the answer's headers count its own hold
        stream = client.chat.completions.create(
            model="echo",
            messages=[{"role": "user", "content": "three four five"}],
            max_tokens=5,
            stream=True,
            stream_options={"include_usage": True},
        )
        usage = [c.usage for c in stream if c.usage is not None][-1]
        charged += cost(usage.prompt_tokens, usage.completion_tokens)
        assert spent(gateway)["used_usd"] == pytest.approx(charged)
        assert spent(gateway)["remaining_usd"] == pytest.approx(1.0 - charged)

        before = upstream_requests(fake_upstream)
        with pytest.raises(openai.RateLimitError) as refused:
            client.chat.completions.create(
                model="echo", messages=[{"role": "user", "content": "hi"}], max_tokens=100
            )
    error = refused.value.body
    assert isinstance(error, dict) and error["code"] == "insufficient_quota"
    assert "spend budget for this UTC day" in error["message"]
    assert refused.value.response.headers["x-budget-remaining-usd-day"] == f"{1.0 - charged:.6f}"
    assert upstream_requests(fake_upstream) == before  # refused before it was sent
    assert spent(gateway)["used_usd"] == pytest.approx(charged)  # and charged nothing


def test_a_spend_budget_needs_every_model_it_may_use_priced(fake_upstream: str) -> None:
    config = {
        "backends": [fake_backend(fake_upstream)],
        "pricing": {"echo": PRICE},
        "tenants": [{"name": "t", "quotas": {"usd_per_month": 5}}],  # may use every model
    }
    with pytest.raises(ValueError, match="'slow', which has no price"):
        Settings.model_validate(config)
    narrowed = {**config, "tenants": [{**config["tenants"][0], "models": ["echo"]}]}
    assert Settings.model_validate(narrowed).tenants[0].quotas.usd_per_month == 5
