"""The embedded cache store: entries in this process's memory, snapshotted to a local file.

`LocalCacheStore` keeps cache/store.py's `CacheStore` contract within one gateway process
(the snapshot's format is cache/codec.py's); cache/store_redis.py's `RedisCacheStore`
shares the entries between replicas instead.
"""

from __future__ import annotations

import heapq
import logging
import time
from collections import OrderedDict
from collections.abc import Callable, Collection
from dataclasses import dataclass
from pathlib import Path

import anyio
import anyio.to_thread
from anyio.abc import TaskGroup

from cache.codec import (
    CorruptSnapshot,
    Evidence,
    StoredEntry,
    read_evidence,
    read_snapshot,
    write_evidence,
    write_snapshot,
)
from cache.entry import CacheEntry, Vector
from cache.index import IndexConfig
from cache.search_batch import SearchBatcher
from cache.store import BackgroundLoops, check_entry
from cache.vector_index import VectorIndex

logger = logging.getLogger(__name__)
_SNAPSHOT_SHARE = 0.05  # of the time the local store may spend writing its snapshot


@dataclass
class _Slot:
    entry: CacheEntry
    last_hit: float = 0.0
    hits: int = 0

    @property
    def expires_at(self) -> float:
        return self.entry.created_at + self.entry.ttl_s

    @property
    def last_used(self) -> float:
        return max(self.entry.created_at, self.last_hit)


class LocalCacheStore:
    """Entries in memory, snapshotted to `path` (None: memory only).

    Persistence is a periodic snapshot, not a log: the sweeper rewrites the whole file
    (atomically, one entry at a time, in a worker thread: see cache/codec.py) at most
    every `snapshot_interval_s` when entries changed, and close() writes a last one. A
    large file is written less often, so that writing takes at most 5% of the time (every
    40 s for a 2 s write). A crash loses at most that interval of inserts, which for a
    cache only costs misses. The evidence of the error-bounded mode goes to a small file
    of its own beside it (`<path>.evidence`), on the same schedule. Hits alone (their
    count and time, i.e. the LRU order) are written at most every
    `hit_snapshot_interval_s`: under steady hits the store would otherwise rewrite the
    whole file (115 MB for 10k 12-token entries) every few seconds, beside the requests.
    A crash then loses some LRU order, which only changes what is evicted first. A
    corrupt file is logged and ignored.
    """

    def __init__(
        self,
        path: Path | None,
        dim: int,
        max_entries_per_namespace: int = 10_000,
        *,
        index_config: IndexConfig | None = None,
        sweep_interval_s: float = 1.0,
        snapshot_interval_s: float = 5.0,
        hit_snapshot_interval_s: float = 300.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if max_entries_per_namespace < 1:
            raise ValueError("max_entries_per_namespace must be at least 1")
        self._path = path
        self._dim = dim
        self._max = max_entries_per_namespace
        self._sweep_interval_s = sweep_interval_s
        self._snapshot_interval_s = snapshot_interval_s
        self._hit_snapshot_interval_s = hit_snapshot_interval_s
        self._clock = clock
        self._index = VectorIndex(dim, index_config)
        self._searches = SearchBatcher(lambda: self._index)  # one FAISS call per loop turn
        self._slots: dict[str, _Slot] = {}
        self._lru: dict[str, OrderedDict[str, None]] = {}  # per namespace, least recent first
        self._keys: dict[tuple[str, str], str] = {}  # (namespace, exact or normalized key) -> id
        self._expiry: list[tuple[float, str]] = []  # heap of (expires_at, entry_id)
        self._evidence: Evidence = {}  # namespace -> (evidence bytes, expires_at)
        # Index changes run in threads; this keeps them in the order of the map changes.
        self._index_lock = anyio.Lock()
        self._loops = BackgroundLoops()
        self._evictions = self._expired = 0
        self._dirty = False  # entries changed since the last snapshot
        self._hits_dirty = False  # only hit counts and times changed
        self._evidence_dirty = False
        self._snapshot_at = time.monotonic()
        self._write_s = 0.0  # how long the last snapshot took to write

    async def start(self, task_group: TaskGroup) -> None:
        if self._path is not None:
            await self._load(self._path)
        await self._loops.start(task_group, self._sweep_forever)

    async def close(self) -> None:
        await self._loops.stop()
        if self._dirty or self._hits_dirty or self._evidence_dirty:
            await self._snapshot()

    async def get_by_key(self, namespace: str, key: str) -> CacheEntry | None:
        slot = self._slots.get(self._keys.get((namespace, key), ""))
        if slot is None or slot.entry.namespace != namespace:
            return None
        return None if slot.entry.expired(self._clock()) else slot.entry

    async def nearest(
        self, namespace: str, vector: Vector, k: int, floor: float
    ) -> list[tuple[CacheEntry, float]]:
        now = self._clock()

        def live(entry_id: str) -> bool:
            slot = self._slots.get(entry_id)
            return slot is not None and not slot.entry.expired(now)

        hits = await self._searches.search(namespace, vector, k, floor, live)
        return [(self._slots[i].entry, score) for i, score in hits if i in self._slots]

    async def put(self, entry: CacheEntry) -> None:
        check_entry(entry, self._dim)
        if entry.expired(self._clock()):
            return
        replaced = self._forget(entry.entry_id)
        self._remember(_Slot(entry))
        evicted = self._evict(entry.namespace)
        self._dirty = True
        async with self._index_lock:
            await anyio.to_thread.run_sync(self._index_put, entry, replaced, evicted)

    async def record_hit(self, entry_id: str) -> None:
        slot = self._slots.get(entry_id)
        if slot is not None:
            slot.last_hit = self._clock()
            slot.hits += 1
            self._lru[slot.entry.namespace].move_to_end(entry_id)
            self._hits_dirty = True

    async def flush_namespace(self, namespace: str) -> int:
        doomed = list(self._lru.get(namespace, ()))
        for entry_id in doomed:
            self._forget(entry_id)
        async with self._index_lock:
            await anyio.to_thread.run_sync(self._index.drop, namespace)
        self._dirty = self._dirty or bool(doomed)
        if self._evidence.pop(namespace, None) is not None:
            self._evidence_dirty = True
        return len(doomed)

    async def entry(self, entry_id: str) -> CacheEntry | None:
        """A live entry by its id (a hit's `x-cache-key`), or None."""
        slot = self._slots.get(entry_id)
        return None if slot is None or slot.entry.expired(self._clock()) else slot.entry

    async def delete(self, entry_id: str) -> bool:
        """Removes one entry; False if there was none."""
        slot = self._forget(entry_id)
        if slot is None:
            return False
        self._dirty = True
        async with self._index_lock:
            await anyio.to_thread.run_sync(self._index_remove, [slot])
        return True

    async def namespaces_of(self, tenants: Collection[str]) -> set[str]:
        """Namespaces holding an entry stored for one of `tenants` (to flush them)."""
        return {s.entry.namespace for s in self._slots.values() if s.entry.tenant in tenants}

    async def evidence(self, namespace: str) -> bytes | None:
        data, expires_at = self._evidence.get(namespace, (None, 0.0))
        return data if expires_at > self._clock() else None

    async def put_evidence(self, namespace: str, data: bytes, ttl_s: float) -> None:
        self._evidence[namespace] = (data, self._clock() + ttl_s)
        self._evidence_dirty = True

    def stats(self) -> dict[str, int]:
        return {
            "entries": len(self._slots),
            "namespaces": len(self._lru),
            "evictions": self._evictions,
            "expired": self._expired,
        }

    def _remember(self, slot: _Slot) -> None:
        entry = slot.entry
        self._slots[entry.entry_id] = slot
        self._lru.setdefault(entry.namespace, OrderedDict())[entry.entry_id] = None
        self._keys[(entry.namespace, entry.exact_key)] = entry.entry_id
        self._keys[(entry.namespace, entry.normalized_key)] = entry.entry_id
        heapq.heappush(self._expiry, (slot.expires_at, entry.entry_id))

    def _forget(self, entry_id: str) -> _Slot | None:
        """Drop an entry from the maps (not from the index: callers batch that)."""
        slot = self._slots.pop(entry_id, None)
        if slot is None:
            return None
        namespace = slot.entry.namespace
        lru = self._lru[namespace]
        del lru[entry_id]
        if not lru:
            del self._lru[namespace]
        for key in (slot.entry.exact_key, slot.entry.normalized_key):
            if self._keys.get((namespace, key)) == entry_id:
                del self._keys[(namespace, key)]
        return slot

    def _evict(self, namespace: str) -> list[str]:
        lru, evicted = self._lru.get(namespace, OrderedDict()), []
        while len(lru) > self._max:
            evicted.append(next(iter(lru)))
            self._forget(evicted[-1])
        self._evictions += len(evicted)
        return evicted

    def _index_put(self, entry: CacheEntry, replaced: _Slot | None, evicted: list[str]) -> None:
        if replaced is not None:
            self._index.remove(replaced.entry.namespace, [entry.entry_id])
        self._index.add(entry.namespace, [entry.entry_id], entry.vector)
        self._index.remove(entry.namespace, evicted)

    async def _sweep_forever(self) -> None:
        while True:
            await anyio.sleep(self._sweep_interval_s)
            try:
                await self.sweep()
            except Exception:  # a maintenance bug must not take the gateway down
                logger.exception("cache sweep failed")

    async def sweep(self) -> None:
        """Remove expired entries, compact or convert indexes, snapshot if due."""
        expired = self._pop_expired(self._clock())
        self._expired += len(expired)
        self._drop_expired_evidence(self._clock())
        self._dirty = self._dirty or bool(expired)
        async with self._index_lock:
            await anyio.to_thread.run_sync(self._index_remove, expired)
        await anyio.to_thread.run_sync(self._index.maintain)  # safe beside adds and removes
        if self._snapshot_due(time.monotonic() - self._snapshot_at):
            await self._snapshot()

    def _drop_expired_evidence(self, now: float) -> None:
        stale = [ns for ns, (_, expires_at) in self._evidence.items() if expires_at <= now]
        for namespace in stale:
            del self._evidence[namespace]
        self._evidence_dirty = self._evidence_dirty or bool(stale)

    def _snapshot_due(self, since: float) -> bool:
        # The file grows with the entries, not with what changed: the write of 100k
        # entries (1.1 GB) took ~2 s here, and every 5 s would keep a thread and the disk
        # busy for good. So writes are spaced to take at most _SNAPSHOT_SHARE of the time.
        spaced = self._write_s / _SNAPSHOT_SHARE
        if self._dirty or self._evidence_dirty:
            return since >= max(self._snapshot_interval_s, spaced)
        return self._hits_dirty and since >= max(self._hit_snapshot_interval_s, spaced)

    def _pop_expired(self, now: float) -> list[_Slot]:
        expired = []
        while self._expiry and self._expiry[0][0] <= now:
            expires_at, entry_id = heapq.heappop(self._expiry)
            slot = self._slots.get(entry_id)
            if slot is not None and slot.expires_at == expires_at:
                expired.append(slot)
                self._forget(entry_id)
        if len(self._expiry) > 2 * len(self._slots) + 1024:  # drop stale heap items
            self._expiry = [(s.expires_at, i) for i, s in self._slots.items()]
            heapq.heapify(self._expiry)
        return expired

    def _index_remove(self, slots: list[_Slot]) -> None:
        for slot in slots:
            self._index.remove(slot.entry.namespace, [slot.entry.entry_id])

    async def _snapshot(self) -> None:
        if self._path is None:
            return
        dirty, hits_dirty = self._dirty, self._hits_dirty
        self._dirty = self._hits_dirty = False
        self._snapshot_at = time.monotonic()
        await self._snapshot_evidence(self._path)
        if not (dirty or hits_dirty):
            return
        slots = list(self._slots.values())
        try:
            await anyio.to_thread.run_sync(_write, self._path, self._dim, slots)
            self._write_s = time.monotonic() - self._snapshot_at
        except OSError as exc:
            self._dirty, self._hits_dirty = self._dirty or dirty, self._hits_dirty or hits_dirty
            logger.warning("cannot write cache snapshot %s: %s", self._path, exc)

    async def _snapshot_evidence(self, path: Path) -> None:
        if not self._evidence_dirty:
            return
        self._evidence_dirty = False
        try:
            await anyio.to_thread.run_sync(_write_evidence, path, dict(self._evidence))
        except OSError as exc:
            self._evidence_dirty = True
            logger.warning("cannot write cache evidence beside %s: %s", path, exc)

    async def _load(self, path: Path) -> None:
        try:
            self._evidence = await anyio.to_thread.run_sync(read_evidence, _evidence_path(path))
        except (OSError, CorruptSnapshot) as exc:
            logger.warning("ignoring cache evidence: %s", exc)
        try:
            stored = await anyio.to_thread.run_sync(read_snapshot, path, self._dim)
        except (OSError, CorruptSnapshot) as exc:
            logger.warning("ignoring cache snapshot: %s", exc)
            return
        now = self._clock()
        live = [s for s in stored if not s.entry.expired(now) and s.entry.vector.size == self._dim]
        for item in sorted(live, key=lambda s: max(s.entry.created_at, s.last_hit)):
            self._remember(_Slot(item.entry, item.last_hit, item.hits))
        for namespace in list(self._lru):
            self._evict(namespace)
        await anyio.to_thread.run_sync(self._index_all)

    def _index_all(self) -> None:
        import numpy as np

        for namespace, ids in self._lru.items():
            vectors = np.stack([self._slots[i].entry.vector for i in ids])
            self._index.add(namespace, list(ids), vectors)


def _write(path: Path, dim: int, slots: list[_Slot]) -> None:
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)  # tenants' prompts: owner only
    write_snapshot(path, dim, (StoredEntry(s.entry, s.last_hit, s.hits) for s in slots))


def _write_evidence(path: Path, evidence: Evidence) -> None:
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    write_evidence(_evidence_path(path), evidence)


def _evidence_path(path: Path) -> Path:
    return path.with_name(path.name + ".evidence")
