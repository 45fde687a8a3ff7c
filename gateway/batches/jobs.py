"""The Batch API's operations, for one tenant at a time: create a job over an uploaded
file, read one (with its live request counts), list them, ask for a cancel.

A job is created `validating`; the runner (gateway/batches/runner.py) takes it from there.
A tenant sees only its own jobs: another's answers 404, exactly as a missing one does.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, cast

from pydantic import BaseModel, ConfigDict, StrictStr, ValidationError

from gateway.batches.errors import BatchNotCancellable, BatchNotFound
from gateway.batches.files import Files
from gateway.batches.lines import ENDPOINTS
from gateway.batches.models import CANCELLABLE, BatchJob, Endpoint, batch_object, new_id
from gateway.batches.store import BatchStore
from gateway.errors import BadRequest
from gateway.openai_errors import bad_request, json_object
from gateway.settings import BatchSettings

_UNITS = {"s": 1, "m": 60, "h": 3600}
MAX_METADATA = 16  # OpenAI's bounds on metadata: pairs, key and value lengths
MAX_KEY, MAX_VALUE = 64, 512


class BatchCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")
    input_file_id: StrictStr
    endpoint: StrictStr
    completion_window: StrictStr
    metadata: dict[StrictStr, StrictStr] | None = None
    # Accepted and ignored: a job's outputs expire after `batches.file_ttl_s`.
    output_expires_after: dict[str, Any] | None = None


class Jobs:
    def __init__(
        self,
        store: BatchStore,
        files: Files,
        settings: BatchSettings,
        wake: Callable[[str], None],  # the runner: this job was created or cancelled
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._store = store
        self._files = files
        self._settings = settings
        self._wake = wake
        self._clock = clock

    async def create(self, tenant: str, raw: bytes) -> dict[str, Any]:
        asked = _parse(raw)
        window_s = self._window_s(asked.completion_window)
        endpoint = _endpoint(asked.endpoint)
        _check_metadata(asked.metadata)
        source = await self._files.own(tenant, asked.input_file_id)
        if source.purpose != "batch":
            raise BadRequest(
                f"The file {source.id} was not uploaded with purpose 'batch'.",
                param="input_file_id",
            )
        created = self._clock()
        now = int(created)
        job = BatchJob(
            id=new_id("batch_"),
            tenant=tenant,
            input_file_id=source.id,
            endpoint=endpoint,
            completion_window=asked.completion_window,
            created_at=now,
            created=created,
            expires_at=now + window_s,
            total=source.lines,
            metadata=asked.metadata,
            model=source.model,
            # Reserved now, so that a job finishing twice (a crash) writes the same files.
            output_file_id=new_id("file-"),
            error_file_id=new_id("file-"),
        )
        await self._store.put_job(job)
        self._wake(job.id)
        return await self.view(job)

    async def own(self, tenant: str, batch_id: str) -> BatchJob:
        job = await self._store.get_job(batch_id)
        if job is None or job.tenant != tenant:
            raise BatchNotFound(f"No batch found with id '{batch_id}'.", param="batch_id")
        return job

    async def get(self, tenant: str, batch_id: str) -> dict[str, Any]:
        return await self.view(await self.own(tenant, batch_id))

    async def listing(self, tenant: str) -> list[BatchJob]:
        """The tenant's jobs, newest first."""
        return await self._store.list_jobs(tenant)

    async def cancel(self, tenant: str, batch_id: str) -> dict[str, Any]:
        job = await self.own(tenant, batch_id)
        if job.status in CANCELLABLE:
            await self._store.request_cancel(job.id, int(self._clock()))
            self._wake(job.id)
        elif job.status != "cancelled":
            raise BatchNotCancellable(
                f"Cannot cancel a batch with status '{job.status}'.", param="batch_id"
            )
        return await self.view(job)

    async def view(self, job: BatchJob) -> dict[str, Any]:
        """OpenAI's Batch object, with the live counts of a job that runs."""
        live = None if job.over else await self._store.counts(job.id, job.total)
        return batch_object(job, live, await self._store.cancel_requested(job.id))

    def _window_s(self, window: str) -> int:
        if window not in self._settings.completion_windows:
            allowed = ", ".join(self._settings.completion_windows)
            raise BadRequest(
                f"completion_window must be one of: {allowed}.", param="completion_window"
            )
        return int(window[:-1]) * _UNITS[window[-1]]


def _parse(raw: bytes) -> BatchCreate:
    fields = json_object(raw)
    try:
        return BatchCreate.model_validate(fields)
    except ValidationError as exc:
        raise bad_request(exc, fields) from exc


def _endpoint(asked: str) -> Endpoint:
    if asked not in ENDPOINTS:
        allowed = ", ".join(ENDPOINTS)
        raise BadRequest(f"endpoint must be one of {allowed}.", param="endpoint")
    return cast(Endpoint, asked)


def _check_metadata(metadata: dict[str, str] | None) -> None:
    if metadata is None:
        return
    if len(metadata) > MAX_METADATA:
        raise BadRequest(f"metadata has more than {MAX_METADATA} pairs.", param="metadata")
    for key, value in metadata.items():
        if len(key) > MAX_KEY or len(value) > MAX_VALUE:
            raise BadRequest(
                f"metadata keys are at most {MAX_KEY} characters, values {MAX_VALUE}.",
                param=f"metadata.{key[:MAX_KEY]}",
            )
