"""Where files' records, jobs and each line's result are kept: `BatchStore`.

`FileBatchStore` goes with the `memory` state store (one gateway process): a folder next to
the state file, mirrored in memory,

    batches/files/{file_id}.json          a file's record
    batches/jobs/{job_id}.json            a job, written whole (atomically: temp + rename)
    batches/jobs/{job_id}.cancel          a cancel was asked (its time)
    batches/jobs/{job_id}.results.jsonl   one line per recorded result, appended

`RedisBatchStore` (store_redis.py) goes with Redis and is shared by replicas.

A line's result is recorded in one write (an appended line here, one HSETNX there), and
that write is what makes it done: a line whose result is recorded is never sent again. A
crash between the upstream's answer and that write loses the answer, and the line is sent
again when the job resumes: at most the lines in flight at the crash (README "Batch
jobs"). A result line cut by a crash is dropped when the store opens. The appends are not
fsynced: they survive the process, not the machine (as the state file itself).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Protocol, TypeVar

import anyio.to_thread
import orjson
from pydantic import BaseModel, ValidationError

from common.redis_client import RedisFactory
from gateway.batches.errors import BatchStoreError
from gateway.batches.models import BatchJob, Counts, FileRecord, LineResult
from gateway.private_files import private_dir, write_private
from gateway.settings import Settings

T = TypeVar("T")
M = TypeVar("M", bound=BaseModel)


class BatchStore(Protocol):
    async def put_file(self, record: FileRecord) -> None: ...
    async def get_file(self, file_id: str) -> FileRecord | None: ...
    async def list_files(self, tenant: str) -> list[FileRecord]: ...
    async def drop_file(self, file_id: str) -> None: ...
    async def put_job(self, job: BatchJob) -> None: ...
    async def get_job(self, job_id: str) -> BatchJob | None: ...
    async def list_jobs(self, tenant: str | None = None) -> list[BatchJob]: ...  # newest first
    async def active_jobs(self) -> list[str]: ...  # not over yet, oldest first
    async def request_cancel(self, job_id: str, at: int) -> None: ...
    async def cancel_requested(self, job_id: str) -> int | None: ...
    async def record(self, job_id: str, result: LineResult) -> bool: ...  # False: had one
    async def done(self, job_id: str) -> set[int]: ...  # indexes of recorded lines
    async def counts(self, job_id: str, total: int) -> Counts: ...
    async def results(self, job_id: str) -> list[LineResult]: ...
    async def forget_results(self, job_id: str) -> None: ...  # once the files hold them
    async def claim(self, job_id: str, owner: str, ttl_s: float) -> bool: ...  # or renew
    async def release(self, job_id: str, owner: str) -> None: ...
    async def close(self) -> None: ...


class FileBatchStore:
    """One process's store: everything in memory, written through to `root`."""

    def __init__(self, root: Path) -> None:
        self._files_dir = root / "files"
        self._jobs_dir = root / "jobs"
        self._files: dict[str, FileRecord] = {}
        # tenant -> its files' ids: a listing reads no other tenant's records
        self._files_of: dict[str, set[str]] = {}
        self._jobs: dict[str, BatchJob] = {}
        self._cancels: dict[str, int] = {}
        self._done: dict[str, dict[int, bool]] = {}  # job -> line -> succeeded

    @classmethod
    async def open(cls, root: Path, *, repair: bool = True) -> FileBatchStore:
        store = cls(root)
        await _io(store._load, repair)
        return store

    async def put_file(self, record: FileRecord) -> None:
        await _io(_write_json, self._files_dir / f"{record.id}.json", record)
        self._files[record.id] = record
        self._files_of.setdefault(record.tenant, set()).add(record.id)

    async def get_file(self, file_id: str) -> FileRecord | None:
        return self._files.get(file_id)

    async def list_files(self, tenant: str) -> list[FileRecord]:
        mine = (self._files[i] for i in self._files_of.get(tenant, ()))
        return sorted(mine, key=FileRecord.order, reverse=True)

    async def drop_file(self, file_id: str) -> None:
        await _io(_unlink, self._files_dir / f"{file_id}.json")
        record = self._files.pop(file_id, None)
        if record is not None:
            self._files_of.get(record.tenant, set()).discard(file_id)

    async def put_job(self, job: BatchJob) -> None:
        await _io(_write_json, self._jobs_dir / f"{job.id}.json", job)
        self._jobs[job.id] = job

    async def get_job(self, job_id: str) -> BatchJob | None:
        return self._jobs.get(job_id)

    async def list_jobs(self, tenant: str | None = None) -> list[BatchJob]:
        jobs = (j for j in self._jobs.values() if tenant is None or j.tenant == tenant)
        return sorted(jobs, key=BatchJob.order, reverse=True)

    async def active_jobs(self) -> list[str]:
        active = sorted((j for j in self._jobs.values() if not j.over), key=BatchJob.order)
        return [j.id for j in active]

    async def request_cancel(self, job_id: str, at: int) -> None:
        if job_id in self._cancels:
            return
        path = self._jobs_dir / f"{job_id}.cancel"
        await _io(write_private, path, str(at).encode())
        self._cancels[job_id] = at

    async def cancel_requested(self, job_id: str) -> int | None:
        return self._cancels.get(job_id)

    async def record(self, job_id: str, result: LineResult) -> bool:
        done = self._done.setdefault(job_id, {})
        if result.index in done:
            return False
        await _io(_append, self._results_path(job_id), result.model_dump_json().encode())
        done[result.index] = result.succeeded
        return True

    async def done(self, job_id: str) -> set[int]:
        return set(self._done.get(job_id, {}))

    async def counts(self, job_id: str, total: int) -> Counts:
        outcomes = self._done.get(job_id, {}).values()
        completed = sum(outcomes)
        return Counts(total=total, completed=completed, failed=len(outcomes) - completed)

    async def results(self, job_id: str) -> list[LineResult]:
        return await _io(_read_results, self._results_path(job_id))

    async def forget_results(self, job_id: str) -> None:
        await _io(_unlink, self._results_path(job_id))
        self._done.pop(job_id, None)

    async def claim(self, job_id: str, owner: str, ttl_s: float) -> bool:
        return True  # one process: the runner itself never runs a job twice at once

    async def release(self, job_id: str, owner: str) -> None:
        return None

    async def close(self) -> None:
        return None

    def _results_path(self, job_id: str) -> Path:
        return self._jobs_dir / f"{job_id}.results.jsonl"

    def _load(self, repair: bool) -> None:
        private_dir(self._files_dir)
        private_dir(self._jobs_dir)
        self._files = _read_all(self._files_dir, FileRecord)
        for record in self._files.values():
            self._files_of.setdefault(record.tenant, set()).add(record.id)
        self._jobs = _read_all(self._jobs_dir, BatchJob)
        for path in self._jobs_dir.glob("*.cancel"):
            self._cancels[path.stem] = int(path.read_text() or 0)
        for job in self._jobs.values():
            if not job.over:
                results = _read_results(self._results_path(job.id), repair)
                self._done[job.id] = {r.index: r.succeeded for r in results}


async def _io(work: Callable[..., T], *args: object) -> T:
    """File work off the event loop; OS errors as the store's."""
    try:
        return await anyio.to_thread.run_sync(work, *args)
    except OSError as exc:
        raise BatchStoreError(f"batch store: {type(exc).__name__}: {exc}") from exc


def _write_json(path: Path, record: BaseModel) -> None:
    tmp = path.with_suffix(f".tmp.{os.getpid()}")
    write_private(tmp, record.model_dump_json().encode())
    os.replace(tmp, path)


def _append(path: Path, line: bytes) -> None:
    # One write of the whole line, on a descriptor opened for appending: it lands whole or,
    # if the process dies inside it, cut (and dropped when the store opens: `_read_results`).
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, line + b"\n")
    finally:
        os.close(fd)


def _unlink(path: Path) -> None:
    path.unlink(missing_ok=True)


def _read_all(folder: Path, model: type[M]) -> dict[str, M]:
    records: dict[str, M] = {}
    for path in folder.glob("*.json"):
        try:
            records[path.stem] = model.model_validate_json(path.read_bytes())
        except ValidationError as exc:
            raise BatchStoreError(f"batch store: {path} is not a {model.__name__}") from exc
    return records


def _read_results(path: Path, repair: bool = False) -> list[LineResult]:
    """The recorded results; with `repair`, a last line cut by a crash is cut off the file
    too, so that the next append starts a line of its own."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return []
    complete, _, torn = data.rpartition(b"\n")
    if torn and repair:
        os.truncate(path, len(complete) + 1 if complete else 0)
    results: dict[int, LineResult] = {}
    for row in complete.split(b"\n") if complete else []:
        result = LineResult.model_validate(orjson.loads(row))
        results.setdefault(result.index, result)  # the first recorded is the one that counts
    return sorted(results.values(), key=lambda r: r.index)


async def open_store(
    settings: Settings, clients: RedisFactory, *, repair: bool = True
) -> BatchStore:
    """The batch store that goes with the state store: Redis, or a folder next to the state
    file. `repair: False` for readers (the CLI's report), which must not touch a running
    gateway's files."""
    if settings.state.url != "memory":
        from gateway.batches.store_redis import RedisBatchStore

        return RedisBatchStore(clients, settings.state.prefix)
    return await FileBatchStore.open(Path(settings.state.path).parent / "batches", repair=repair)
