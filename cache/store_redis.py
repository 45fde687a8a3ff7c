"""Redis cache store: entries shared by every gateway replica, each with its own index.

Redis holds the entries and all shared metadata (layout in cache/redis_scripts.py); every
change is one Lua script that also appends to a Redis Stream. Each replica keeps only a
FAISS index (plus each entry's expiry: cache/replica_index.py) in memory, fed by tailing
that stream with `XREAD BLOCK`: an insert on one replica is searchable on the others as
soon as the XREAD returns (milliseconds). The writer also applies its own change at once,
so it reads its writes; replays are harmless because index adds of a present id and
removes of an absent one do nothing. A hit's entry is fetched from Redis, so hit counts
and LRU are shared.
The error-bounded mode's evidence is one plain key per namespace (`{prefix}:cache:evidence:
<namespace>`), read and written whole with the cache's TTL: two replicas updating it at once
lose one label at most (the later write wins), which only slows the learning.

Rebuild (at start, and after any gap) scans the entries, not the stream: the stream is
trimmed (`XADD MAXLEN ~ stream_maxlen`) and only bridges the moments a replica is behind.
The order matters: read the stream's last id and the message counter atomically first,
then scan the expiry set (ZSCAN) and fetch the vectors, then tail from that id; whatever
changed during the scan is replayed.

A tailer sees a gap when the counter in a message is not the last one plus one (trimmed
past it, or Redis restarted empty). On a gap, or when Redis goes away, it retries with
exponential backoff and rebuilds when Redis answers again. Every Redis error reaching a
caller is `CacheUnavailable`; socket timeouts are short (`timeout_s`), and only a broken
pooled connection is retried, once.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Collection, Iterator
from typing import Any

import anyio
import anyio.to_thread
import numpy as np
import orjson
from anyio.abc import TaskGroup
from redis.exceptions import RedisError

from cache import redis_scripts
from cache.codec import entry_fields, entry_from_fields
from cache.entry import CacheEntry, Vector
from cache.index import IndexConfig
from cache.replica_index import Change, ReplicaIndex
from cache.search_batch import SearchBatcher
from cache.store import BackgroundLoops, CacheUnavailable, check_entry
from common.backoff import Backoff
from common.redis_client import RedisFactory

logger = logging.getLogger(__name__)

_GRACE_S = 3600  # Redis drops an entry this long after expiry if no replica swept it
_BATCH = 512


@contextlib.contextmanager
def _unavailable() -> Iterator[None]:
    try:
        yield
    except RedisError as exc:
        raise CacheUnavailable(f"redis: {type(exc).__name__}: {exc}") from exc


class RedisCacheStore:
    def __init__(
        self,
        clients: RedisFactory,
        prefix: str,
        dim: int,
        max_entries_per_namespace: int = 10_000,
        *,
        index_config: IndexConfig | None = None,
        timeout_s: float = 0.5,
        stream_maxlen: int = 10_000,
        block_s: float = 2.0,
        sweep_interval_s: float = 1.0,
        retry_s: tuple[float, float] = (0.05, 2.0),
        clock: Callable[[], float] = time.time,
    ) -> None:
        if max_entries_per_namespace < 1:
            raise ValueError("max_entries_per_namespace must be at least 1")
        self._dim, self._max, self._maxlen = dim, max_entries_per_namespace, stream_maxlen
        self._block_ms = int(block_s * 1000)
        self._sweep_interval_s, self._retry_s, self._clock = sweep_interval_s, retry_s, clock
        self._redis = clients.client("cache", timeout_s, retries=1)
        # XREAD BLOCK holds its connection, and must not be retried behind our back:
        # a reconnect means the tailer may have missed messages and must rebuild.
        self._tail_redis = clients.client(
            "cache-tail", block_s + timeout_s, connect_timeout_s=timeout_s, retries=0
        )
        self._p = f"{{{prefix}}}"
        self._stream = f"{self._p}:cache:stream"
        self._scripts = {
            name: self._redis.register_script(getattr(redis_scripts, name))
            for name in ("PUT", "GET", "HIT", "EXPIRE", "FLUSH", "DELETE")
        }
        self._replica = ReplicaIndex(dim, index_config)
        self._searches = SearchBatcher(lambda: self._replica.index)  # one FAISS call per loop turn
        self._seq, self._last_id, self._need_sync = 0, b"0-0", True
        self._loops = BackgroundLoops()
        self._evictions = self._expired = 0

    async def start(self, task_group: TaskGroup) -> None:
        """Rebuild from Redis and start tailing. If Redis does not answer, start anyway
        (lookups miss or raise CacheUnavailable) and let the tailer rebuild later."""
        try:
            await self._resync()
        except CacheUnavailable as exc:
            logger.warning("cache index not rebuilt at start, will retry: %s", exc)
        await self._loops.start(task_group, self._tail_forever, self._sweep_forever)

    async def close(self) -> None:
        await self._loops.stop()
        await self._tail_redis.aclose()
        await self._redis.aclose()

    async def get_by_key(self, namespace: str, key: str) -> CacheEntry | None:
        with _unavailable():
            fields = await self._run("GET", namespace, key)
        if not fields:
            return None
        entry = entry_from_fields(dict(zip(fields[::2], fields[1::2], strict=True)))
        if entry.namespace != namespace or entry.expired(self._clock()):
            return None
        return entry

    async def nearest(
        self, namespace: str, vector: Vector, k: int, floor: float
    ) -> list[tuple[CacheEntry, float]]:
        now = self._clock()
        hits = await self._searches.search(
            namespace, vector, k, floor, lambda i: self._replica.live(i, now)
        )
        if not hits:
            return []
        with _unavailable():
            async with self._redis.pipeline(transaction=False) as pipe:
                for entry_id, _ in hits:
                    pipe.hgetall(self._entry_key(entry_id))
                rows = await pipe.execute()
        found = [
            (entry_from_fields(row), score)
            for row, (_, score) in zip(rows, hits, strict=True)
            if row
        ]
        return [(e, s) for e, s in found if e.namespace == namespace and not e.expired(now)]

    async def put(self, entry: CacheEntry) -> None:
        check_entry(entry, self._dim)
        now, expires_at = self._clock(), entry.created_at + entry.ttl_s
        if expires_at <= now:
            return
        fields = entry_fields(entry)
        args = [
            entry.namespace,
            entry.entry_id,
            *(fields[name] for name in ("meta", "vector", "features", "response")),
            entry.exact_key,
            entry.normalized_key,
            now,
            expires_at,
            int((expires_at + _GRACE_S) * 1000),
            self._max,
            self._maxlen,
        ]
        with _unavailable():
            evicted = [i.decode() for i in await self._run("PUT", *args)]
        self._evictions += len(evicted)
        vector = np.asarray(entry.vector, np.float32)[None, :]
        put = Change("put", entry.namespace, [entry.entry_id], vector, expires_at)
        await self._replica.apply([put, Change("del", entry.namespace, evicted)])

    async def record_hit(self, entry_id: str) -> None:
        with _unavailable():
            await self._run("HIT", entry_id, self._clock())

    async def flush_namespace(self, namespace: str) -> int:
        with _unavailable():
            removed = int(await self._run("FLUSH", namespace, self._maxlen))
            await self._redis.delete(self._evidence_key(namespace))
        await self._replica.apply([Change("flush", namespace, [])])
        return removed

    async def entry(self, entry_id: str) -> CacheEntry | None:
        """A live entry by its id (a hit's `x-cache-key`), or None."""
        with _unavailable():
            fields: Any = await self._redis.hgetall(self._entry_key(entry_id))
        if not fields:
            return None
        entry = entry_from_fields(fields)
        return None if entry.expired(self._clock()) else entry

    async def delete(self, entry_id: str) -> bool:
        """Removes one entry, here and (through the stream) from every replica's index;
        False if there was none."""
        with _unavailable():
            namespace = await self._run("DELETE", entry_id, self._maxlen)
        if namespace is None:
            return False
        await self._replica.apply([Change("del", namespace.decode(), [entry_id])])
        return True

    async def namespaces_of(self, tenants: Collection[str]) -> set[str]:
        """Namespaces holding a live entry stored for one of `tenants` (to flush them)."""
        found: set[str] = set()
        cursor = 0
        with _unavailable():
            while True:
                scanned: Any = await self._redis.zscan(
                    f"{self._p}:cache:expiry", cursor, count=_BATCH
                )
                cursor, members = scanned
                async with self._redis.pipeline(transaction=False) as pipe:
                    for member, _ in members:
                        pipe.hmget(self._entry_key(member.decode()), ["ns", "meta"])
                    rows = await pipe.execute()
                for namespace, meta in rows:
                    if namespace is not None and orjson.loads(meta)["tenant"] in tenants:
                        found.add(namespace.decode())
                if cursor == 0:
                    return found

    async def evidence(self, namespace: str) -> bytes | None:
        with _unavailable():
            data: Any = await self._redis.get(self._evidence_key(namespace))
        return None if data is None else bytes(data)

    async def put_evidence(self, namespace: str, data: bytes, ttl_s: float) -> None:
        with _unavailable():
            await self._redis.set(self._evidence_key(namespace), data, px=int(ttl_s * 1000))

    def stats(self) -> dict[str, int]:
        """This replica's view: entries and namespaces in its index; evictions and expiries
        it performed on the shared state (summed over replicas, they are the totals)."""
        return {
            "entries": len(self._replica.index),
            "namespaces": len(self._replica.index.namespaces()),
            "evictions": self._evictions,
            "expired": self._expired,
        }

    def _entry_key(self, entry_id: str) -> str:
        return f"{self._p}:cache:entry:{entry_id}"

    def _evidence_key(self, namespace: str) -> str:
        return f"{self._p}:cache:evidence:{namespace}"

    async def _run(self, script: str, *args: Any) -> Any:
        return await self._scripts[script](keys=[self._stream], args=[self._p, *args])

    # Background loops ---------------------------------------------------------------------

    async def _sweep_forever(self) -> None:
        while True:
            await anyio.sleep(self._sweep_interval_s)
            try:
                await self.sweep()
            except CacheUnavailable as exc:
                logger.debug("cache sweep skipped: %s", exc)
            except Exception:  # a maintenance bug must not take the gateway down
                logger.exception("cache sweep failed")

    async def sweep(self) -> None:
        """Expire entries locally and in Redis, compact or convert indexes."""
        now = self._clock()
        await self._replica.expire(now)
        await anyio.to_thread.run_sync(self._replica.index.maintain)  # safe beside adds and removes
        looked = _BATCH
        while looked == _BATCH:
            with _unavailable():
                looked, removed = await self._run("EXPIRE", now, _BATCH)
            self._expired += int(removed)

    async def _tail_forever(self) -> None:
        backoff = Backoff(self._retry_s[0], self._retry_s[1], jitter="none")
        failures = 0
        while True:
            try:
                if self._need_sync:
                    await self._resync()
                await self._tail_once()
                failures = 0
            except Exception as exc:  # Redis gone, or a bug: either way rebuild, never die
                failures += 1
                if not isinstance(exc, CacheUnavailable):
                    logger.exception("cache stream tailer failed")
                elif failures == 1:
                    logger.warning("cache stream lost, retrying: %s", exc)
                self._need_sync = True
                await anyio.sleep(backoff.delay_s(failures))

    async def _tail_once(self) -> None:
        with _unavailable():
            reply: Any = await self._tail_redis.xread(
                {self._stream: self._last_id}, count=_BATCH, block=self._block_ms
            )
        changes = []
        for message_id, fields in reply[0][1] if reply else []:
            try:
                seq = int(fields[b"seq"])
                if seq != self._seq + 1:
                    raise ValueError(f"expected message {self._seq + 1}, got {seq}")
                changes.append(self._decode(fields))
            except (KeyError, ValueError) as exc:
                logger.warning("cache stream gap or bad message, rebuilding: %s", exc)
                self._need_sync = True
                break
            self._seq, self._last_id = seq, message_id
        if changes:
            await self._replica.apply(changes)

    def _decode(self, fields: dict[bytes, bytes]) -> Change:
        op, namespace = fields[b"op"].decode(), fields[b"ns"].decode()
        if op == "put":
            vector = np.frombuffer(fields[b"vec"], np.float32)
            if vector.size != self._dim:
                raise ValueError(f"vector of dimension {vector.size}, expected {self._dim}")
            entry_id, expires_at = fields[b"id"].decode(), float(fields[b"exp"])
            return Change(op, namespace, [entry_id], vector[None, :], expires_at)
        if op == "del":
            ids = orjson.loads(fields[b"ids"])
            return Change(op, namespace, [str(i) for i in ids] if isinstance(ids, list) else [])
        if op == "flush":
            return Change(op, namespace, [])
        raise ValueError(f"unknown stream operation {op!r}")

    # Rebuild ------------------------------------------------------------------------------

    async def _resync(self) -> None:
        """Rebuild the index from Redis; tail from the position read before the scan."""
        with _unavailable():
            async with self._redis.pipeline(transaction=True) as pipe:
                pipe.get(f"{self._p}:cache:seq")
                pipe.xrevrange(self._stream, count=1)
                seq, last = await pipe.execute()
            rows = await self._scan()
        await self._replica.replace(rows)
        self._seq, self._last_id = int(seq or 0), last[0][0] if last else b"0-0"
        if self._need_sync:
            logger.info("cache index rebuilt from Redis: %d entries", len(rows))
        self._need_sync = False

    async def _scan(self) -> list[tuple[str, str, bytes, float]]:
        """(namespace, id, vector, expiry) of every live entry."""
        now, rows, cursor = self._clock(), [], 0
        expiry_key = f"{self._p}:cache:expiry"
        while True:
            scanned: Any = await self._redis.zscan(expiry_key, cursor, count=_BATCH)
            cursor, members = scanned
            live = [(m.decode(), float(score)) for m, score in members if score > now]
            async with self._redis.pipeline(transaction=False) as pipe:
                for entry_id, _ in live:
                    pipe.hmget(self._entry_key(entry_id), ["ns", "vector"])
                found = await pipe.execute()
            for (entry_id, expires_at), (namespace, vector) in zip(live, found, strict=True):
                if namespace is not None and len(vector) == 4 * self._dim:
                    rows.append((namespace.decode(), entry_id, vector, expires_at))
            if cursor == 0:
                return rows
