"""Flushing a tenant's cache entries: its own scope, or its cache group's; other tenants
keep theirs. End to end through the admin API (Redis store, real MiniLM), and both stores
(local and Redis) in process."""

from __future__ import annotations

import time
import uuid
from pathlib import Path
from typing import Any

import anyio
import httpx
import numpy as np
import pytest

from bench.processes import Gateway
from cache.entry import CacheEntry
from cache.semantic import flush_tenants
from cache.store import CacheStore
from cache.store_local import LocalCacheStore
from cache.store_redis import RedisCacheStore
from common.redis_client import RedisFactory
from tests.conftest import GatewayFactory, fake_backend, hash_of

DIM = 16
ADMIN_KEY = "sk-test-admin-flush-4d2e8a"
KEYS = {name: f"sk-test-flush-{name}-9c7b5a3e1" for name in ("a", "b", "g1", "g2")}


def config(upstream: str, state: dict[str, Any], cache_path: Path) -> dict[str, Any]:
    return {
        "state": state,
        # A generous lookup budget: the shared test machine can be slow.
        "cache": {"enabled": True, "lookup_budget_ms": 3000, "path": str(cache_path)},
        "backends": [fake_backend(upstream)],
        "tenants": [
            {"name": "a", "keys": [{"sha256": hash_of(KEYS["a"])}]},
            {"name": "b", "keys": [{"sha256": hash_of(KEYS["b"])}]},
            {"name": "g1", "cache_group": "team", "keys": [{"sha256": hash_of(KEYS["g1"])}]},
            {"name": "g2", "cache_group": "team", "keys": [{"sha256": hash_of(KEYS["g2"])}]},
        ],
        "admin": {"keys": [{"sha256": hash_of(ADMIN_KEY)}]},
    }


def cache_state(gateway: Gateway, tenant: str, prompt: str) -> str:
    body = {"model": "echo", "messages": [{"role": "user", "content": prompt}]}
    headers = {"Authorization": f"Bearer {KEYS[tenant]}"}
    response = httpx.post(gateway.base_url + "/chat/completions", json=body, headers=headers)
    assert response.status_code == 200, response.text
    return response.headers["x-cache"]


def stored(gateway: Gateway, tenant: str, prompt: str) -> None:
    """Asks until the answer is served from the cache (it is stored after the reply)."""
    deadline = time.monotonic() + 10
    while cache_state(gateway, tenant, prompt) != "hit":
        assert time.monotonic() < deadline, f"{prompt!r} never stored for {tenant}"
        time.sleep(0.05)


def flush(gateway: Gateway, tenant: str) -> dict[str, Any]:
    response = httpx.post(
        f"{gateway.url}/admin/tenants/{tenant}/cache/flush",
        headers={"Authorization": f"Bearer {ADMIN_KEY}"},
        timeout=30,
    )
    assert response.status_code == 200, response.text
    return dict(response.json())


def check_flushes(gateway: Gateway) -> None:
    prompt = "What is the boiling point of water at sea level?"
    for tenant in ("a", "b", "g1"):
        stored(gateway, tenant, prompt)
    assert cache_state(gateway, "g2", prompt) == "hit"  # g1's entry, shared by the group

    flushed = flush(gateway, "a")
    assert flushed["scope"] == "tenant:a" and flushed["tenants"] == ["a"]
    assert flushed["namespaces"] == 1 and flushed["removed"] == 1
    assert cache_state(gateway, "a", prompt) == "miss"
    assert cache_state(gateway, "b", prompt) == "hit"
    assert cache_state(gateway, "g1", prompt) == "hit"

    group = flush(gateway, "g2")  # g2 never stored anything: the group's entries go
    assert group["scope"] == "group:team" and group["tenants"] == ["g1", "g2"]
    assert group["removed"] == 1
    assert cache_state(gateway, "g1", prompt) == "miss"
    assert cache_state(gateway, "b", prompt) == "hit"


def test_flush_through_the_api_drops_the_tenants_entries_only(
    gateway_factory: GatewayFactory,
    fake_upstream: str,
    redis_url: str,
    redis_prefix: str,
    tmp_path: Path,
) -> None:
    state = {"url": redis_url, "prefix": redis_prefix}
    gateway = gateway_factory(config(fake_upstream, state, tmp_path / "cache"), timeout_s=120)
    check_flushes(gateway)


def entry(tenant: str, namespace: str) -> CacheEntry:
    vector = np.random.default_rng().standard_normal(DIM).astype(np.float32)
    return CacheEntry(
        entry_id=uuid.uuid4().hex,
        namespace=namespace,
        prompt=f"prompt of {tenant} in {namespace}",
        exact_key=f"x:{uuid.uuid4().hex}",
        normalized_key=f"n:{uuid.uuid4().hex}",
        vector=vector / np.linalg.norm(vector),
        features=b"",
        response=b"{}",
        model="echo",
        tenant=tenant,
        created_at=time.time(),
        ttl_s=600.0,
    )


@pytest.mark.parametrize("kind", ["local", "redis"])
async def test_both_stores_flush_the_namespaces_a_tenant_stored_in(
    kind: str, redis_url: str, redis_prefix: str
) -> None:
    store: CacheStore = (
        LocalCacheStore(None, DIM)
        if kind == "local"
        else RedisCacheStore(RedisFactory(redis_url), redis_prefix, DIM)
    )
    placed = [
        ("a", "ns-a1"),
        ("a", "ns-a1"),
        ("a", "ns-a2"),
        ("b", "ns-b"),
        ("g1", "ns-g"),
        ("g2", "ns-g"),
    ]
    entries = [entry(tenant, namespace) for tenant, namespace in placed]
    async with anyio.create_task_group() as tasks:
        await store.start(tasks)
        for item in entries:
            await store.put(item)
        assert await flush_tenants(store, ["a"]) == (2, 3)
        assert await flush_tenants(store, ["a"]) == (0, 0)
        assert await store.get_by_key("ns-b", entries[3].exact_key) is not None
        assert await flush_tenants(store, ["g1", "g2"]) == (1, 2)
        assert await store.namespaces_of(["a", "b", "g1", "g2"]) == {"ns-b"}
        await store.close()
        tasks.cancel_scope.cancel()
