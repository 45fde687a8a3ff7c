"""Operator reports: cache hit rate and cold starts, as tables, JSON and HTML.

    build_report(kind, settings, query)   the report as a JSON-ready dict (the CLI, the admin
                                          API and the HTML page all start from it)

The data comes from where the gateway writes it (`gateway.events`, the cold-start
timelines): JSON lines next to the state file, or capped Redis streams. Raises
`ReportUnavailable` when the state store cannot be read. A report may go over a million
events: they are decoded, aggregated and freed in a worker thread (only the report comes
back), so that the gateway's event loop goes on serving requests meanwhile.
"""

from __future__ import annotations

from typing import Any, Literal

import anyio.to_thread

from common.redis_client import RedisFactory
from gateway.admin.reports.cache_report import cache_report, selected
from gateway.admin.reports.cold_start_report import cold_start_report, start_time
from gateway.admin.reports.query import QueryError, ReportQuery, parse_duration, parse_time
from gateway.admin.reports.source import (
    EventRange,
    Record,
    ReportUnavailable,
    event_range,
    release,
)
from gateway.events import COLD_STARTS, REQUESTS, SCALE
from gateway.settings import Settings

__all__ = [
    "QueryError",
    "ReportKind",
    "ReportQuery",
    "ReportUnavailable",
    "build_report",
    "parse_duration",
    "parse_time",
]

ReportKind = Literal["cache", "cold_start"]


async def build_report(
    kind: ReportKind, settings: Settings, clients: RedisFactory, query: ReportQuery
) -> dict[str, Any]:
    requests = event_range(settings, clients, REQUESTS, _ts, query.start, query.end)
    if kind == "cache":
        return await anyio.to_thread.run_sync(_cache_report, settings, query, requests)
    # A start is written when it ends, up to minutes after it began: read a wider margin.
    window = query.start, query.end
    starts = event_range(settings, clients, COLD_STARTS, start_time, *window, margin_s=900)
    scale = event_range(settings, clients, SCALE, _ts, None, query.end)
    return await anyio.to_thread.run_sync(
        _cold_start_report, settings, query, starts, scale, requests
    )


def _cache_report(settings: Settings, query: ReportQuery, requests: EventRange) -> dict[str, Any]:
    records = requests.records()
    try:
        return cache_report(selected(records, query), query, settings.pricing)
    finally:
        release(records)


def _cold_start_report(
    settings: Settings,
    query: ReportQuery,
    starts: EventRange,
    scale: EventRange,
    requests: EventRange,
) -> dict[str, Any]:
    lists = starts.records(), scale.records(), requests.records()
    try:
        return cold_start_report(settings, query, *lists)
    finally:
        for records in lists:
            release(records)


def _ts(record: Record) -> float | None:
    ts = record.get("ts")
    return float(ts) if isinstance(ts, int | float) else None
