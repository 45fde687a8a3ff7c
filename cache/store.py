"""The cache's entry store: where entries live, and how a lookup finds them.

    CacheStore (protocol)
    ├── LocalCacheStore   in memory, snapshotted to a local file (cache/store_local.py)
    └── RedisCacheStore   entries in Redis, inserts streamed to every replica's index
                          (cache/store_redis.py)

    CacheUnavailable      the store cannot answer now (Redis unreachable or timing out);
                          the gateway fails open on it and asks the model

Both keep per entry its creation time and TTL (in the entry), last hit and hit count, and
per namespace the error-bounded mode's evidence (opaque bytes, cache/bounded.py), which
lives as long as a namespace's entries do (the TTL, renewed by every update) and goes
with a flush.
A namespace holds at most `max_entries_per_namespace` entries: an insert beyond that evicts
the least recently used one (hit or inserted), counted in `stats()["evictions"]`. Expired
entries are never returned; a sweeper removes them (`stats()["expired"]`).

This module holds what both share: the protocol, the error, `check_entry`, and
`BackgroundLoops` (the cancel scope their sweepers and tailers run in).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Coroutine, Sequence
from typing import Any, Protocol

import anyio
from anyio.abc import TaskGroup, TaskStatus

from cache.entry import CacheEntry, Vector

_Loop = Callable[[], Coroutine[Any, Any, None]]


class CacheUnavailable(Exception):
    """The cache store cannot be reached or timed out; treat as a miss."""


class CacheStore(Protocol):
    async def start(self, task_group: TaskGroup) -> None: ...
    async def close(self) -> None: ...
    async def get_by_key(self, namespace: str, key: str) -> CacheEntry | None: ...
    async def nearest(
        self, namespace: str, vector: Vector, k: int, floor: float
    ) -> list[tuple[CacheEntry, float]]: ...
    async def put(self, entry: CacheEntry) -> None: ...
    async def record_hit(self, entry_id: str) -> None: ...
    async def flush_namespace(self, namespace: str) -> int: ...
    async def entry(self, entry_id: str) -> CacheEntry | None: ...
    async def delete(self, entry_id: str) -> bool: ...
    async def namespaces_of(self, tenants: Collection[str]) -> set[str]: ...
    async def evidence(self, namespace: str) -> bytes | None: ...
    async def put_evidence(self, namespace: str, data: bytes, ttl_s: float) -> None: ...
    def stats(self) -> dict[str, int]: ...


class BackgroundLoops:
    """A store's loops, in their own cancel scope inside the owner's task group, so that
    close() can stop them and wait until they have."""

    def __init__(self) -> None:
        self._scope: anyio.CancelScope | None = None
        self._stopped: anyio.Event | None = None

    async def start(self, task_group: TaskGroup, *loops: _Loop) -> None:
        await task_group.start(self._run, loops)

    async def _run(
        self,
        loops: Sequence[_Loop],
        *,
        task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
    ) -> None:
        self._stopped = anyio.Event()
        try:
            with anyio.CancelScope() as scope:
                self._scope = scope
                async with anyio.create_task_group() as group:
                    for loop in loops:
                        group.start_soon(loop)
                    task_status.started()
        finally:
            self._stopped.set()

    async def stop(self) -> None:
        if self._scope is not None and self._stopped is not None:
            self._scope.cancel()
            await self._stopped.wait()


def check_entry(entry: CacheEntry, dim: int) -> None:
    if entry.vector.shape != (dim,):
        raise ValueError(f"entry vector has shape {entry.vector.shape}, expected ({dim},)")
