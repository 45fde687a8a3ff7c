"""The batch store's contract, on a folder and on a real Redis: a line's result is recorded
once and counted once, jobs and cancels, leases; and a result line cut by a crash."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from common.redis_client import RedisFactory
from gateway.batches.models import BatchJob, FileRecord, LineResult
from gateway.batches.store import BatchStore, FileBatchStore
from gateway.batches.store_redis import RedisBatchStore


@pytest.fixture(params=["file", "redis"])
async def store(
    request: pytest.FixtureRequest, tmp_path: Path, redis_prefix: str
) -> AsyncIterator[BatchStore]:
    if request.param == "file":
        opened: BatchStore = await FileBatchStore.open(tmp_path)
    else:
        clients = RedisFactory(request.getfixturevalue("redis_url"))
        opened = RedisBatchStore(clients, redis_prefix)
    yield opened
    await opened.close()


def job(job_id: str, tenant: str = "acme", created_at: int = 100, **fields: object) -> BatchJob:
    return BatchJob.model_validate(
        {
            "id": job_id,
            "tenant": tenant,
            "input_file_id": "file-1",
            "endpoint": "/v1/chat/completions",
            "completion_window": "24h",
            "created_at": created_at,
            "expires_at": created_at + 86400,
            "total": 3,
            **fields,
        }
    )


def result(index: int, status: int = 200) -> LineResult:
    return LineResult(
        index=index,
        id=f"batch_req_{index}",
        custom_id=f"c{index}",
        status_code=status,
        request_id=f"req_{index}",
        body={"n": index},
    )


async def test_a_result_is_recorded_and_counted_once(store: BatchStore) -> None:
    assert await store.record("batch_a", result(1))
    assert await store.record("batch_a", result(0, status=502))
    assert not await store.record("batch_a", result(1, status=500))  # the first one stays
    assert await store.done("batch_a") == {0, 1}
    counts = await store.counts("batch_a", 3)
    assert (counts.total, counts.completed, counts.failed) == (3, 1, 1)
    assert [(r.index, r.status_code) for r in await store.results("batch_a")] == [
        (0, 502),
        (1, 200),
    ]
    await store.forget_results("batch_a")
    assert await store.done("batch_a") == set()


async def test_jobs_files_and_cancels(store: BatchStore) -> None:
    await store.put_job(job("batch_old", created_at=100))
    await store.put_job(job("batch_new", created_at=200))
    await store.put_job(job("batch_other", tenant="other", status="completed"))
    assert await store.active_jobs() == ["batch_old", "batch_new"]
    assert [j.id for j in await store.list_jobs("acme")] == ["batch_new", "batch_old"]
    await store.put_job(job("batch_old", status="cancelled"))
    assert await store.active_jobs() == ["batch_new"]
    assert (await store.get_job("batch_old")) == job("batch_old", status="cancelled")
    assert await store.get_job("batch_none") is None

    assert await store.cancel_requested("batch_new") is None
    await store.request_cancel("batch_new", 300)
    await store.request_cancel("batch_new", 400)  # the first time asked is the one kept
    assert await store.cancel_requested("batch_new") == 300

    record = FileRecord(
        id="file-1", tenant="acme", filename="a.jsonl", bytes=3, created_at=1, purpose="batch"
    )
    await store.put_file(record)
    assert await store.get_file("file-1") == record
    assert await store.list_files("acme") == [record] and await store.list_files("other") == []
    await store.drop_file("file-1")
    assert await store.get_file("file-1") is None


async def test_a_lease_is_one_owners_at_a_time(redis_url: str, redis_prefix: str) -> None:
    store = RedisBatchStore(RedisFactory(redis_url), redis_prefix)
    try:
        assert await store.claim("batch_a", "one", 30)
        assert not await store.claim("batch_a", "two", 30)
        assert await store.claim("batch_a", "one", 30)  # renewed
        await store.release("batch_a", "two")  # not its lease: nothing happens
        assert not await store.claim("batch_a", "two", 30)
        await store.release("batch_a", "one")
        assert await store.claim("batch_a", "two", 30)
    finally:
        await store.close()


async def test_a_result_cut_by_a_crash_is_dropped_when_the_store_opens(tmp_path: Path) -> None:
    store = await FileBatchStore.open(tmp_path)
    await store.put_job(job("batch_a"))
    await store.record("batch_a", result(0))
    log = tmp_path / "jobs" / "batch_a.results.jsonl"
    with log.open("ab") as cut:
        cut.write(result(1).model_dump_json().encode()[:20])  # the process died mid-write

    reader = await FileBatchStore.open(tmp_path, repair=False)  # the CLI: reads, never cuts
    assert await reader.done("batch_a") == {0}
    assert not log.read_bytes().endswith(b"\n")

    reopened = await FileBatchStore.open(tmp_path)
    assert await reopened.done("batch_a") == {0}
    assert await reopened.record("batch_a", result(1))  # starts a line of its own
    again = await FileBatchStore.open(tmp_path)
    assert await again.done("batch_a") == {0, 1}
    assert await again.get_job("batch_a") == job("batch_a")
