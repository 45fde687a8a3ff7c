"""The Files API's operations, for one tenant at a time: upload a batch input (checked line
by line before it is kept, within the tenant's file count and storage), read a record or
the bytes, list, delete. Files expire (`expires_at`): an expired one is deleted when its
tenant next lists or reads its files, and answers 404 meanwhile.

A tenant sees only its own files: another's answers 404, exactly as a missing one does.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import BinaryIO

import anyio.to_thread

from gateway.batches.blobs import BlobStore
from gateway.batches.errors import (
    FileInUse,
    FileLimitExceeded,
    FileNotFound,
    InvalidBatchFile,
    StorageLimitExceeded,
)
from gateway.batches.lines import InputLine, parse_rows
from gateway.batches.models import FileRecord, new_id
from gateway.batches.store import BatchStore
from gateway.errors import GatewayError
from gateway.settings import BatchSettings
from gateway.tenancy.tenants import Catalog, tenant_name


class Files:
    def __init__(
        self,
        store: BatchStore,
        blobs: BlobStore,
        catalog: Catalog,
        settings: BatchSettings,
        max_body_bytes: int,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._store = store
        self._blobs = blobs
        self._catalog = catalog
        self._settings = settings
        self._max_body = max_body_bytes
        self._clock = clock

    @property
    def settings(self) -> BatchSettings:
        return self._settings

    async def upload(
        self, tenant: str, filename: str, file: BinaryIO, expires_after_s: int | None = None
    ) -> FileRecord:
        """A batch input file (`file`, read from its start), kept once every line is a
        request the tenant may send and it fits in what the tenant may keep."""
        size = await anyio.to_thread.run_sync(_size, file)
        await self._check_room(tenant, size)
        limits = (self._settings.max_lines, self._max_body)
        lines = await anyio.to_thread.run_sync(_parse, file, *limits)
        wrong = unroutable(self._catalog, tenant_name(tenant), lines)
        if wrong:
            raise wrong[0]
        models = {line.model for line in lines}
        now = self._clock()
        record = FileRecord(
            id=new_id("file-"),
            tenant=tenant,
            filename=filename,
            bytes=size,
            created_at=int(now),
            created=now,
            purpose="batch",
            lines=len(lines),
            model=models.pop() if len(models) == 1 else None,
            expires_at=int(now) + (expires_after_s or self._settings.file_ttl_s),
        )
        # Bytes first: a record never names bytes that are not there.
        await self._blobs.put(record.id, await anyio.to_thread.run_sync(_read, file))
        await self._store.put_file(record)
        return record

    async def own(self, tenant: str, file_id: str) -> FileRecord:
        record = await self._store.get_file(file_id)
        if record is None or record.tenant != tenant or await self._gone([record]):
            raise FileNotFound(f"No such File object: {file_id}", param="file_id")
        return self._dated(record)

    async def content(self, tenant: str, file_id: str) -> bytes:
        record = await self.own(tenant, file_id)
        return await self._blobs.get(record.id)

    async def listing(self, tenant: str, purpose: str | None) -> list[FileRecord]:
        """The tenant's files, newest first (those expired are deleted on the way)."""
        files = await self._store.list_files(tenant)
        expired = await self._gone(files)
        live = (self._dated(f) for f in files if f.id not in expired)
        return [f for f in live if purpose is None or f.purpose == purpose]

    async def delete(self, tenant: str, file_id: str) -> None:
        record = await self.own(tenant, file_id)
        for job in await self._store.list_jobs(tenant):
            if job.input_file_id == record.id and not job.over:
                raise FileInUse(
                    f"The file {file_id} is the input of batch {job.id}, which is not over.",
                    param="file_id",
                )
        await self._drop(record.id)

    async def _check_room(self, tenant: str, size: int) -> None:
        """Refuses an upload past the tenant's file count or storage (checked before each
        upload: uploads at once, `max_concurrent_uploads`, may pass it by their own)."""
        files = await self.listing(tenant, None)
        most = self._settings.max_files_per_tenant
        if len(files) >= most:
            raise FileLimitExceeded(
                f"You have {len(files)} files, the most you may keep; delete some first.",
                param="file",
            )
        used, room = sum(f.bytes for f in files), self._settings.max_storage_bytes_per_tenant
        if used + size > room:
            raise StorageLimitExceeded(
                f"Your files hold {used} bytes; this one ({size}) would take them past "
                f"{room}. Delete some first.",
                param="file",
            )

    def _dated(self, record: FileRecord) -> FileRecord:
        """The record with its expiry: its own, else `file_ttl_s` after its creation (the
        jobs' output files, and files kept before expiry existed)."""
        if record.expires_at is not None:
            return record
        return record.model_copy(
            update={"expires_at": record.created_at + self._settings.file_ttl_s}
        )

    async def _gone(self, records: list[FileRecord]) -> set[str]:
        """The ids of `records` that expired, deleted now (nothing sweeps them otherwise:
        they go when their tenant next looks)."""
        now = self._clock()
        expired = {r.id for r in records if (self._dated(r).expires_at or 0) <= now}
        for file_id in sorted(expired):
            await self._drop(file_id)
        return expired

    async def _drop(self, file_id: str) -> None:
        await self._store.drop_file(file_id)
        await self._blobs.delete(file_id)


def _size(file: BinaryIO) -> int:
    return file.seek(0, os.SEEK_END)


def _parse(file: BinaryIO, max_lines: int, max_body_bytes: int) -> list[InputLine]:
    file.seek(0)
    return parse_rows(file, max_lines, max_body_bytes)


def _read(file: BinaryIO) -> bytes:
    file.seek(0)
    return file.read()


def unroutable(catalog: Catalog, tenant: str, lines: list[InputLine]) -> list[InvalidBatchFile]:
    """For each model the tenant may not use (or that no backend serves), the error of the
    first line naming it."""
    first: dict[str, int] = {}
    for line in lines:
        first.setdefault(line.model, line.index)
    errors = []
    for model, index in first.items():
        try:
            catalog.route(tenant, model, 0)  # its lines are routed by size as they run
        except GatewayError as exc:
            number = index + 1
            message = f"Line {number}: {exc.message}"
            errors.append(InvalidBatchFile(message, line=number, param="body.model", code=exc.code))
    return errors
