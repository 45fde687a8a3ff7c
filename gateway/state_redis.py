"""Redis state store: keys shared by every gateway replica.

Layout (all under one hash tag so a Redis Cluster keeps a deployment's keys on one slot):
`{prefix}:keys` is a hash from key hash to its JSON record.
"""

from __future__ import annotations

import redis.asyncio as redis
from redis.exceptions import RedisError

from gateway.state import KeyRecord, StateStoreError


class RedisStateStore:
    def __init__(self, url: str, prefix: str, timeout_s: float = 1.0) -> None:
        self._redis = redis.Redis.from_url(
            url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s
        )
        self._keys = f"{{{prefix}}}:keys"

    async def get_key(self, key_hash: str) -> KeyRecord | None:
        try:
            data = await self._redis.hget(self._keys, key_hash)
        except RedisError as exc:
            raise StateStoreError(f"redis: {type(exc).__name__}") from exc
        return None if data is None else KeyRecord.from_json(data)

    async def put_key(self, key_hash: str, record: KeyRecord) -> None:
        try:
            await self._redis.hset(self._keys, key_hash, record.to_json())
        except RedisError as exc:
            raise StateStoreError(f"redis: {type(exc).__name__}") from exc

    async def list_keys(self) -> list[KeyRecord]:
        try:
            rows = await self._redis.hgetall(self._keys)
        except RedisError as exc:
            raise StateStoreError(f"redis: {type(exc).__name__}") from exc
        return sorted((KeyRecord.from_json(v) for v in rows.values()), key=lambda r: r.created_at)

    async def revoke_key(self, key_id: str) -> bool:
        try:
            rows = await self._redis.hgetall(self._keys)
            doomed = [h for h, v in rows.items() if KeyRecord.from_json(v).key_id == key_id]
            return bool(doomed) and bool(await self._redis.hdel(self._keys, *doomed))
        except RedisError as exc:
            raise StateStoreError(f"redis: {type(exc).__name__}") from exc

    async def ping(self) -> None:
        try:
            await self._redis.ping()
        except RedisError as exc:
            raise StateStoreError(f"redis: {type(exc).__name__}") from exc

    async def close(self) -> None:
        await self._redis.aclose()
