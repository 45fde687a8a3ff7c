"""SemanticCache deleting one entry: within the asking scope only, whether the entry is
stored or still being stored, and a bad-hit report fed to the `on_bad_hit` hook. The local
store; answers come with their embedding, so no model is needed."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
import numpy as np
import orjson

from cache.decision import DecisionSettings
from cache.embedder import Embedded
from cache.policy import CacheInputs, CacheKey, cache_key
from cache.semantic import Answer, BadHit, NullCache, SemanticCache
from cache.store_local import LocalCacheStore

DIM = 8
ANSWER = orjson.dumps(
    {"choices": [{"index": 0, "message": {"content": "Paris."}, "finish_reason": "stop"}]}
)


def key(prompt: str) -> CacheKey:
    body = {"model": "m", "messages": [{"role": "user", "content": prompt}]}
    made = cache_key("tenant:a", "m", CacheInputs.of("chat", body))
    assert made is not None
    return made


def answer(prompt: str) -> Answer:
    vector = np.ones(DIM, dtype=np.float32) / np.sqrt(DIM)
    return Answer(key(prompt), "a", "m", ANSWER, Embedded(vector, b""))


@asynccontextmanager
async def cache_with(reports: list[BadHit]) -> AsyncIterator[tuple[SemanticCache, Any]]:
    store = LocalCacheStore(None, DIM)
    async with anyio.create_task_group() as tasks:
        await store.start(tasks)
        embedder: Any = None  # every answer comes embedded; exact lookups embed nothing
        yield (
            SemanticCache(
                store,
                embedder,
                None,
                DecisionSettings(),
                tasks,
                budget_s=5.0,
                ttl_s=600.0,
                on_bad_hit=reports.append,
            ),
            store,
        )
        await store.close()
        tasks.cancel_scope.cancel()


async def stored_id(cache: SemanticCache, store: Any, prompt: str) -> str:
    cache.store_later(answer(prompt))
    found = (await cache.lookup(key(prompt))).found
    assert found is not None
    with anyio.fail_after(5):
        while await store.entry(found.entry.entry_id) is None:
            await anyio.sleep(0.01)
    return found.entry.entry_id


async def test_a_reported_entry_is_deleted_only_within_its_scope() -> None:
    reports: list[BadHit] = []
    async with cache_with(reports) as (cache, store):
        entry_id = await stored_id(cache, store, "Capital of France?")
        assert await cache.report_bad_hit(entry_id, "b", ["b"]) is None  # another scope
        assert await store.entry(entry_id) is not None and reports == []
        entry = await cache.report_bad_hit(entry_id, "g2", ["a", "g2"])
        assert entry is not None and entry.entry_id == entry_id
        assert (await cache.lookup(key("Capital of France?"))).found is None
        [report] = reports
        assert (report.entry_id, report.tenant, report.stored_for) == (entry_id, "g2", "a")
        assert (report.namespace, report.model) == (entry.namespace, "m")
        assert not report.labelled  # served by no error bound: no score to label it at
        assert await cache.delete(entry_id) is None  # gone


async def test_an_entry_deleted_while_being_stored_is_never_served() -> None:
    async with cache_with([]) as (cache, store):
        cache.store_later(answer("Capital of Spain?"))
        pending = (await cache.lookup(key("Capital of Spain?"))).found  # from memory
        assert pending is not None
        deleted = await cache.delete(pending.entry.entry_id, ["a"])
        assert deleted is not None and deleted.entry_id == pending.entry.entry_id
        assert (await cache.lookup(key("Capital of Spain?"))).found is None
        await anyio.sleep(0.2)  # the background store finishes, then deletes it
        assert await store.entry(pending.entry.entry_id) is None
        assert (await cache.lookup(key("Capital of Spain?"))).found is None


async def test_the_disabled_cache_has_nothing_to_delete() -> None:
    assert await NullCache().delete("0" * 32) is None
    assert await NullCache().report_bad_hit("0" * 32, "a", ["a"]) is None
