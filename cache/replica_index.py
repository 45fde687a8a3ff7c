"""This replica's index of the Redis cache store's entries, with each entry's expiry.

The entries live in Redis (cache/store_redis.py); each replica searches a `VectorIndex` of
its own, fed by `Change`s: its own writes at once, every replica's as they arrive on the
stream, and a whole new index when the store rebuilds from a scan (`replace`). Replays are
harmless because index adds of a present id and removes of an absent one do nothing.
Entries expire here on this replica's clock (`expire`); a search asks `live`.

Changes, and the expiry bookkeeping, happen in worker threads under one lock, in the order
they were made; searches only read the expiries.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import dataclass

import anyio
import anyio.to_thread
import numpy as np

from cache.entry import Vector
from cache.index import IndexConfig
from cache.vector_index import VectorIndex

_GONE = (0.0, "")


@dataclass(frozen=True)
class Change:
    """One index change, made here or read from the stream."""

    op: str  # put, del or flush
    namespace: str
    ids: list[str]
    vectors: Vector | None = None  # put: one row per id
    expires_at: float = 0.0  # put


class ReplicaIndex:
    """A `VectorIndex` of the shared entries, and when each expires."""

    def __init__(self, dim: int, index_config: IndexConfig | None = None) -> None:
        self._index = VectorIndex(dim, index_config)
        self._lock = anyio.Lock()
        self._expires_at: dict[str, tuple[float, str]] = {}  # id -> (expiry, namespace)
        self._expiry: list[tuple[float, str]] = []  # heap of (expiry, id), may hold stale

    @property
    def index(self) -> VectorIndex:
        """The index now (`replace` swaps in a rebuilt one)."""
        return self._index

    def live(self, entry_id: str, now: float) -> bool:
        return self._expires_at.get(entry_id, _GONE)[0] > now

    async def apply(self, changes: Sequence[Change]) -> None:
        async with self._lock:
            await anyio.to_thread.run_sync(self._apply_sync, changes)

    async def expire(self, now: float) -> None:
        async with self._lock:
            await anyio.to_thread.run_sync(self._expire_local, now)

    async def replace(self, rows: list[tuple[str, str, bytes, float]]) -> None:
        """Swap in an index of scanned rows: (namespace, id, vector, expiry) of each entry."""
        fresh = await anyio.to_thread.run_sync(_index_of, rows, self._index.empty_like())
        async with self._lock:
            self._index = fresh
            self._expires_at = {i: (e, ns) for ns, i, _, e in rows}
            self._expiry = [(e, i) for _, i, _, e in rows]
            heapq.heapify(self._expiry)

    def _apply_sync(self, changes: Sequence[Change]) -> None:
        for change in changes:
            if change.op == "put" and change.vectors is not None:
                if self._index.add(change.namespace, change.ids, change.vectors):
                    self._remember(change.ids[0], change.expires_at, change.namespace)
            elif change.op == "del":
                self._index.remove(change.namespace, change.ids)
                for entry_id in change.ids:
                    self._expires_at.pop(entry_id, None)
            elif change.op == "flush":
                for entry_id in self._index.drop(change.namespace):
                    self._expires_at.pop(entry_id, None)

    def _remember(self, entry_id: str, expires_at: float, namespace: str) -> None:
        self._expires_at[entry_id] = (expires_at, namespace)
        heapq.heappush(self._expiry, (expires_at, entry_id))

    def _expire_local(self, now: float) -> None:
        """Drop expired entries from this replica's index, on this replica's clock."""
        doomed: dict[str, list[str]] = {}
        while self._expiry and self._expiry[0][0] <= now:
            expires_at, entry_id = heapq.heappop(self._expiry)
            known = self._expires_at.get(entry_id)
            if known is not None and known[0] == expires_at:
                del self._expires_at[entry_id]
                doomed.setdefault(known[1], []).append(entry_id)
        for namespace, ids in doomed.items():
            self._index.remove(namespace, ids)
        if len(self._expiry) > 2 * len(self._expires_at) + 1024:  # drop stale heap items
            self._expiry = [(e, i) for i, (e, _) in self._expires_at.items()]
            heapq.heapify(self._expiry)


def _index_of(rows: list[tuple[str, str, bytes, float]], index: VectorIndex) -> VectorIndex:
    """Fill an empty index with scanned rows (big namespaces start flat; the sweeper's
    maintain() converts them, so a rebuild after an outage is quick)."""
    by_namespace: dict[str, list[tuple[str, bytes]]] = {}
    for namespace, entry_id, vector, _ in rows:
        by_namespace.setdefault(namespace, []).append((entry_id, vector))
    for namespace, items in by_namespace.items():
        vectors = np.frombuffer(b"".join(v for _, v in items), np.float32).reshape(-1, index.dim)
        index.add(namespace, [i for i, _ in items], vectors)
    return index
