"""The Responses API's stored responses, in process and in a real Redis: kept by owner,
a tenant's newest within `per_tenant` and `max_bytes` only, gone after their TTL
(gateway/dialects/stored.py)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable

import pytest
import redis.asyncio as aioredis

from common.redis_client import RedisFactory
from gateway.dialects.stored import MemoryResponses, RedisResponses, ResponseStore, Stored

# A store with its TTL, and its bounds per tenant: responses, bytes.
Make = Callable[[float, int, int], ResponseStore]


def _stored(response_id: str, text: str = "") -> Stored:
    history = [{"role": "user", "content": response_id + text}]
    return Stored({"id": response_id, "object": "response"}, history, [])


@pytest.fixture(params=["memory", "redis"])
async def make(
    request: pytest.FixtureRequest, redis_url: str, redis_prefix: str
) -> AsyncIterator[Make]:
    made: list[RedisResponses] = []

    def build(ttl_s: float, per_tenant: int, max_bytes: int) -> ResponseStore:
        if request.param == "memory":
            return MemoryResponses(ttl_s, per_tenant, max_bytes)
        factory = RedisFactory(redis_url)
        store = RedisResponses(factory, redis_prefix, ttl_s, per_tenant, max_bytes)
        made.append(store)
        return store

    yield build
    for store in made:
        await store.close()


async def test_a_tenant_keeps_its_newest_and_never_anothers(make: Make) -> None:
    store: ResponseStore = make(60.0, 3, 1 << 20)
    for i in range(5):
        await store.put("alpha", _stored(f"resp_{i}"))
    await store.put("beta", _stored("resp_b"))
    kept = [i for i in range(5) if await store.get("alpha", f"resp_{i}") is not None]
    assert kept == [2, 3, 4]
    found = await store.get("alpha", "resp_4")
    assert found is not None and found.history == [{"role": "user", "content": "resp_4"}]
    assert await store.get("beta", "resp_4") is None  # another owner's id: not found
    assert await store.get("beta", "resp_b") is not None
    assert await store.delete("alpha", "resp_4") is True
    assert await store.delete("alpha", "resp_4") is False
    assert await store.get("alpha", "resp_4") is None


async def test_a_response_is_gone_after_its_ttl(make: Make) -> None:
    store: ResponseStore = make(0.3, 10, 1 << 20)
    await store.put("alpha", _stored("resp_old"))
    assert await store.get("alpha", "resp_old") is not None
    await asyncio.sleep(0.5)
    assert await store.get("alpha", "resp_old") is None


async def test_a_tenant_keeps_at_most_its_bytes_and_a_response_too_large_is_refused(
    make: Make,
) -> None:
    store: ResponseStore = make(60.0, 100, 3000)
    for i in range(5):
        assert await store.put("alpha", _stored(f"resp_{i}", "x" * 900))  # ~1 kB each
    kept = [i for i in range(5) if await store.get("alpha", f"resp_{i}") is not None]
    assert kept == [3, 4]  # 2 fit in 3,000 bytes with the third's room
    assert await store.delete("alpha", "resp_4")
    assert await store.put("alpha", _stored("resp_5", "x" * 900))
    assert await store.get("alpha", "resp_3") is not None  # deleting gave its bytes back
    assert await store.put("alpha", _stored("resp_6", "x" * 900))
    assert await store.get("alpha", "resp_3") is None
    assert not await store.put("alpha", _stored("resp_big", "x" * 5000))
    assert await store.get("alpha", "resp_big") is None
    assert await store.get("alpha", "resp_6") is not None  # nothing pushed out for it


async def test_redis_holds_no_more_keys_than_the_bound(redis_url: str, redis_prefix: str) -> None:
    store = RedisResponses(RedisFactory(redis_url), redis_prefix, 60.0, 2, 1 << 20)
    try:
        for i in range(6):
            await store.put("alpha", _stored(f"resp_{i}"))
        client = aioredis.Redis.from_url(redis_url)
        keys = [k async for k in client.scan_iter(match=f"{{{redis_prefix}:responses:*")]
        await client.aclose()
        assert len(keys) == 4  # the index, the sizes and two responses
    finally:
        await store.close()
