"""Stored responses of the Responses API: what `previous_response_id` continues from and
`GET /v1/responses/{id}` returns, kept by the tenant's owner (`Tenant.owner`: a tenant
deleted and created again under the same name finds none of the old one's).

    MemoryResponses   in this process (the embedded `state.url: memory`; lost on restart)
    RedisResponses    in Redis, shared by every gateway replica

Both are bounded the same way: a response is kept `ttl_s` (OpenAI keeps 30 days), and a
tenant keeps at most `per_tenant` of them and `max_bytes` of them in all (each holds its
whole conversation), its oldest forgotten first, so one tenant can neither fill the store
nor push out another's. One response larger than `max_bytes` alone is not stored (`put`
says so).
"""

from __future__ import annotations

import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Protocol

import orjson
from redis.exceptions import RedisError

from common.redis_client import RedisFactory
from gateway.errors import StateUnavailable

# Store one response and keep the tenant's newest within `per_tenant` and `max_bytes`
# (in one step: replicas storing at once cannot lose an id from the index). KEYS: the
# index, the response's key, the sizes. ARGV: id, response, ttl in ms, now in s,
# per_tenant, max_bytes.
_PUT = """
local function drop(id)
  redis.call('DEL', KEYS[1] .. ':' .. id)
  redis.call('HDEL', KEYS[3], id)
  redis.call('ZREM', KEYS[1], id)
end
local ttl, now = tonumber(ARGV[3]), tonumber(ARGV[4])
for _, id in ipairs(redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now - ttl / 1000)) do
  drop(id)
end
redis.call('SET', KEYS[2], ARGV[2], 'PX', ttl)
redis.call('ZADD', KEYS[1], now, ARGV[1])
redis.call('HSET', KEYS[3], ARGV[1], string.len(ARGV[2]))
local total = 0
for _, size in ipairs(redis.call('HVALS', KEYS[3])) do total = total + tonumber(size) end
while redis.call('ZCARD', KEYS[1]) > tonumber(ARGV[5]) or total > tonumber(ARGV[6]) do
  local oldest = redis.call('ZRANGE', KEYS[1], 0, 0)[1]
  total = total - tonumber(redis.call('HGET', KEYS[3], oldest) or '0')
  drop(oldest)
end
redis.call('PEXPIRE', KEYS[1], ttl)
redis.call('PEXPIRE', KEYS[3], ttl)
"""


@dataclass(frozen=True)
class Stored:
    response: dict[str, Any]  # the response object, as sent
    history: list[dict[str, Any]]  # the conversation as chat messages, without instructions
    input: list[dict[str, Any]]  # the request's own input items

    def to_json(self) -> bytes:
        return orjson.dumps(
            {"response": self.response, "history": self.history, "input": self.input}
        )

    @staticmethod
    def from_json(data: bytes | str) -> Stored:
        fields = orjson.loads(data)
        return Stored(fields["response"], fields["history"], fields["input"])

    @property
    def id(self) -> str:
        return str(self.response["id"])


class ResponseStore(Protocol):
    async def put(self, owner: str, stored: Stored) -> bool:
        """Stores it; False when it alone is larger than a tenant's `max_bytes`."""
        ...

    async def get(self, owner: str, response_id: str) -> Stored | None: ...
    async def delete(self, owner: str, response_id: str) -> bool: ...


class MemoryResponses:
    def __init__(self, ttl_s: float, per_tenant: int, max_bytes: int) -> None:
        self._ttl_s = ttl_s
        self._per_tenant = per_tenant
        self._max_bytes = max_bytes
        self._kept: dict[str, OrderedDict[str, tuple[float, bytes]]] = {}
        self._bytes: dict[str, int] = {}

    async def put(self, owner: str, stored: Stored) -> bool:
        data = stored.to_json()
        if len(data) > self._max_bytes:
            return False
        kept = self._kept.setdefault(owner, OrderedDict())
        kept[stored.id] = (time.monotonic() + self._ttl_s, data)
        self._bytes[owner] = self._bytes.get(owner, 0) + len(data)
        while len(kept) > self._per_tenant or self._bytes[owner] > self._max_bytes:
            _, (_, dropped) = kept.popitem(last=False)
            self._bytes[owner] -= len(dropped)
        return True

    async def get(self, owner: str, response_id: str) -> Stored | None:
        kept = self._kept.get(owner)
        found = kept.get(response_id) if kept is not None else None
        if found is None or found[0] < time.monotonic():
            return None
        return Stored.from_json(found[1])

    async def delete(self, owner: str, response_id: str) -> bool:
        dropped = self._kept.get(owner, OrderedDict()).pop(response_id, None)
        if dropped is None:
            return False
        self._bytes[owner] -= len(dropped[1])
        return True


class RedisResponses:
    """Keys, one hash tag per tenant:

    {prefix}:responses:{owner}:{id}   string   the stored response, with its TTL
    {prefix}:responses:{owner}        zset     its ids by when they were stored
    {prefix}:responses:{owner}:sizes  hash     its ids' sizes in bytes
    """

    def __init__(
        self,
        clients: RedisFactory,
        prefix: str,
        ttl_s: float,
        per_tenant: int,
        max_bytes: int,
        timeout_s: float = 2.0,
    ) -> None:
        self._redis = clients.client("responses", timeout_s)
        self._prefix = prefix
        self._ttl_ms = int(ttl_s * 1000)
        self._per_tenant = per_tenant
        self._max_bytes = max_bytes
        self._put = self._redis.register_script(_PUT)

    def _index(self, owner: str) -> str:
        return f"{{{self._prefix}:responses:{owner}}}"

    async def put(self, owner: str, stored: Stored) -> bool:
        data = stored.to_json()
        if len(data) > self._max_bytes:
            return False
        index = self._index(owner)
        keys = [index, f"{index}:{stored.id}", f"{index}:sizes"]
        args: list[bytes | str | float] = [
            stored.id,
            data,
            self._ttl_ms,
            time.time(),
            self._per_tenant,
            self._max_bytes,
        ]
        try:
            await self._put(keys=keys, args=args)
        except RedisError as exc:
            raise _unavailable() from exc
        return True

    async def get(self, owner: str, response_id: str) -> Stored | None:
        try:
            data = await self._redis.get(f"{self._index(owner)}:{response_id}")
        except RedisError as exc:
            raise _unavailable() from exc
        return None if data is None else Stored.from_json(data)

    async def delete(self, owner: str, response_id: str) -> bool:
        index = self._index(owner)
        try:
            async with self._redis.pipeline(transaction=True) as pipe:
                pipe.delete(f"{index}:{response_id}")
                pipe.zrem(index, response_id)
                pipe.hdel(f"{index}:sizes", response_id)
                deleted, _, _ = await pipe.execute()
        except RedisError as exc:
            raise _unavailable() from exc
        return bool(deleted)

    async def close(self) -> None:
        await self._redis.aclose()


def _unavailable() -> StateUnavailable:
    return StateUnavailable("The response store is unreachable.", retry_after=1)
