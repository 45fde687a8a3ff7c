"""Redis state store: keys shared by every gateway replica.

Layout (all under one hash tag so a Redis Cluster keeps a deployment's keys on one slot):
`{prefix}:keys` is a hash from key hash to its JSON record; `{prefix}:tenants` a hash from
tenant name to its JSON document (admin API), and `{prefix}:tenants:version` a counter
bumped with every change, so replicas poll one small key instead of the whole hash.
"""

from __future__ import annotations

from typing import Any

import orjson
from redis.exceptions import RedisError

from common.redis_client import RedisFactory
from gateway.tenancy.state import KeyRecord, StateStoreError


class RedisStateStore:
    def __init__(self, clients: RedisFactory, prefix: str, timeout_s: float = 1.0) -> None:
        self._redis = clients.client("state", timeout_s)
        self._keys = f"{{{prefix}}}:keys"
        self._tenants = f"{{{prefix}}}:tenants"
        self._version = f"{{{prefix}}}:tenants:version"

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

    async def tenants_version(self) -> str:
        try:
            version = await self._redis.get(self._version)
        except RedisError as exc:
            raise StateStoreError(f"redis: {type(exc).__name__}") from exc
        return "0" if version is None else str(int(version))

    async def list_tenants(self) -> dict[str, dict[str, Any]]:
        try:
            rows = await self._redis.hgetall(self._tenants)
        except RedisError as exc:
            raise StateStoreError(f"redis: {type(exc).__name__}") from exc
        return {_text(name): orjson.loads(doc) for name, doc in rows.items()}

    async def put_tenant(self, name: str, doc: dict[str, Any]) -> None:
        try:
            async with self._redis.pipeline(transaction=True) as pipe:
                pipe.hset(self._tenants, name, orjson.dumps(doc))
                pipe.incr(self._version)
                await pipe.execute()
        except RedisError as exc:
            raise StateStoreError(f"redis: {type(exc).__name__}") from exc

    async def drop_tenant(self, name: str) -> bool:
        try:
            async with self._redis.pipeline(transaction=True) as pipe:
                pipe.hdel(self._tenants, name)
                pipe.incr(self._version)
                removed, _ = await pipe.execute()
        except RedisError as exc:
            raise StateStoreError(f"redis: {type(exc).__name__}") from exc
        return bool(removed)

    async def ping(self) -> None:
        try:
            await self._redis.ping()
        except RedisError as exc:
            raise StateStoreError(f"redis: {type(exc).__name__}") from exc

    async def close(self) -> None:
        await self._redis.aclose()


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value
