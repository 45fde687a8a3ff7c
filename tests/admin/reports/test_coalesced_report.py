"""Requests answered by an identical request's upstream call in the cache report: counted
apart, neither hits nor misses, their tokens and cost saved."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime

import pytest

from gateway.admin.reports import ReportQuery
from gateway.admin.reports.cache_report import cache_report
from gateway.events import RequestEvent
from gateway.settings import Price

NOW = datetime(2026, 1, 31, 12, 0, tzinfo=UTC)


def test_coalesced_requests_are_counted_apart_and_their_tokens_saved() -> None:
    at = NOW.timestamp() - 60
    saved = {"saved_tokens": 30, "saved_prompt_tokens": 10, "saved_completion_tokens": 20}
    events = [
        RequestEvent(
            ts=at,
            request_id="r1",
            tenant="t",
            model="echo",
            backend="fake",
            status=200,
            latency_ms=900.0,
            cache="miss",
            namespace="ns1",
        ),
        RequestEvent(
            ts=at,
            request_id="r2",
            tenant="t",
            model="echo",
            backend="fake",
            status=200,
            latency_ms=880.0,
            cache="coalesced",
            namespace="ns1",
            **saved,
        ),
        RequestEvent(
            ts=at,
            request_id="r3",
            tenant="t",
            model="echo",
            backend="fake",
            status=200,
            latency_ms=870.0,
            cache="coalesced",
            namespace="ns1",
            **saved,
        ),
        RequestEvent(
            ts=at,
            request_id="r4",
            tenant="t",
            model="echo",
            backend="fake",
            status=200,
            latency_ms=2.0,
            cache="exact",
            namespace="ns1",
            **saved,
        ),
    ]
    pricing = {"echo": Price(input_per_1m_tokens=1.0, output_per_1m_tokens=4.0)}
    query = ReportQuery.parse("1h", now=NOW)
    report = cache_report([dataclasses.asdict(e) for e in events], query, pricing)
    totals = report["totals"]
    assert (totals["requests"], totals["lookups"], totals["hits"]) == (4, 2, 1)
    assert (totals["misses"], totals["coalesced"]) == (1, 2)
    assert totals["hit_rate"] == 0.5
    assert totals["saved_tokens"] == 90
    assert totals["saved_cost_usd"] == pytest.approx(3 * 90e-6)
    assert report["latency_ms"]["hit"]["count"] == 1  # a follower's wait is no hit's latency
