"""`gateway report batches`: each batch job's progress, read from the batch store.

The jobs shown are those created in the range and every job not over yet (a job created
yesterday that still runs belongs in today's report), for one `--tenant` and/or `--model`
if asked. Per job: status, lines done (completed, failed) of the total, and its times;
totals by status. The CLI prints it as a table (gateway/admin/reports/table.py) or JSON.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from common.redis_client import RedisFactory
from gateway.admin.reports.query import ReportQuery
from gateway.admin.reports.stats import iso
from gateway.batches.errors import BatchStoreError
from gateway.batches.models import STATUSES, BatchJob, Counts
from gateway.batches.store import BatchStore, open_store
from gateway.settings import Settings
from gateway.tenancy.tenants import tenant_name


class BatchReportUnavailable(Exception):
    """The batch store could not be read; the message says why."""


async def batch_report(
    settings: Settings, clients: RedisFactory, query: ReportQuery
) -> dict[str, Any]:
    try:
        store = await open_store(settings, clients, repair=False)  # never touch a running gateway's
    except BatchStoreError as exc:
        raise BatchReportUnavailable(str(exc)) from exc
    try:
        return await _report(store, query)
    except BatchStoreError as exc:
        raise BatchReportUnavailable(str(exc)) from exc
    finally:
        await store.close()


async def _report(store: BatchStore, query: ReportQuery) -> dict[str, Any]:
    jobs = [job for job in await store.list_jobs() if _shown(job, query)]
    rows = [_row(job, job.counts or await store.counts(job.id, job.total)) for job in jobs]
    statuses: Counter[str] = Counter(job.status for job in jobs)
    return {
        "kind": "batches",
        "range": {"since": iso(query.start), "until": iso(query.end)},
        "filters": {"tenant": query.tenant, "model": query.model},
        "totals": {
            "jobs": len(jobs),
            "by_status": {status: statuses[status] for status in STATUSES if statuses[status]},
            "lines": sum(row["total"] for row in rows),
            "completed": sum(row["completed"] for row in rows),
            "failed": sum(row["failed"] for row in rows),
        },
        "jobs": rows,
    }


def _shown(job: BatchJob, query: ReportQuery) -> bool:
    if query.model is not None and job.model != query.model:
        return False
    if query.tenant is not None and tenant_name(job.tenant) != query.tenant:
        return False  # by name: every tenant of that name, deleted ones' too
    return not job.over or query.start <= job.created_at < query.end


def _row(job: BatchJob, counts: Counts) -> dict[str, Any]:
    ended = job.completed_at or job.failed_at or job.expired_at or job.cancelled_at
    done = counts.completed + counts.failed
    return {
        "id": job.id,
        "tenant": tenant_name(job.tenant),
        "status": job.status,
        "endpoint": job.endpoint,
        "model": job.model,
        "total": counts.total,
        "completed": counts.completed,
        "failed": counts.failed,
        "progress": round(done / counts.total, 4) if counts.total else None,
        "created_at": iso(job.created_at),
        "expires_at": iso(job.expires_at),
        "ended_at": iso(ended) if ended is not None else None,
    }
