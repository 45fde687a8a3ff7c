"""The cache report from a real run: the gateway as a process with the real cache (MiniLM,
FAISS), the fake upstream, the official `openai` client, and the events read back from the
same store the gateway wrote (a Redis stream, or JSON lines next to the state file).

The traffic is a known mix, and every expected count is worked out from what the gateway
told the client (the `x-cache*` headers), so the report has to agree with the requests.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from bench.processes import OPERATOR, Gateway, start_gateway
from common.redis_client import RedisFactory
from gateway.admin.reports import ReportQuery, build_report
from gateway.config_file import load_settings
from gateway.settings import Settings
from tests.conftest import fake_backend, hash_of

KEY_A, KEY_B = "sk-test-report-a-0123456789", "sk-test-report-b-0123456789"
SYSTEM = "Be brief."
PRICE = {"input_per_1m_tokens": 3.0, "output_per_1m_tokens": 15.0}
FIRST = ["What is the capital of Australia?", "How do I reverse a list in Python?"]
NEAR = ("Convert 10 km to miles", "Convert 12 km to miles")  # similar, different meaning
PARAPHRASE = "How can I reverse a list in Python?"
STORES = ("redis", "memory")  # a Redis stream; JSON lines next to the state file


@dataclass
class Sent:
    """What the client saw, tallied the way the report should tally it."""

    tiers: list[str] = field(default_factory=list)  # one per request of tenant a
    saved_tokens: int = 0
    saved_cost: float = 0.0
    usage: dict[str, tuple[int, int]] = field(default_factory=dict)  # prompt -> miss usage


def store_config(store: str, redis_url: str, upstream: str, work: Path) -> dict[str, Any]:
    state: dict[str, Any] = {"url": "memory", "path": str(work / "state.json")}
    if store == "redis":
        state = {"url": redis_url, "prefix": f"test-report-{int(time.time() * 1000)}"}
    return {
        "state": state,
        "cache": {"enabled": True, "lookup_budget_ms": 3000, "path": str(work / "cache")},
        "backends": [fake_backend(upstream)],
        "tenants": [
            {"name": "a", "keys": [{"sha256": hash_of(KEY_A)}]},
            {"name": "b", "keys": [{"sha256": hash_of(KEY_B)}]},
        ],
        "pricing": {"echo": PRICE},
    }


@pytest.fixture(scope="module")
def gateways(
    redis_url: str, fake_upstream: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, Gateway]]:
    """Both gateways start at once: loading the embedding model is most of the wait."""

    def start(store: str) -> Gateway:
        work = tmp_path_factory.mktemp(f"report-{store}")
        return start_gateway(store_config(store, redis_url, fake_upstream, work), work, None, 180)

    with ThreadPoolExecutor(2) as pool:
        started = dict(zip(STORES, pool.map(start, STORES), strict=True))
    yield started
    for gw in started.values():
        gw.stop()


@pytest.fixture(params=STORES)
def gateway(request: pytest.FixtureRequest, gateways: dict[str, Gateway]) -> Gateway:
    return gateways[request.param]


def cache_entries(gw: Gateway) -> float:
    text = httpx.get(gw.url + "/metrics", headers=OPERATOR).text
    found = re.search(r"^gateway_cache_entries ([0-9.e+-]+)$", text, re.M)
    return float(found.group(1)) if found else 0.0


def wait_for_entries(gw: Gateway, count: int) -> None:
    """Answers are stored after the client has them: poll the gauge (not the cache)."""
    deadline = time.monotonic() + 15
    while cache_entries(gw) < count:
        assert time.monotonic() < deadline, "the answers were not stored"
        time.sleep(0.05)


def send(client: openai.OpenAI, sent: Sent, prompt: str, **extra: Any) -> None:
    raw = client.chat.completions.with_raw_response.create(
        model="echo",
        messages=[{"role": "system", "content": SYSTEM}, {"role": "user", "content": prompt}],
        **extra,
    )
    answer = raw.parse()
    cache = raw.headers.get("x-cache")
    tier = raw.headers.get("x-cache-tier", "") if cache == "hit" else str(cache)
    if extra.get("temperature", 0) > 1.0:
        assert cache == "bypass"
        tier = "none"  # not cacheable, rather than a client's choice
    sent.tiers.append(tier)
    if cache == "hit":
        saved = int(raw.headers["x-cache-saved-tokens"])
        source = answer.choices[0].message.content or ""
        prompt_tokens, completion_tokens = sent.usage[source.removeprefix("echo: ")]
        assert saved == prompt_tokens + completion_tokens
        sent.saved_tokens += saved
        sent.saved_cost += (prompt_tokens * 3.0 + completion_tokens * 15.0) / 1e6
    elif answer.usage is not None:
        sent.usage[prompt] = (answer.usage.prompt_tokens, answer.usage.completion_tokens)


def known_mix(gw: Gateway) -> Sent:
    sent = Sent()
    with openai.OpenAI(base_url=gw.base_url, api_key=KEY_A, max_retries=0) as client:
        for prompt in [*FIRST, NEAR[0]]:
            send(client, sent, prompt)
        wait_for_entries(gw, 3)
        send(client, sent, FIRST[0])  # exact hits
        send(client, sent, FIRST[0])
        send(client, sent, PARAPHRASE)  # a semantic hit (or, if the verifier says no, a miss)
        send(client, sent, NEAR[1])  # a near miss: similar words, another question
        no_store = client.with_options(default_headers={"cache-control": "no-store"})
        send(no_store, sent, FIRST[0])
        send(client, sent, FIRST[1], temperature=1.5)
    with openai.OpenAI(base_url=gw.base_url, api_key=KEY_B, max_retries=0) as other:
        other.chat.completions.create(
            model="echo", messages=[{"role": "user", "content": "Tenant b asks once"}]
        )
    return sent


def report_until(settings: Settings, query: ReportQuery, requests: int) -> dict[str, Any]:
    """Events are written in batches every half second: poll until all are there."""
    deadline = time.monotonic() + 15
    while True:
        report = asyncio.run(
            build_report("cache", settings, RedisFactory(settings.state.url), query)
        )
        if report["totals"]["requests"] >= requests or time.monotonic() > deadline:
            return report
        time.sleep(0.1)


def test_cache_report_counts_match_the_requests(gateway: Gateway, tmp_path: Path) -> None:
    sent = known_mix(gateway)
    settings = load_settings(gateway.config_path, {})
    assert sent.tiers[:5] == ["miss", "miss", "miss", "exact", "exact"]
    assert sent.tiers[6:] == ["miss", "bypass", "none"]
    semantic = sent.tiers.count("semantic")
    misses = sent.tiers.count("miss")

    everyone = report_until(settings, ReportQuery.parse("10m"), len(sent.tiers) + 1)
    assert everyone["totals"]["requests"] == len(sent.tiers) + 1  # tenant b's one miss

    query = ReportQuery.parse("10m", tenant="a", model="echo", bucket="1m")
    report = asyncio.run(build_report("cache", settings, RedisFactory(settings.state.url), query))
    totals = report["totals"]
    assert totals["requests"] == 9
    assert (totals["hits"], totals["exact_hits"], totals["semantic_hits"]) == (
        2 + semantic,
        2,
        semantic,
    )
    assert (totals["misses"], totals["bypassed"], totals["not_cacheable"]) == (misses, 1, 1)
    assert totals["hit_rate"] == round((2 + semantic) / (2 + semantic + misses), 4)
    assert totals["saved_tokens"] == sent.saved_tokens > 0
    assert totals["saved_cost_usd"] == pytest.approx(sent.saved_cost, abs=1e-6)
    assert report["latency_ms"]["hit"]["count"] == 2 + semantic
    assert report["latency_ms"]["miss"]["count"] == misses
    assert sum(report["latency_histogram"]["miss"]) == misses
    assert sum(b["requests"] for b in report["over_time"]) == 9
    assert sum(report["similarity"]["hits"]) == semantic
    assert sum(report["similarity"]["near_misses"]) >= 1  # NEAR[1] saw NEAR[0]
    [namespace] = report["top_namespaces"]  # bypassed/uncacheable requests have none
    assert (namespace["tenant"], namespace["requests"], namespace["hits"]) == ("a", 7, 2 + semantic)
    assert report["by_tenant_model"] == [
        {
            "tenant": "a",
            "model": "echo",
            "requests": 9,
            "hits": 2 + semantic,
            "hit_rate": totals["hit_rate"],
            "saved_tokens": sent.saved_tokens,
            "saved_cost_usd": totals["saved_cost_usd"],
            "reported_bad_hits": 0,
            "priced": True,
        }
    ]

    # The command line reads the same store and prints the same numbers.
    printed = gateway.cli("report", "cache", "--since", "10m", "--tenant", "a", "--format", "json")
    assert printed.returncode == 0, printed.stderr
    assert json.loads(printed.stdout)["totals"] == totals
    table = gateway.cli("report", "cache", "--since", "10m")
    assert table.returncode == 0, table.stderr
    assert "Cache report" in table.stdout and "Top namespaces" in table.stdout
    out = tmp_path / "both.json"
    both = gateway.cli("report", "all", "--format", "json", "--output", str(out))
    assert both.returncode == 0, both.stderr
    assert set(json.loads(out.read_text())) == {"cache", "cold_start"}
    assert "Australia" not in out.read_text()  # no prompt text in any report
