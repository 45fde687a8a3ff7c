"""The batch runner: one task in the lifespan's task group that finds jobs not over yet,
claims them (Redis: a lease, so one replica runs a job at a time), and runs each:

    load      the input file, parsed again (gateway/batches/lines.py)
    validate  every line's url is the job's endpoint, every model routable for the tenant
              (`validating` -> `in_progress`, or `failed` with `errors` naming the lines)
    run       the lines through the request path (gateway/batches/execution.py)
    finish    output and error files, the final state (gateway/batches/finalize.py)

A job that stopped half-way (a restart, a lease lost, the store away for a moment) is
picked up again where its recorded results end. At most `max_jobs` run at once here.
It also keeps what `/metrics` shows of batches (`collect`).
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections import Counter
from collections.abc import Iterable

import anyio
import anyio.to_thread
from anyio.abc import TaskGroup
from prometheus_client.core import Metric

from gateway.batches.blobs import BlobStore
from gateway.batches.errors import BatchStoreError, BlobMissing, BlobStoreError, InvalidBatchFile
from gateway.batches.execution import Context, JobRun
from gateway.batches.files import unroutable
from gateway.batches.finalize import Finisher
from gateway.batches.lines import InputLine, parse_lines
from gateway.batches.models import CANCELLABLE, STATUSES, BatchJob, LineError
from gateway.metrics import counter, gauge
from gateway.tenancy.tenants import Catalog, tenant_name

_log = logging.getLogger("gateway.batches")
REST_S = 30.0  # a job whose run failed (store away, a bug) is left alone this long
STATUS_EVERY_S = 5.0  # how often the jobs' statuses are counted for /metrics
MAX_ERRORS = 100  # of a failed job's `errors`


class Runner:
    def __init__(
        self,
        context: Context,
        blobs: BlobStore,
        catalog: Catalog,
        max_body_bytes: int,
    ) -> None:
        self._c = context
        self._store = context.store
        self._blobs = blobs
        self._catalog = catalog
        self._max_body = max_body_bytes
        self._finisher = Finisher(context.store, blobs, context.clock)
        self._running: set[str] = set()
        self._runs: dict[str, JobRun] = {}  # those running their lines here
        self._resting: dict[str, float] = {}  # job -> monotonic time it may run again
        self._wake = anyio.Event()
        self._lines: Counter[str] = Counter()  # line outcomes, since start
        self._statuses: dict[str, int] = {}
        self._counted_at = -STATUS_EVERY_S
        self._store_down = False  # said once when it goes, once when it is back
        context.outcome = self._count

    def wake(self, job_id: str | None = None) -> None:
        """A job was created or cancelled here: look now, not at the next poll."""
        self._counted_at = -STATUS_EVERY_S  # and count the statuses again for /metrics
        run = self._runs.get(job_id) if job_id is not None else None
        if run is not None:
            run.look_now()
        self._wake.set()

    async def run(self) -> None:
        async with anyio.create_task_group() as jobs:
            while True:
                await self._start_jobs(jobs)
                await self._count_statuses()
                with anyio.move_on_after(self._c.settings.poll_s):
                    await self._wake.wait()
                self._wake = anyio.Event()

    def collect(self) -> Iterable[Metric]:
        jobs = gauge("gateway_batch_jobs", "Batch jobs in the store, by status.", ["status"])
        for status in STATUSES:
            jobs.add_metric([status], self._statuses.get(status, 0))
        lines = counter(
            "gateway_batch_lines",
            "Batch lines run here, by outcome (completed, failed, retried: refused for load "
            "and sent again later, interrupted: cut by a shutdown or the job's end).",
            ["outcome"],
        )
        for outcome, count in sorted(self._lines.items()):
            lines.add_metric([outcome], count)
        return [jobs, lines]

    def _count(self, outcome: str) -> None:
        self._lines[outcome] += 1

    async def _start_jobs(self, jobs: TaskGroup) -> None:
        try:
            active = await self._store.active_jobs()
        except BatchStoreError as exc:
            if not self._store_down:
                _log.warning("batch jobs cannot be read, retrying every poll: %s", exc)
            self._store_down = True
            return
        if self._store_down:
            _log.warning("batch jobs can be read again")
            self._store_down = False
        now = time.monotonic()
        for job_id in active:
            if len(self._running) >= self._c.settings.max_jobs:
                return
            if job_id in self._running or self._resting.get(job_id, 0.0) > now:
                continue
            with contextlib.suppress(BatchStoreError):
                if await self._store.claim(job_id, self._c.owner, self._c.settings.lease_s):
                    self._running.add(job_id)
                    jobs.start_soon(self._guarded, job_id)

    async def _count_statuses(self) -> None:
        if time.monotonic() - self._counted_at < STATUS_EVERY_S:
            return
        self._counted_at = time.monotonic()
        statuses: Counter[str] = Counter()
        with contextlib.suppress(BatchStoreError):
            for job in await self._store.list_jobs():
                cancelling = job.status in CANCELLABLE and (
                    await self._store.cancel_requested(job.id) is not None
                )
                statuses["cancelling" if cancelling else job.status] += 1
            self._statuses = dict(statuses)

    async def _guarded(self, job_id: str) -> None:
        try:
            await self._run_job(job_id)
        except (BatchStoreError, BlobStoreError) as exc:
            _log.warning("batch %s stopped, to be resumed: %s", job_id, exc)
            self._resting[job_id] = time.monotonic() + REST_S
        except Exception:  # a bug: logged; the job stays as it was, for a later try
            _log.exception("batch %s failed unexpectedly", job_id)
            self._resting[job_id] = time.monotonic() + REST_S
        finally:
            # Released before it counts as not running here, so that this runner never
            # claims it again while the old lease is being dropped.
            with anyio.CancelScope(shield=True), contextlib.suppress(BatchStoreError):
                await self._store.release(job_id, self._c.owner)
            self._running.discard(job_id)
            self.wake()  # its slot is free, and its status changed

    async def _run_job(self, job_id: str) -> None:
        job = await self._store.get_job(job_id)
        if job is None or job.over:
            return
        lines = await self._load(job)
        if lines is None:
            return
        if job.status == "validating":
            job = await self._validate(job, lines)
            if job.over:
                return
        if job.status == "finalizing":  # a crash while finishing: finish again
            await self._finisher.finish(job, lines, "completed")
            return
        run = self._runs[job_id] = JobRun(job, lines, self._c)
        try:
            ending = await run.run()
        finally:
            del self._runs[job_id]
        if ending != "lost":  # lost: another replica holds the job now
            await self._finisher.finish(job, lines, ending)

    async def _load(self, job: BatchJob) -> list[InputLine] | None:
        """The job's lines; None (and the job failed) if its file is gone or wrong now."""
        limits = (self._c.settings.max_lines, self._max_body)
        try:
            data = await self._blobs.get(job.input_file_id)
            return await anyio.to_thread.run_sync(parse_lines, data, *limits)
        except BlobMissing:
            message = f"The input file {job.input_file_id} is gone."
            await self._finisher.fail(job, [LineError(code="file_not_found", message=message)])
        except InvalidBatchFile as exc:
            await self._finisher.fail(job, [_line_error(exc)])
        return None

    async def _validate(self, job: BatchJob, lines: list[InputLine]) -> BatchJob:
        errors = _endpoint_errors(job, lines) + [
            _line_error(e) for e in unroutable(self._catalog, tenant_name(job.tenant), lines)
        ]
        if errors:
            return await self._finisher.fail(job, errors[:MAX_ERRORS])
        update = {"status": "in_progress", "in_progress_at": int(self._c.clock())}
        started = job.model_copy(update=update)
        await self._store.put_job(started)
        return started


def _line_error(error: InvalidBatchFile) -> LineError:
    code = error.code or "invalid_batch_file"
    return LineError(code=code, message=error.message, param=error.param, line=error.line)


def _endpoint_errors(job: BatchJob, lines: list[InputLine]) -> list[LineError]:
    return [
        LineError(
            code="mismatched_endpoint",
            message=f"The url {line.url} is not the batch's endpoint {job.endpoint}.",
            param="url",
            line=line.index + 1,
        )
        for line in lines
        if line.url != job.endpoint
    ]
