"""`BatchStore` on Redis, shared by every gateway replica.

Keys (one hash tag, so a Redis Cluster keeps them on one slot):

    {prefix}:batch:files              hash  file id -> record
    {prefix}:batch:files:of:{tenant}  set   the tenant's file ids (listing reads no other's)
    {prefix}:batch:jobs               hash  job id -> job
    {prefix}:batch:active             set   jobs not over yet
    {prefix}:batch:cancels            hash  job id -> when a cancel was asked
    {prefix}:batch:results:{job}      hash  line index -> result (HSETNX: the first wins)
    {prefix}:batch:counts:{job}       hash  completed / failed, counted with the result
    {prefix}:batch:lease:{job}        the replica running the job, with a TTL it renews

Results stay in Redis only while the job runs: the output and error files take them when
it ends, and then they are forgotten (so Redis holds at most the running jobs' answers).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from redis.exceptions import RedisError

from common.redis_client import RedisFactory
from gateway.batches.errors import BatchStoreError
from gateway.batches.models import BatchJob, Counts, FileRecord, LineResult

T = TypeVar("T")

# The result and its count in one step: a line is counted exactly when it is recorded.
_RECORD = """
if redis.call('HSETNX', KEYS[1], ARGV[1], ARGV[2]) == 1 then
  redis.call('HINCRBY', KEYS[2], ARGV[3], 1)
  return 1
end
return 0
"""
_CLAIM = """
local owner = redis.call('GET', KEYS[1])
if owner == false or owner == ARGV[1] then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
  return 1
end
return 0
"""
_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""


class RedisBatchStore:
    def __init__(self, clients: RedisFactory, prefix: str, timeout_s: float = 5.0) -> None:
        self._redis = clients.client("batches", timeout_s)
        self._base = f"{{{prefix}}}:batch"
        self._record = self._redis.register_script(_RECORD)
        self._claim = self._redis.register_script(_CLAIM)
        self._release = self._redis.register_script(_RELEASE)

    async def put_file(self, record: FileRecord) -> None:
        async def write() -> None:
            async with self._redis.pipeline(transaction=True) as pipe:
                pipe.hset(self._key("files"), record.id, _dump(record))
                pipe.sadd(self._key("files", "of", record.tenant), record.id)
                await pipe.execute()

        await _call(write)

    async def get_file(self, file_id: str) -> FileRecord | None:
        data = await _call(lambda: self._redis.hget(self._key("files"), file_id))
        return None if data is None else FileRecord.model_validate_json(data)

    async def list_files(self, tenant: str) -> list[FileRecord]:
        ids = await _call(lambda: self._redis.smembers(self._key("files", "of", tenant)))
        if not ids:
            return []
        rows = await _call(lambda: self._redis.hmget(self._key("files"), sorted(ids)))
        files = (FileRecord.model_validate_json(row) for row in rows if row is not None)
        mine = (f for f in files if f.tenant == tenant)
        return sorted(mine, key=FileRecord.order, reverse=True)

    async def drop_file(self, file_id: str) -> None:
        record = await self.get_file(file_id)

        async def drop() -> None:
            async with self._redis.pipeline(transaction=True) as pipe:
                pipe.hdel(self._key("files"), file_id)
                if record is not None:
                    pipe.srem(self._key("files", "of", record.tenant), file_id)
                await pipe.execute()

        await _call(drop)

    async def put_job(self, job: BatchJob) -> None:
        async def write() -> None:
            async with self._redis.pipeline(transaction=True) as pipe:
                pipe.hset(self._key("jobs"), job.id, _dump(job))
                if job.over:
                    pipe.srem(self._key("active"), job.id)
                else:
                    pipe.sadd(self._key("active"), job.id)
                await pipe.execute()

        await _call(write)

    async def get_job(self, job_id: str) -> BatchJob | None:
        data = await _call(lambda: self._redis.hget(self._key("jobs"), job_id))
        return None if data is None else BatchJob.model_validate_json(data)

    async def list_jobs(self, tenant: str | None = None) -> list[BatchJob]:
        rows = await _call(lambda: self._redis.hvals(self._key("jobs")))
        jobs = (BatchJob.model_validate_json(row) for row in rows)
        mine = (j for j in jobs if tenant is None or j.tenant == tenant)
        return sorted(mine, key=BatchJob.order, reverse=True)

    async def active_jobs(self) -> list[str]:
        ids = await _call(lambda: self._redis.smembers(self._key("active")))
        jobs = [await self.get_job(_text(i)) for i in ids]
        return [j.id for j in sorted((j for j in jobs if j), key=BatchJob.order)]

    async def request_cancel(self, job_id: str, at: int) -> None:
        await _call(lambda: self._redis.hsetnx(self._key("cancels"), job_id, at))

    async def cancel_requested(self, job_id: str) -> int | None:
        at = await _call(lambda: self._redis.hget(self._key("cancels"), job_id))
        return None if at is None else int(at)

    async def record(self, job_id: str, result: LineResult) -> bool:
        keys = [self._key("results", job_id), self._key("counts", job_id)]
        outcome = "completed" if result.succeeded else "failed"
        args: list[str | int] = [result.index, _dump(result), outcome]
        return bool(await _call(lambda: self._record(keys=keys, args=args)))

    async def done(self, job_id: str) -> set[int]:
        indexes = await _call(lambda: self._redis.hkeys(self._key("results", job_id)))
        return {int(i) for i in indexes}

    async def counts(self, job_id: str, total: int) -> Counts:
        row = await _call(lambda: self._redis.hgetall(self._key("counts", job_id)))
        fields = {_text(k): int(v) for k, v in row.items()}
        return Counts(total=total, **fields)

    async def results(self, job_id: str) -> list[LineResult]:
        rows = await _call(lambda: self._redis.hvals(self._key("results", job_id)))
        return sorted((LineResult.model_validate_json(r) for r in rows), key=lambda r: r.index)

    async def forget_results(self, job_id: str) -> None:
        keys = (self._key("results", job_id), self._key("counts", job_id))
        await _call(lambda: self._redis.delete(*keys))

    async def claim(self, job_id: str, owner: str, ttl_s: float) -> bool:
        key, ttl_ms = self._key("lease", job_id), int(ttl_s * 1000)
        return bool(await _call(lambda: self._claim(keys=[key], args=[owner, ttl_ms])))

    async def release(self, job_id: str, owner: str) -> None:
        await _call(lambda: self._release(keys=[self._key("lease", job_id)], args=[owner]))

    async def close(self) -> None:
        await self._redis.aclose()

    def _key(self, *parts: str) -> str:
        return ":".join((self._base, *parts))


async def _call(command: Callable[[], Awaitable[T]]) -> T:
    try:
        return await command()
    except RedisError as exc:
        raise BatchStoreError(f"redis: {type(exc).__name__}") from exc


def _dump(record: Any) -> str:
    return str(record.model_dump_json())


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value
