"""Stored responses of the Responses API: what `previous_response_id` continues from and
`GET /v1/responses/{id}` returns, kept by the tenant's owner (`Tenant.owner`: a tenant
deleted and created again under the same name finds none of the old one's).

    MemoryResponses   in this process (the embedded `state.url: memory`; lost on restart)
    RedisResponses    in Redis, shared by every gateway replica

Both are bounded the same way: a response is kept `ttl_s` (OpenAI keeps 30 days), and a
tenant keeps at most `per_tenant` of them, its oldest forgotten first, so one tenant can
neither fill the store nor push out another's.
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

# Store one response and keep the tenant's newest `per_tenant` (in one step: replicas
# storing at once cannot lose an id from the index). KEYS: the index, the response's key.
# ARGV: id, response, ttl in ms, now in s, per_tenant.
_PUT = """
redis.call('SET', KEYS[2], ARGV[2], 'PX', ARGV[3])
redis.call('ZADD', KEYS[1], ARGV[4], ARGV[1])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', tonumber(ARGV[4]) - tonumber(ARGV[3]) / 1000)
local over = redis.call('ZCARD', KEYS[1]) - tonumber(ARGV[5])
if over > 0 then
  local old = redis.call('ZPOPMIN', KEYS[1], over)
  for i = 1, #old, 2 do redis.call('DEL', KEYS[1] .. ':' .. old[i]) end
end
redis.call('PEXPIRE', KEYS[1], ARGV[3])
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
    async def put(self, owner: str, stored: Stored) -> None: ...
    async def get(self, owner: str, response_id: str) -> Stored | None: ...
    async def delete(self, owner: str, response_id: str) -> bool: ...


class MemoryResponses:
    def __init__(self, ttl_s: float, per_tenant: int) -> None:
        self._ttl_s = ttl_s
        self._per_tenant = per_tenant
        self._kept: dict[str, OrderedDict[str, tuple[float, bytes]]] = {}

    async def put(self, owner: str, stored: Stored) -> None:
        kept = self._kept.setdefault(owner, OrderedDict())
        kept[stored.id] = (time.monotonic() + self._ttl_s, stored.to_json())
        while len(kept) > self._per_tenant:
            kept.popitem(last=False)

    async def get(self, owner: str, response_id: str) -> Stored | None:
        kept = self._kept.get(owner)
        found = kept.get(response_id) if kept is not None else None
        if found is None or found[0] < time.monotonic():
            return None
        return Stored.from_json(found[1])

    async def delete(self, owner: str, response_id: str) -> bool:
        kept = self._kept.get(owner)
        return kept is not None and kept.pop(response_id, None) is not None


class RedisResponses:
    """Keys, one hash tag per tenant:

    {prefix}:responses:{owner}:{id}   string   the stored response, with its TTL
    {prefix}:responses:{owner}        zset     its ids by when they were stored
    """

    def __init__(
        self,
        clients: RedisFactory,
        prefix: str,
        ttl_s: float,
        per_tenant: int,
        timeout_s: float = 2.0,
    ) -> None:
        self._redis = clients.client("responses", timeout_s)
        self._prefix = prefix
        self._ttl_ms = int(ttl_s * 1000)
        self._per_tenant = per_tenant
        self._put = self._redis.register_script(_PUT)

    def _index(self, owner: str) -> str:
        return f"{{{self._prefix}:responses:{owner}}}"

    async def put(self, owner: str, stored: Stored) -> None:
        index = self._index(owner)
        keys = [index, f"{index}:{stored.id}"]
        args: list[bytes | str | float] = [
            stored.id,
            stored.to_json(),
            self._ttl_ms,
            time.time(),
            self._per_tenant,
        ]
        try:
            await self._put(keys=keys, args=args)
        except RedisError as exc:
            raise _unavailable() from exc

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
                deleted, _ = await pipe.execute()
        except RedisError as exc:
            raise _unavailable() from exc
        return bool(deleted)

    async def close(self) -> None:
        await self._redis.aclose()


def _unavailable() -> StateUnavailable:
    return StateUnavailable("The response store is unreachable.", retry_after=1)
