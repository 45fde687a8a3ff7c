"""Index searches of one event-loop turn in one FAISS call per namespace.

When the embedder's batched pass ends, every lookup in it resumes in the same turn of the
event loop and searches the index for its vector. One at a time, a 10k flat namespace
cost about 1.2 ms of the loop per lookup here, so the 32 lookups of a pass held every
other request for ~40 ms. Here a search is queued, and the first of a turn schedules one
run (`call_soon`: after every callback ready in this turn) that searches each namespace
once with all its queued vectors (`VectorIndex.search_many_now`), each row filtered by
its own `accept`. A search the index cannot answer at once (an add or a rebuild's copy
holds it, or a flat scan would be long) goes to a worker thread alone, as before.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass

import anyio.to_thread
import numpy as np

from cache.entry import Vector
from cache.index import Hit
from cache.vector_index import VectorIndex


@dataclass(eq=False)
class _Search:
    namespace: str
    vector: Vector
    k: int
    floor: float
    accept: Callable[[str], bool]
    future: asyncio.Future[list[Hit] | None]  # None: search in a thread instead


class SearchBatcher:
    """`VectorIndex.search` for callers on the event loop, shared within a loop turn."""

    def __init__(self, index: Callable[[], VectorIndex]) -> None:
        self._index = index  # the store's index now (a store may swap in a rebuilt one)
        self._asks: list[_Search] = []
        self.runs = 0  # FAISS calls made for queued searches, so tests can see batching

    async def search(
        self, namespace: str, vector: Vector, k: int, floor: float, accept: Callable[[str], bool]
    ) -> list[Hit]:
        loop = asyncio.get_running_loop()
        if not self._asks:
            loop.call_soon(self._run)
        ask = _Search(namespace, vector, k, floor, accept, loop.create_future())
        self._asks.append(ask)
        hits = await ask.future
        if hits is not None:
            return hits
        return await anyio.to_thread.run_sync(
            self._index().search, namespace, vector, k, floor, accept
        )

    def _run(self) -> None:
        asks, self._asks = self._asks, []
        index = self._index()
        groups: dict[tuple[str, int, float], list[_Search]] = {}
        for ask in asks:
            if not ask.future.done():  # a cancelled lookup searches nothing
                groups.setdefault((ask.namespace, ask.k, ask.floor), []).append(ask)
        for (namespace, k, floor), group in groups.items():
            try:
                vectors = np.stack([ask.vector for ask in group])
                found = index.search_many_now(
                    namespace, vectors, k, floor, [ask.accept for ask in group]
                )
            except Exception:  # a bad vector: each searches alone and only it fails
                found = None
            self.runs += found is not None
            results: list[list[Hit] | None] = [None] * len(group) if found is None else [*found]
            for ask, hits in zip(group, results, strict=True):
                ask.future.set_result(hits)
