"""The Files API's operations, for one tenant at a time: upload a batch input (checked line
by line before it is kept), read a record or the bytes, list, delete.

A tenant sees only its own files: another's answers 404, exactly as a missing one does.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import anyio.to_thread

from gateway.batches.blobs import BlobStore
from gateway.batches.errors import FileInUse, FileNotFound, InvalidBatchFile
from gateway.batches.lines import InputLine, parse_lines
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

    async def upload(self, tenant: str, filename: str, data: bytes) -> FileRecord:
        """A batch input file, kept once every line is a request the tenant may send."""
        limits = (self._settings.max_lines, self._max_body)
        lines = await anyio.to_thread.run_sync(parse_lines, data, *limits)
        wrong = unroutable(self._catalog, tenant_name(tenant), lines)
        if wrong:
            raise wrong[0]
        models = {line.model for line in lines}
        now = self._clock()
        record = FileRecord(
            id=new_id("file-"),
            tenant=tenant,
            filename=filename,
            bytes=len(data),
            created_at=int(now),
            created=now,
            purpose="batch",
            lines=len(lines),
            model=models.pop() if len(models) == 1 else None,
        )
        # Bytes first: a record never names bytes that are not there.
        await self._blobs.put(record.id, data)
        await self._store.put_file(record)
        return record

    async def own(self, tenant: str, file_id: str) -> FileRecord:
        record = await self._store.get_file(file_id)
        if record is None or record.tenant != tenant:
            raise FileNotFound(f"No such File object: {file_id}", param="file_id")
        return record

    async def content(self, tenant: str, file_id: str) -> bytes:
        record = await self.own(tenant, file_id)
        return await self._blobs.get(record.id)

    async def listing(self, tenant: str, purpose: str | None) -> list[FileRecord]:
        """The tenant's files, newest first."""
        files = await self._store.list_files(tenant)
        return [f for f in files if purpose is None or f.purpose == purpose]

    async def delete(self, tenant: str, file_id: str) -> None:
        record = await self.own(tenant, file_id)
        for job in await self._store.list_jobs(tenant):
            if job.input_file_id == record.id and not job.over:
                raise FileInUse(
                    f"The file {file_id} is the input of batch {job.id}, which is not over.",
                    param="file_id",
                )
        await self._store.drop_file(record.id)
        await self._blobs.delete(record.id)


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
