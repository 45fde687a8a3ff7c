"""Property: a cached answer never crosses a tenant or namespace boundary.

Hypothesis draws sequences of requests (tenant, model, system prompt, sampling parameter,
prompt) from small pools, so that exact repeats, normalised variants and paraphrases of one
prompt keep arriving from other tenants and other namespaces. They go to one real gateway
(real MiniLM, real FAISS, the embedded store) in front of the echo upstream, whose answer
names the prompt it answered. Every hit therefore says which prompt it was stored for, and
the test checks that the prompt was answered by the upstream, earlier, for the same scope
(the tenant, or the cache group it shares), model, system prompt and parameters.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from bench.processes import Gateway, start_fake_upstream, start_gateway
from tests.conftest import fake_backend, hash_of

# Tenants c and d share a cache group: entries may cross between them, and only them.
TENANTS = {"a": None, "b": None, "c": "team", "d": "team"}
MODELS = ["echo", "echo-other"]
SYSTEMS = ["Be brief.", "Answer in French."]
MAX_TOKENS = [None, 64]
PROMPTS = [
    "What is the capital of France?",
    "what is the capital of france",
    "Which city is the capital of France?",
    "What is the capital of Spain?",
    "How do I reverse a list in Python?",
    "How can I reverse a Python list?",
    "Convert 10 km to miles",
]


def key_of(tenant: str) -> str:
    return f"sk-test-isolation-{tenant}-0123456789"


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    work = tmp_path_factory.mktemp("isolation")
    upstream, base_url = start_fake_upstream(work)
    tenants: list[dict[str, Any]] = [
        {"name": name, "keys": [{"sha256": hash_of(key_of(name))}], "cache_group": group}
        for name, group in TENANTS.items()
    ]
    config = {
        "state": {"url": "memory", "path": str(work / "state.json")},
        # Generous budget: the property is about what is answered, not how fast.
        "cache": {"enabled": True, "lookup_budget_ms": 5000, "path": str(work / "cache")},
        "backends": [fake_backend(base_url, models=MODELS)],
        "tenants": tenants,
    }
    gw = start_gateway(config, work, timeout_s=120)
    yield gw
    gw.stop()
    upstream.stop()


Request = tuple[str, str, str, int | None, str]
requests = st.tuples(
    st.sampled_from(sorted(TENANTS)),
    st.sampled_from(MODELS),
    st.sampled_from(SYSTEMS),
    st.sampled_from(MAX_TOKENS),
    st.sampled_from(PROMPTS),
)
# What the upstream answered, by prompt: the namespaces (scope, model, system, max_tokens)
# it was answered in. Kept across examples: entries outlive an example in the gateway too.
answered: defaultdict[str, set[tuple[str, str, str, int | None]]] = defaultdict(set)
# Hits seen, by tier and by whether they crossed tenants inside a cache group.
hits: defaultdict[str, int] = defaultdict(int)


def send(client: httpx.Client, request: Request) -> httpx.Response:
    tenant, model, system, max_tokens, prompt = request
    body: dict[str, Any] = {
        "model": model,
        "messages": [{"role": "system", "content": system}, {"role": "user", "content": prompt}],
    }
    if max_tokens is not None:
        body["max_tokens"] = max_tokens
    # Forged routing hints must change nothing.
    headers = {
        "authorization": f"Bearer {key_of(tenant)}",
        "x-tenant": "a",
        "x-cache-namespace": "a",
    }
    return client.post("/chat/completions", json=body, headers=headers)


@settings(
    max_examples=20,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(st.lists(requests, min_size=2, max_size=8))
# Always run once with a variant asked in the same namespace (and the cache group) after
# the original is stored, so that the tiers above exact are exercised whatever is drawn.
@example(
    [("a", "echo", "Be brief.", None, PROMPTS[0])] * 3
    + [("a", "echo", "Be brief.", None, PROMPTS[1])] * 2
)
@example(
    [("c", "echo", "Be brief.", None, PROMPTS[0])] * 3
    + [("d", "echo", "Be brief.", None, PROMPTS[1])] * 2
)
def test_a_cached_answer_never_crosses_a_namespace(
    gateway: Gateway, sequence: list[Request]
) -> None:
    with httpx.Client(base_url=gateway.base_url, timeout=30) as client:
        for request in sequence:
            tenant, model, system, max_tokens, prompt = request
            namespace = (TENANTS[tenant] or tenant, model, system, max_tokens)
            response = send(client, request)
            assert response.status_code == 200, response.text
            content = response.json()["choices"][0]["message"]["content"]
            assert content.startswith("echo: ")
            origin = content.removeprefix("echo: ")
            if response.headers["x-cache"] == "hit":
                assert namespace in answered[origin], (request, origin, answered[origin])
                hits[response.headers["x-cache-tier"]] += 1
            else:
                assert origin == prompt
                answered[prompt].add(namespace)


def test_the_property_was_exercised_by_hits_of_every_tier() -> None:
    # Runs after the property (file order): a property that never saw a hit proves nothing.
    assert hits["exact"] > 0 and hits["normalized"] + hits["semantic"] > 0, dict(hits)
