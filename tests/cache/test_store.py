"""Entry stores: the local one (memory + snapshot file) and Redis replicas, real Redis."""

from __future__ import annotations

import contextlib
import dataclasses
import shutil
import subprocess
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import anyio
import numpy as np
import pytest
import redis as sync_redis
import redis.asyncio as aioredis

from bench.processes import free_port
from cache.codec import CorruptSnapshot, StoredEntry, read_snapshot, write_snapshot
from cache.entry import CacheEntry
from cache.store import CacheStore, CacheUnavailable
from cache.store_local import LocalCacheStore
from cache.store_redis import RedisCacheStore
from common.redis_client import RedisFactory

DIM = 32
T = TypeVar("T")


class Clock:
    def __init__(self) -> None:
        self.now = time.time()

    def __call__(self) -> float:
        return self.now

    def tick(self, seconds: float = 1.0) -> float:
        self.now += seconds
        return self.now


def vector(seed: int) -> np.ndarray:
    v = np.random.default_rng(seed).standard_normal(DIM).astype(np.float32)
    return v / np.linalg.norm(v)


def entry(
    seed: int, namespace: str = "ns", *, ttl_s: float = 600.0, at: float | None = None
) -> CacheEntry:
    return CacheEntry(
        entry_id=uuid.uuid4().hex,
        namespace=namespace,
        prompt=f"prompt {seed}",
        exact_key=f"exact-{namespace}-{seed}",
        normalized_key=f"norm-{namespace}-{seed}",
        vector=vector(seed),
        features=b"\x00features\xff",
        response=b'{"choices": [{"message": {"content": "%d"}}]}' % seed,
        model="m",
        tenant="t",
        created_at=time.time() if at is None else at,
        ttl_s=ttl_s,
    )


def same(a: CacheEntry | None, b: CacheEntry) -> bool:
    return (
        a is not None
        and (a.entry_id, a.namespace, a.prompt, a.exact_key, a.normalized_key, a.features)
        == (b.entry_id, b.namespace, b.prompt, b.exact_key, b.normalized_key, b.features)
        and (a.response, a.model, a.tenant, a.created_at, a.ttl_s)
        == (b.response, b.model, b.tenant, b.created_at, b.ttl_s)
        and np.array_equal(a.vector, b.vector)
    )


async def eventually(check: Callable[[], Awaitable[T]], within_s: float = 1.0) -> T:
    """The first truthy result of `check`, polled until `within_s`."""
    with anyio.fail_after(within_s):
        while not (result := await check()):
            await anyio.sleep(0.01)
    return result


@contextlib.asynccontextmanager
async def running(*stores: CacheStore) -> AsyncIterator[None]:
    async with anyio.create_task_group() as group:
        try:
            for store in stores:
                await store.start(group)
            yield
        finally:
            for store in stores:
                await store.close()


@pytest.fixture
def cleanup_redis(redis_url: str, redis_prefix: str) -> Iterator[None]:
    yield
    with sync_redis.Redis.from_url(redis_url) as client:
        keys = list(client.scan_iter(match=f"{{{redis_prefix}}}:*"))
        if keys:
            client.delete(*keys)


@pytest.fixture(params=["local", "redis"])
def make_store(
    request: pytest.FixtureRequest, tmp_path: Path, redis_prefix: str
) -> Callable[..., CacheStore]:
    """A factory for either store; Redis ones share the test's prefix (= replicas)."""

    def make(**kw: Any) -> CacheStore:
        if request.param == "local":
            return LocalCacheStore(tmp_path / "cache.bin", DIM, **kw)
        request.getfixturevalue("cleanup_redis")
        url = request.getfixturevalue("redis_url")
        return RedisCacheStore(RedisFactory(url), redis_prefix, DIM, **kw)

    return make


# Behaviour both stores share -------------------------------------------------------------


async def test_lookup_by_either_key_and_by_vector(make_store: Callable[..., CacheStore]) -> None:
    store = make_store()
    async with running(store):
        stored = entry(1)
        await store.put(stored)
        await store.put(entry(2))
        assert same(await store.get_by_key("ns", stored.exact_key), stored)
        assert same(await store.get_by_key("ns", stored.normalized_key), stored)
        assert await store.get_by_key("ns", "nope") is None
        hits = await store.nearest("ns", stored.vector, k=2, floor=-1.0)
        assert same(hits[0][0], stored) and hits[0][1] == pytest.approx(1.0, abs=1e-5)
        assert len(hits) == 2 and hits[1][1] < hits[0][1]
        assert len(await store.nearest("ns", stored.vector, k=2, floor=0.99)) == 1
        assert store.stats() == {"entries": 2, "namespaces": 1, "evictions": 0, "expired": 0}


async def test_namespaces_never_leak(make_store: Callable[..., CacheStore]) -> None:
    store = make_store()
    async with running(store):
        mine = entry(1, "tenant-a")
        await store.put(mine)
        await store.put(entry(2, "tenant-b"))
        assert await store.get_by_key("tenant-b", mine.exact_key) is None
        hits = await store.nearest("tenant-b", mine.vector, k=5, floor=-1.0)
        assert [h[0].namespace for h in hits] == ["tenant-b"]
        assert await store.nearest("tenant-c", mine.vector, k=5, floor=-1.0) == []


async def test_expired_entries_are_never_returned_and_get_swept(
    make_store: Callable[..., CacheStore],
) -> None:
    store = make_store(sweep_interval_s=0.05)
    async with running(store):
        short, long = entry(1, ttl_s=0.2), entry(2)
        await store.put(short)
        await store.put(long)
        assert same(await store.get_by_key("ns", short.exact_key), short)
        await anyio.sleep(0.25)
        assert await store.get_by_key("ns", short.exact_key) is None
        hits = await store.nearest("ns", short.vector, k=1, floor=-1.0)
        assert [h[0].entry_id for h in hits] == [long.entry_id]  # the next one, not a miss
        await eventually(lambda: _true(store.stats()["expired"] == 1))
        assert store.stats()["entries"] == 1


async def test_lru_eviction_order_and_count(make_store: Callable[..., CacheStore]) -> None:
    clock = Clock()
    store = make_store(max_entries_per_namespace=3, clock=clock)
    async with running(store):
        a, b, c, d, e = (entry(i, at=clock.now) for i in range(5))

        async def kept() -> list[bool]:
            return [await store.get_by_key("ns", x.exact_key) is not None for x in (a, b, c, d, e)]

        for item in (a, b, c):
            clock.tick()
            await store.put(item)
        clock.tick()
        await store.record_hit(a.entry_id)  # a is now more recent than b and c
        clock.tick()
        await store.put(d)
        assert await kept() == [True, False, True, True, False]
        clock.tick()
        await store.put(entry(9, "other", at=clock.now))  # other namespaces do not count
        clock.tick()
        await store.put(e)
        assert await kept() == [True, False, False, True, True]
        hits = await store.nearest("ns", b.vector, k=5, floor=-1.0)
        assert {h[0].entry_id for h in hits} == {a.entry_id, d.entry_id, e.entry_id}
        assert store.stats() == {"entries": 4, "namespaces": 2, "evictions": 2, "expired": 0}


async def test_flush_namespace(make_store: Callable[..., CacheStore]) -> None:
    store = make_store()
    async with running(store):
        doomed, kept = entry(1, "a"), entry(2, "b")
        for item in (doomed, entry(3, "a"), kept):
            await store.put(item)
        assert await store.flush_namespace("a") == 2
        assert await store.flush_namespace("a") == 0
        assert await store.get_by_key("a", doomed.exact_key) is None
        assert await store.nearest("a", doomed.vector, k=3, floor=-1.0) == []
        assert same(await store.get_by_key("b", kept.exact_key), kept)
        again = entry(4, "a")
        await store.put(again)  # a flushed namespace takes new entries
        assert [h[0].entry_id for h in await store.nearest("a", again.vector, 3, -1.0)] == [
            again.entry_id
        ]


async def test_delete_one_entry_by_its_id(make_store: Callable[..., CacheStore]) -> None:
    store = make_store()
    async with running(store):
        doomed, kept = entry(1), entry(2)
        for item in (doomed, kept):
            await store.put(item)
        assert same(await store.entry(doomed.entry_id), doomed)
        assert await store.delete(doomed.entry_id) is True
        assert await store.delete(doomed.entry_id) is False
        assert await store.entry(doomed.entry_id) is None
        assert await store.get_by_key("ns", doomed.exact_key) is None
        assert await store.get_by_key("ns", doomed.normalized_key) is None
        hits = await store.nearest("ns", doomed.vector, k=5, floor=-1.0)
        assert [h[0].entry_id for h in hits] == [kept.entry_id]
        assert same(await store.get_by_key("ns", kept.exact_key), kept)
        assert store.stats()["entries"] == 1


async def test_putting_an_id_again_replaces_the_entry(
    make_store: Callable[..., CacheStore],
) -> None:
    store = make_store()
    async with running(store):
        first = entry(1)
        second = dataclasses.replace(entry(2), entry_id=first.entry_id)
        await store.put(first)
        await store.put(second)
        await store.record_hit("no-such-entry")  # nothing to count, no error
        assert await store.get_by_key("ns", first.exact_key) is None
        assert same(await store.get_by_key("ns", second.exact_key), second)
        hits = await store.nearest("ns", first.vector, k=5, floor=-1.0)
        assert [(h[0].entry_id, h[0].prompt) for h in hits] == [(first.entry_id, "prompt 2")]
        assert store.stats()["entries"] == 1


async def _true(value: bool) -> bool:
    return value


# Local store: persistence ----------------------------------------------------------------


async def test_local_store_survives_a_restart(tmp_path: Path) -> None:
    clock = Clock()
    path = tmp_path / "state" / "cache.bin"
    first = LocalCacheStore(path, DIM, max_entries_per_namespace=2, clock=clock)
    old, hit = entry(1, at=clock.tick()), entry(2, at=clock.tick())
    async with running(first):
        await first.put(old)
        await first.put(hit)
        await first.put(entry(3, ttl_s=5, at=clock.tick()))  # evicts old
        await first.record_hit(hit.entry_id)
    assert path.exists() and [p.name for p in path.parent.iterdir()] == ["cache.bin"]

    clock.tick(10)  # entry 3 expires while the gateway is down
    second = LocalCacheStore(path, DIM, max_entries_per_namespace=2, clock=clock)
    async with running(second):
        assert same(await second.get_by_key("ns", hit.normalized_key), hit)
        assert await second.get_by_key("ns", old.exact_key) is None
        hits = await second.nearest("ns", hit.vector, k=3, floor=-1.0)
        assert [h[0].entry_id for h in hits] == [hit.entry_id]
        assert second.stats()["entries"] == 1


async def test_local_store_ignores_a_corrupt_or_foreign_snapshot(tmp_path: Path) -> None:
    path = tmp_path / "cache.bin"
    write_snapshot(path, DIM, [])
    path.write_bytes(path.read_bytes()[:-1])  # truncated
    store = LocalCacheStore(path, DIM)
    async with running(store):
        assert store.stats()["entries"] == 0
        await store.put(entry(1))
    other_dim = LocalCacheStore(path, DIM * 2)
    async with running(other_dim):
        assert other_dim.stats()["entries"] == 0


async def test_local_store_snapshots_periodically(tmp_path: Path) -> None:
    path = tmp_path / "cache.bin"
    store = LocalCacheStore(path, DIM, sweep_interval_s=0.02, snapshot_interval_s=0.05)
    async with running(store):
        await store.put(entry(1))
        await eventually(lambda: _true(path.exists()))
        reader = LocalCacheStore(path, DIM)  # a crash now would keep the entry
        async with running(reader):
            assert reader.stats()["entries"] == 1


async def test_local_store_writes_hits_alone_rarely_and_on_close(tmp_path: Path) -> None:
    path = tmp_path / "cache.bin"
    store = LocalCacheStore(
        path, DIM, sweep_interval_s=0.01, snapshot_interval_s=0.01, hit_snapshot_interval_s=3600
    )

    def version() -> tuple[int, int]:
        stat = path.stat()  # the snapshot is replaced, not rewritten in place
        return stat.st_ino, stat.st_mtime_ns

    hit, other = entry(1, at=time.time() - 2), entry(2, at=time.time() - 1)
    async with running(store):
        await store.put(hit)
        await store.put(other)
        await eventually(lambda: _true(path.exists()))
        await store.sweep()  # whatever the puts left dirty is written now
        written = version()
        await store.record_hit(hit.entry_id)  # hit is now more recent than other
        for _ in range(5):  # sweeps that would have rewritten the file for the hit
            await store.sweep()
        assert version() == written
    assert version() != written  # close() kept the hit
    reader = LocalCacheStore(path, DIM, max_entries_per_namespace=2)
    async with running(reader):
        await reader.put(entry(3))  # evicts the least recently used one
        assert same(await reader.get_by_key("ns", hit.exact_key), hit)
        assert await reader.get_by_key("ns", other.exact_key) is None


# Redis store: replication between replicas --------------------------------------------------


@pytest.fixture
def replica(
    redis_url: str, redis_prefix: str, cleanup_redis: None
) -> Iterator[Callable[..., RedisCacheStore]]:
    def make(**kw: Any) -> RedisCacheStore:
        return RedisCacheStore(RedisFactory(redis_url), redis_prefix, DIM, **kw)

    yield make


async def test_an_insert_on_one_replica_is_served_by_another_within_a_second(
    replica: Callable[..., RedisCacheStore],
) -> None:
    first, second = replica(), replica()
    async with running(first, second):
        stored = entry(1)
        started = time.monotonic()
        await first.put(stored)

        async def found() -> bool:
            hits = await second.nearest("ns", stored.vector, k=1, floor=0.9)
            return bool(hits) and same(hits[0][0], stored)

        await eventually(found, within_s=1.0)
        assert time.monotonic() - started < 1.0
        assert same(await second.get_by_key("ns", stored.exact_key), stored)

        late = replica()  # a replica started later rebuilds from Redis
        async with running(late):
            hits = await late.nearest("ns", stored.vector, k=1, floor=0.9)
            assert same(hits[0][0], stored) and late.stats()["entries"] == 1


async def test_a_delete_on_one_replica_reaches_every_index(
    replica: Callable[..., RedisCacheStore],
) -> None:
    first, second = replica(), replica()
    async with running(first, second):
        doomed, kept = entry(1), entry(2)
        for item in (doomed, kept):
            await first.put(item)

        async def both_there() -> bool:
            return len(await second.nearest("ns", doomed.vector, k=5, floor=-1.0)) == 2

        await eventually(both_there)
        assert await second.delete(doomed.entry_id) is True  # not the replica that stored it

        async def gone_there() -> bool:
            return first.stats()["entries"] == 1 and second.stats()["entries"] == 1

        await eventually(gone_there)
        for store in (first, second):
            hits = await store.nearest("ns", doomed.vector, k=5, floor=-1.0)
            assert [h[0].entry_id for h in hits] == [kept.entry_id]
            assert await store.entry(doomed.entry_id) is None


async def test_flush_and_evictions_propagate(replica: Callable[..., RedisCacheStore]) -> None:
    first, second = replica(max_entries_per_namespace=2), replica(max_entries_per_namespace=2)
    async with running(first, second):
        entries = [entry(i) for i in range(3)]
        for item in entries:
            await first.put(item)
            await anyio.sleep(0.002)  # distinct LRU scores
        assert first.stats()["evictions"] == 1

        async def evicted_there() -> bool:
            hits = await second.nearest("ns", entries[0].vector, k=3, floor=-1.0)
            found = {h[0].entry_id for h in hits}
            return found == {entries[1].entry_id, entries[2].entry_id}

        await eventually(evicted_there)
        assert second.stats()["entries"] == 2

        assert await second.flush_namespace("ns") == 2

        async def flushed_there() -> bool:
            return first.stats()["entries"] == 0

        await eventually(flushed_there)
        assert await first.nearest("ns", entries[2].vector, k=1, floor=-1.0) == []


async def test_a_gap_in_the_stream_makes_a_replica_rebuild(
    replica: Callable[..., RedisCacheStore], redis_url: str, redis_prefix: str
) -> None:
    first, second = replica(), replica()
    async with running(first, second):
        client = aioredis.Redis.from_url(redis_url)
        await client.incr(f"{{{redis_prefix}}}:cache:seq")  # a message second never sees
        await client.aclose()
        stored = entry(1)
        await first.put(stored)

        async def found() -> bool:
            return bool(await second.nearest("ns", stored.vector, k=1, floor=0.9))

        await eventually(found, within_s=2.0)


async def test_unreachable_redis_raises_cache_unavailable_quickly() -> None:
    store = RedisCacheStore(
        RedisFactory(f"redis://127.0.0.1:{free_port()}"), "x", DIM, timeout_s=0.5
    )
    started = time.monotonic()
    async with running(store):  # starting does not fail: the tailer keeps retrying
        for call in (
            store.put(entry(1)),
            store.get_by_key("ns", "k"),
            store.record_hit("id"),
            store.flush_namespace("ns"),
        ):
            with pytest.raises(CacheUnavailable):
                await call
        assert await store.nearest("ns", vector(1), k=1, floor=0.0) == []  # empty index
    assert time.monotonic() - started < 2.0


class PrivateRedis:
    """A redis-server of this test's own, on a fixed port, that can be stopped and restarted."""

    def __init__(self, folder: Path) -> None:
        binary = shutil.which("redis-server") or "/usr/bin/redis-server"
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}"
        self.command = [binary, "--port", str(self.port), "--bind", "127.0.0.1"]
        self.command += ["--save", "", "--appendonly", "no", "--dir", str(folder)]
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.process = subprocess.Popen(
            self.command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        deadline = time.monotonic() + 10
        while True:
            try:
                if sync_redis.Redis.from_url(self.url, socket_timeout=0.5).ping():
                    return
            except sync_redis.RedisError:
                if time.monotonic() > deadline:
                    raise
            time.sleep(0.02)

    def stop(self) -> None:
        if self.process is not None:
            self.process.terminate()
            self.process.wait(10)
            self.process = None


@pytest.fixture
def private_redis(tmp_path: Path) -> Iterator[PrivateRedis]:
    server = PrivateRedis(tmp_path)
    server.start()
    yield server
    server.stop()


async def test_replication_resumes_after_a_redis_restart(private_redis: PrivateRedis) -> None:
    def make() -> RedisCacheStore:
        return RedisCacheStore(
            RedisFactory(private_redis.url), "p", DIM, retry_s=(0.05, 0.3), block_s=1.0
        )

    writer, reader = make(), make()
    async with running(writer, reader):
        before = entry(1)
        await writer.put(before)
        await eventually(lambda: reader.nearest("ns", before.vector, 1, 0.9))

        await anyio.to_thread.run_sync(private_redis.stop)
        with pytest.raises(CacheUnavailable):
            await writer.put(entry(2))
        with pytest.raises(CacheUnavailable):  # the index has it, Redis must answer
            await reader.nearest("ns", before.vector, 1, 0.9)
        await anyio.to_thread.run_sync(private_redis.start)  # empty: no persistence

        after = entry(3)
        await writer.put(after)

        async def replicated() -> bool:
            hits = await reader.nearest("ns", after.vector, 1, 0.9)
            return bool(hits) and same(hits[0][0], after)

        await eventually(replicated, within_s=3.0)
        # the reader rebuilt from the new, empty Redis: the old entry is gone from its index
        assert reader.stats()["entries"] == 1


async def test_evidence_is_kept_per_namespace_shared_and_flushed(
    make_store: Callable[..., CacheStore],
) -> None:
    """The error-bounded mode's evidence: another replica (or the local store restarted
    from its files) reads what one wrote; a flush drops it with the namespace's entries."""
    store = make_store()
    async with running(store):
        await store.put(entry(1, "a"))
        assert await store.evidence("a") is None
        await store.put_evidence("a", b'{"v": 1}', 60.0)
        await store.put_evidence("b", b"other", 60.0)
        assert await store.evidence("a") == b'{"v": 1}'
    again = make_store()
    async with running(again):
        assert await again.evidence("a") == b'{"v": 1}'
        await again.flush_namespace("a")
        assert await again.evidence("a") is None
        assert await again.evidence("b") == b"other"


async def test_local_evidence_lives_as_long_as_the_ttl_it_was_written_with() -> None:
    now = [1000.0]
    store = LocalCacheStore(None, DIM, clock=lambda: now[0])
    async with running(store):
        await store.put_evidence("a", b"e", 10.0)
        now[0] += 9.0
        assert await store.evidence("a") == b"e"
        now[0] += 1.0
        assert await store.evidence("a") is None


async def test_local_store_spaces_snapshots_that_take_long_to_write(tmp_path: Path) -> None:
    """A snapshot that took 1 s to write is not written again within 20 s (5% of the
    time), however short the configured interval."""
    store = LocalCacheStore(tmp_path / "cache.bin", DIM, snapshot_interval_s=0.01)
    async with running(store):
        await store.put(entry(1))
        assert store._snapshot_due(0.02)
        store._write_s = 1.0
        assert not store._snapshot_due(19.9)
        assert store._snapshot_due(20.0)


def test_a_snapshot_that_fails_midway_leaves_the_last_one_whole(tmp_path: Path) -> None:
    path, first = tmp_path / "cache.bin", entry(1)
    write_snapshot(path, DIM, [StoredEntry(first, 0.0, 0)])
    written = path.read_bytes()

    def failing() -> Iterator[StoredEntry]:
        yield StoredEntry(entry(2), 0.0, 0)
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        write_snapshot(path, DIM, failing())
    assert path.read_bytes() == written
    assert [p.name for p in tmp_path.iterdir()] == ["cache.bin"]  # no temporary file left
    assert [s.entry.entry_id for s in read_snapshot(path, DIM)] == [first.entry_id]


def test_a_snapshot_reads_back_what_was_written_and_refuses_any_damage(tmp_path: Path) -> None:
    path = tmp_path / "cache.bin"
    written = [StoredEntry(entry(i), 100.0 + i, i) for i in range(3)]
    write_snapshot(path, DIM, written)
    read = read_snapshot(path, DIM)
    assert [(s.last_hit, s.hits) for s in read] == [(100.0, 0), (101.0, 1), (102.0, 2)]
    assert all(same(r.entry, w.entry) for r, w in zip(read, written, strict=True))
    data = path.read_bytes()
    flipped = data[:100] + bytes([data[100] ^ 1]) + data[101:]
    for damaged in (b"", data[:23], data[: len(data) // 2], data[:-1], flipped):
        path.write_bytes(damaged)
        with pytest.raises(CorruptSnapshot):
            read_snapshot(path, DIM)
    assert read_snapshot(tmp_path / "none.bin", DIM) == []
