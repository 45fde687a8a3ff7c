"""Searches of one event-loop turn share one FAISS call, with what each finds alone; a busy
index sends them to threads; a cancelled search is dropped. Real FAISS."""

from __future__ import annotations

import asyncio

import numpy as np

from cache.search_batch import SearchBatcher
from cache.vector_index import VectorIndex

DIM = 384


def index_of(n: int) -> tuple[VectorIndex, np.ndarray]:
    rng = np.random.default_rng(5)
    vectors = rng.standard_normal((n, DIM)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    index = VectorIndex(DIM)
    index.add("a", [f"a{i}" for i in range(n)], vectors)
    index.add("b", [f"b{i}" for i in range(n)], vectors)
    return index, vectors


def everything(entry_id: str) -> bool:
    return True


async def test_searches_of_one_turn_share_one_call_per_namespace() -> None:
    index, vectors = index_of(500)
    batcher = SearchBatcher(lambda: index)
    asked = [("a", 0), ("a", 1), ("b", 2), ("a", 3)]
    cancelled = asyncio.ensure_future(batcher.search("a", vectors[9], 3, 0.0, everything))
    await asyncio.sleep(0)
    cancelled.cancel()
    found = await asyncio.gather(
        *(batcher.search(ns, vectors[row], 3, 0.0, everything) for ns, row in asked)
    )
    assert found == [index.search(ns, vectors[row], 3, 0.0) for ns, row in asked]
    assert [hits[0][0] for hits in found] == ["a0", "a1", "b2", "a3"]
    assert batcher.runs == 2  # namespace a once (three searches), b once


async def test_a_busy_index_sends_the_searches_to_threads() -> None:
    index, vectors = index_of(200)
    batcher = SearchBatcher(lambda: index)
    namespace = index.get("a")
    assert namespace is not None
    namespace._lock.acquire()  # an add or a rebuild's copy holds the index
    searches = asyncio.gather(
        *(batcher.search("a", vectors[r], 1, 0.0, everything) for r in (4, 5))
    )
    await asyncio.sleep(0.05)
    assert not searches.done()  # waiting in threads for the index, not on the event loop
    namespace._lock.release()
    assert [hits[0][0] for hits in await searches] == ["a4", "a5"]
    assert batcher.runs == 0
