"""The semantic cache end to end: real MiniLM, real FAISS, real Redis, the gateway as a real
server, the official `openai` client. The fake upstream echoes the prompt it answered, so a
hit is visible in the content: the answer names the *cached* prompt, not the new one."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from bench.processes import (
    OPERATOR,
    Gateway,
    RedisServer,
    start_fake_upstream,
    start_gateway,
)
from tests.conftest import GatewayFactory, fake_backend, hash_of

KEY_A, KEY_B = "sk-test-cache-a-0123456789", "sk-test-cache-b-0123456789"


def cache_config(upstream: str, state: dict[str, Any], **cache: Any) -> dict[str, Any]:
    # A generous lookup budget: this shared 2-core machine can be slow, and these tests
    # are about what the cache answers, not how fast (bench/cache_latency.py measures that).
    return {
        "state": state,
        "cache": {"enabled": True, "lookup_budget_ms": 3000, **cache},
        "backends": [fake_backend(upstream)],
        "tenants": [
            {"name": "a", "keys": [{"sha256": hash_of(KEY_A)}]},
            {"name": "b", "keys": [{"sha256": hash_of(KEY_B)}]},
        ],
    }


@pytest.fixture(scope="module")
def upstream(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    server, base_url = start_fake_upstream(tmp_path_factory.mktemp("up"))
    yield base_url
    server.stop()


@pytest.fixture(scope="module")
def gateway(upstream: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    work = tmp_path_factory.mktemp("cache-gw")
    state = {"url": "memory", "path": str(work / "state.json")}
    gw = start_gateway(cache_config(upstream, state, path=str(work / "cache")), work, timeout_s=120)
    yield gw
    gw.stop()


def upstream_calls(upstream: str) -> int:
    return int(httpx.get(upstream.removesuffix("/v1") + "/_stats").json()["requests"])


def ask(
    gw: Gateway,
    prompt: str,
    key: str = KEY_A,
    system: str = "Be brief.",
    model: str = "echo",
    headers: dict[str, str] | None = None,
    **extra: Any,
) -> httpx.Response:
    body = {
        "model": model,
        "messages": [{"role": "system", "content": system}, {"role": "user", "content": prompt}],
        **extra,
    }
    response = httpx.post(
        gw.base_url + "/chat/completions",
        json=body,
        timeout=30,
        headers={"Authorization": f"Bearer {key}", **(headers or {})},
    )
    assert response.status_code == 200, response.text
    return response


def content(response: httpx.Response) -> str:
    return str(response.json()["choices"][0]["message"]["content"])


def stored(gw: Gateway, prompt: str, **kw: Any) -> httpx.Response:
    """Asks once (a miss) and waits until the answer is in the cache."""
    first = ask(gw, prompt, **kw)
    assert first.headers["x-cache"] == "miss"
    deadline = time.monotonic() + 5
    while ask(gw, prompt, **kw).headers["x-cache"] != "hit":
        assert time.monotonic() < deadline, f"{prompt!r} was not stored"
        time.sleep(0.05)
    return first


def test_exact_repeat_is_served_from_cache(gateway: Gateway, upstream: str) -> None:
    asked = time.time()  # the entry is created after this and before `stored` returns
    stored(gateway, "What is the capital of Australia?")
    in_cache = time.time()
    time.sleep(1.5)
    before = upstream_calls(upstream)
    sent = time.time()
    again = ask(gateway, "What is the capital of Australia?")
    answered = time.time()
    assert upstream_calls(upstream) == before
    assert again.headers["x-cache-tier"] == "exact"
    assert content(again) == "echo: What is the capital of Australia?"
    usage = again.json()["usage"]
    assert usage["total_tokens"] == 0 and usage["saved_tokens"] > 0
    # Whole seconds since the entry was created (the gateway's clock is this one): at least 1.
    assert int(sent - in_cache) <= int(again.headers["age"]) <= int(answered - asked)


def test_a_repeat_right_after_the_answer_hits_and_a_miss_says_why(
    gateway: Gateway, upstream: str
) -> None:
    """No waiting for the background store: once an answer is complete, the identical
    request is a hit. Misses carry `x-cache-miss-reason` (no prompt text); every answer
    that looked the cache up says how long it waited in `server-timing`."""
    system = "You answer astronomy quizzes."  # a namespace of this test's own: empty
    first = ask(gateway, "Which planet has the most moons?", system=system)
    assert first.headers["x-cache"] == "miss"
    assert first.headers["x-cache-miss-reason"] == "no_candidate"
    before = upstream_calls(upstream)
    again = ask(gateway, "Which planet has the most moons?", system=system)
    assert (again.headers["x-cache"], again.headers["x-cache-tier"]) == ("hit", "exact")
    for answer in (first, again):  # how long each waited on the lookup, hit or miss
        name, _, duration = answer.headers["server-timing"].partition(";dur=")
        assert name == "cache" and 0 <= float(duration) < 60_000
    assert upstream_calls(upstream) == before
    long = ask(gateway, "Describe the rings of Saturn. " * 30, system=system)
    assert long.headers["x-cache-miss-reason"] == "no_entry"  # too long to embed: exact only
    assert "x-cache-miss-reason" not in again.headers


def test_case_and_punctuation_variant_hits_normalized_tier(gateway: Gateway) -> None:
    stored(gateway, "How do I undo the last git commit?")
    variant = ask(gateway, "how do I undo the last git commit")
    assert variant.headers["x-cache"] == "hit"
    assert variant.headers["x-cache-tier"] == "normalized"
    assert content(variant) == "echo: How do I undo the last git commit?"


@pytest.mark.parametrize(
    ("cached", "asked"),
    [
        ("Convert 10 km to miles", "Convert 12 km to miles"),
        ("Convert 5 km to miles", "Convert 5 miles to km"),
        (
            "Sort this list in ascending order: 3, 1, 2",
            "Sort this list in descending order: 3, 1, 2",
        ),
        (
            "Write a SQL query that selects users with orders",
            "Write a SQL query that selects users without orders",
        ),
        ("Solve for x: 2x - 5 = 11", "Solve for x: 2x + 5 = 11"),
    ],
)
def test_different_meaning_is_never_served(gateway: Gateway, cached: str, asked: str) -> None:
    stored(gateway, cached)
    other = ask(gateway, asked)
    assert other.headers["x-cache"] == "miss", other.headers.get("x-cache-tier")
    assert content(other) == f"echo: {asked}"


def test_paraphrases_hit_semantic_tier(gateway: Gateway) -> None:
    pairs = [
        ("How do I reverse a list in Python?", "How can I reverse a list in Python?"),
        (
            "What is the boiling point of water at sea level?",
            "At sea level, what is the boiling point of water?",
        ),
        ("How do I reset my password?", "How can I reset my password?"),
    ]
    hits = []
    for cached, asked in pairs:
        stored(gateway, cached)
        answer = ask(gateway, asked)
        if answer.headers["x-cache"] == "hit":
            assert answer.headers["x-cache-tier"] == "semantic"
            assert 0.8 <= float(answer.headers["x-cache-similarity"]) <= 1.0
            assert content(answer) == f"echo: {cached}"
            hits.append(asked)
    assert len(hits) >= 2, f"paraphrases served from cache: {hits}"


def test_tenants_never_share_entries(gateway: Gateway) -> None:
    stored(gateway, "Summarise our refund policy", key=KEY_A)
    other = ask(gateway, "Summarise our refund policy", key=KEY_B)
    assert other.headers["x-cache"] == "miss"
    # Nothing the client sends can pick another tenant's namespace.
    stored(gateway, "Summarise our privacy policy", key=KEY_A)
    forged = ask(
        gateway,
        "Summarise our privacy policy",
        key=KEY_B,
        headers={"x-tenant": "a", "x-cache-namespace": "tenant:a"},
        user="a",
    )
    assert forged.headers["x-cache"] == "miss"


def test_other_system_prompt_model_or_parameters_miss(gateway: Gateway) -> None:
    stored(gateway, "Name three prime numbers")
    assert (
        ask(gateway, "Name three prime numbers", system="Answer in French.").headers["x-cache"]
        == "miss"
    )
    assert ask(gateway, "Name three prime numbers", model="slow").headers["x-cache"] == "miss"
    assert ask(gateway, "Name three prime numbers", max_tokens=5).headers["x-cache"] == "miss"


def test_cache_control_headers(gateway: Gateway, upstream: str) -> None:
    stored(gateway, "List the planets of the solar system")
    before = upstream_calls(upstream)
    fresh = ask(
        gateway, "List the planets of the solar system", headers={"Cache-Control": "no-cache"}
    )
    assert fresh.headers["x-cache"] == "bypass" and upstream_calls(upstream) == before + 1
    ask(gateway, "A question never stored", headers={"Cache-Control": "no-store"})
    assert ask(gateway, "A question never stored").headers["x-cache"] == "miss"
    hot = ask(gateway, "List the planets of the solar system", temperature=1.7)
    assert hot.headers["x-cache"] == "bypass"


def test_streamed_answer_is_stored_and_replayed_as_valid_sse(gateway: Gateway) -> None:
    client = openai.OpenAI(base_url=gateway.base_url, api_key=KEY_A, max_retries=0)
    messages = [{"role": "user", "content": "Explain recursion in one sentence"}]
    first = "".join(
        c.choices[0].delta.content or ""
        for c in client.chat.completions.create(model="echo", messages=messages, stream=True)
    )  # type: ignore[arg-type]
    assert first == "echo: Explain recursion in one sentence"
    deadline = time.monotonic() + 5
    while True:
        raw = client.chat.completions.with_raw_response.create(
            model="echo",
            messages=messages,
            stream=True,  # type: ignore[arg-type]
            stream_options={"include_usage": True},
        )
        chunks = list(raw.parse())
        if raw.headers["x-cache"] == "hit":
            break
        assert time.monotonic() < deadline, "streamed answer was not stored"
        time.sleep(0.05)
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == first
    assert chunks[0].choices[0].delta.role == "assistant"
    assert chunks[-1].usage is not None and chunks[-1].usage.total_tokens == 0


def test_cut_stream_is_never_stored(gateway: Gateway, upstream: str) -> None:
    client = openai.OpenAI(base_url=gateway.base_url, api_key=KEY_A, max_retries=0)
    messages = [{"role": "user", "content": "This stream breaks"}]
    for _ in range(2):
        before = upstream_calls(upstream)
        with pytest.raises(openai.APIError):
            list(
                client.chat.completions.create(
                    model="die-midstream",
                    messages=messages,  # type: ignore[arg-type]
                    stream=True,
                )
            )
        assert upstream_calls(upstream) == before + 1
        time.sleep(0.3)


def test_upstream_errors_are_never_stored(gateway: Gateway, upstream: str) -> None:
    body = {"model": "error-500", "messages": [{"role": "user", "content": "fail please"}]}
    headers = {"Authorization": f"Bearer {KEY_A}"}
    for _ in range(2):
        before = upstream_calls(upstream)
        answer = httpx.post(gateway.base_url + "/chat/completions", json=body, headers=headers)
        assert answer.status_code == 502 and upstream_calls(upstream) == before + 1
        time.sleep(0.3)


def test_the_pair_model_serves_a_rewording_the_verifier_refused(gateway: Gateway) -> None:
    """The decision's second opinion through the gateway: the content-word rule refuses
    this rewording, the pair model (cache/cross.py) serves it."""
    system = "You recommend films."  # a namespace of this test's own
    stored(gateway, "What are some good horror movies?", system=system)
    answer = ask(gateway, "Which are the best horror movies to watch?", system=system)
    assert (answer.headers["x-cache"], answer.headers["x-cache-tier"]) == ("hit", "semantic")
    assert content(answer) == "echo: What are some good horror movies?"
    text = httpx.get(gateway.url + "/metrics", headers=OPERATOR).text
    assert 'gateway_cache_lookup_seconds_count{stage="pair_model"}' in text


def test_identical_requests_at_once_share_one_lookup(gateway: Gateway) -> None:
    """Sixteen identical requests sent at once: each gets the semantic hit, and those that
    came while the first one's lookup ran were answered by it (stage `shared`) instead
    of embedding the prompt again. Whether one comes while it runs depends on the
    machine: in a clean-clone `make test` (two workers on two cores, 2026-12-06) every
    lookup of a burst once ended before the next request reached it. So up to three
    bursts, each in a namespace of its own, until one shares; every burst must account
    for each of its lookups."""
    for attempt in range(3):
        shared, embedded = _burst(gateway, f"You answer account questions ({attempt}).")
        assert embedded + shared == 16  # each lookup embedded its prompt or shared another's
        if shared >= 1:
            break
    assert shared >= 1


def _burst(gateway: Gateway, system: str) -> tuple[float, float]:
    """Sixteen identical requests at once in the namespace `system`, once its entry is
    stored; all must be semantic hits. (lookups shared, prompts embedded) meanwhile."""
    stored(gateway, "How do I delete my account?", system=system)
    deadline = time.monotonic() + 5  # embedded and in the store, not only pending
    while ask(gateway, "how do I delete my account", system=system).headers["x-cache"] != "hit":
        assert time.monotonic() < deadline
        time.sleep(0.05)
    before = _metric_totals(httpx.get(gateway.url + "/metrics", headers=OPERATOR).text)
    body = {
        "model": "echo",
        "messages": [
            {"role": "system", "content": system},
            {"role": "user", "content": "How can I delete my account?"},
        ],
    }

    async def asked() -> list[httpx.Response]:
        headers = {"Authorization": f"Bearer {KEY_A}"}
        async with httpx.AsyncClient(base_url=gateway.base_url, headers=headers) as client:
            sent = [client.post("/chat/completions", json=body, timeout=30) for _ in range(16)]
            return await asyncio.gather(*sent)

    answers = asyncio.run(asked())
    assert {(a.status_code, a.headers["x-cache"], a.headers["x-cache-tier"]) for a in answers} == {
        (200, "hit", "semantic")
    }
    assert {content(a) for a in answers} == {"echo: How do I delete my account?"}
    after = _metric_totals(httpx.get(gateway.url + "/metrics", headers=OPERATOR).text)
    stage = 'gateway_cache_lookup_seconds_count{stage="shared"}'
    shared = after.get(stage, 0.0) - before.get(stage, 0.0)
    texts = "gateway_cache_embedder_texts_total"
    return shared, after[texts] - before[texts]


def _metric_totals(text: str) -> dict[str, float]:
    """The embedder's totals and the lookup stages' counts in a /metrics exposition."""
    return {
        name: float(value)
        for name, value in (line.rsplit(" ", 1) for line in text.splitlines())
        if name.startswith(("gateway_cache_embedder_", "gateway_cache_lookup_seconds_count"))
    }


def test_metrics_count_hits_misses_and_stages(gateway: Gateway) -> None:
    text = httpx.get(gateway.url + "/metrics", headers=OPERATOR).text
    assert 'result="hit",tenant="a",tier="exact"' in text
    assert 'result="miss",tenant="a",tier="-"' in text
    assert 'gateway_cache_lookup_seconds_bucket{le="0.01",stage="embed"}' in text
    assert 'gateway_cache_lookup_seconds_bucket{le="0.01",stage="search"}' in text
    entries = [line for line in text.splitlines() if line.startswith("gateway_cache_entries ")]
    assert entries and float(entries[0].split()[1]) >= 5
    totals = _metric_totals(text)
    assert totals["gateway_cache_embedder_texts_total"] >= 5  # the stored prompts at least
    assert 0 < totals["gateway_cache_embedder_busy_seconds_total"] < 60
    # The budget's timer: the whole budget (3 s here), since no lookup waited past it.
    timer = [line for line in text.splitlines() if line.startswith("gateway_cache_lookup_timer")]
    assert timer == ["gateway_cache_lookup_timer_seconds 3.0"]


def test_ttl_expiry_and_lru_eviction(
    gateway_factory: GatewayFactory, upstream: str, tmp_path: Path
) -> None:
    state = {"url": "memory", "path": str(tmp_path / "state.json")}
    gw = gateway_factory(
        cache_config(
            upstream, state, path=str(tmp_path / "c"), ttl_s=2, max_entries_per_namespace=2
        ),
        timeout_s=120,
    )
    stored(gw, "first question about cats")
    stored(gw, "second question about dogs")
    stored(gw, "third question about birds")
    assert ask(gw, "first question about cats").headers["x-cache"] == "miss"  # evicted (LRU)
    assert ask(gw, "third question about birds").headers["x-cache"] == "hit"
    time.sleep(2.2)
    assert ask(gw, "third question about birds").headers["x-cache"] == "miss"  # expired


def test_entries_survive_a_restart_with_the_embedded_store(
    gateway_factory: GatewayFactory, upstream: str, tmp_path: Path
) -> None:
    state = {"url": "memory", "path": str(tmp_path / "state.json")}
    config = cache_config(upstream, state, path=str(tmp_path / "c"))
    gw = gateway_factory(config, timeout_s=120)
    stored(gw, "What does HTTP 418 mean?")
    assert gw.stop() == 0
    again = gateway_factory(config, timeout_s=120)
    assert ask(again, "What does HTTP 418 mean?").headers["x-cache"] == "hit"


def test_second_replica_serves_the_first_ones_entry(
    gateway_factory: GatewayFactory, upstream: str, redis_url: str, redis_prefix: str
) -> None:
    config = cache_config(upstream, {"url": redis_url, "prefix": redis_prefix})
    first = gateway_factory(config, timeout_s=120)
    second = gateway_factory(config, timeout_s=120)
    ask(first, "Which port does HTTPS use by default?")
    stored_at = time.monotonic()
    while ask(second, "Which port does HTTPS use by default?").headers["x-cache"] != "hit":
        assert time.monotonic() - stored_at < 1.5, "second replica did not see the entry"
        time.sleep(0.05)
    third = gateway_factory(config, timeout_s=120)  # a replica started later rebuilds
    assert ask(third, "Which port does HTTPS use by default?").headers["x-cache"] == "hit"


def test_redis_stopped_mid_test_fails_open(
    gateway_factory: GatewayFactory, upstream: str, tmp_path: Path
) -> None:
    server = RedisServer(tmp_path)
    try:
        gw = gateway_factory(cache_config(upstream, {"url": server.url}), timeout_s=120)
        stored(gw, "What is a monad?")
        server.kill()
        started = time.monotonic()
        answer = ask(gw, "What is a monad?")
        assert answer.headers["x-cache"] == "miss" and time.monotonic() - started < 2
        assert content(answer) == "echo: What is a monad?"
        assert (
            "gateway_cache_fail_open_total" in httpx.get(gw.url + "/metrics", headers=OPERATOR).text
        )
    finally:
        server.kill()
