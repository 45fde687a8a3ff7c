"""Report parts without a gateway: time ranges, phase and time-at-zero arithmetic, empty
stores, and events and timelines written by the real sinks and read back."""

from __future__ import annotations

import asyncio
import dataclasses
import io
import itertools
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from bench.processes import free_port
from cache.decision import DecisionSettings
from common.redis_client import RedisFactory
from gateway.admin.reports import QueryError, ReportQuery, build_report, parse_time
from gateway.admin.reports.cache_report import cache_report
from gateway.admin.reports.cold_start_report import cold_start_report, phases_of, split_time
from gateway.admin.reports.stats import histogram, percentile
from gateway.admin.reports.table import render
from gateway.events import (
    REQUESTS,
    EventLog,
    JsonLinesEvents,
    RedisStreamEvents,
    RequestEvent,
    ScaleEvent,
    jsonl_path,
)
from gateway.settings import Settings
from warmpool.timeline import ColdStartTimeline, JsonLinesSink

NOW = datetime(2026, 1, 31, 12, 0, tzinfo=UTC)


def settings_for(state: dict[str, Any]) -> Settings:
    return Settings.model_validate(
        {
            "state": state,
            "backends": [
                {"name": "fake", "base_url": "http://127.0.0.1:9/v1", "models": ["echo"]},
                {"name": "big", "kind": "process", "command": ["true"], "models": ["llama"]},
            ],
            "pricing": {"echo": {"input_per_1m_tokens": 1.0, "output_per_1m_tokens": 4.0}},
        }
    )


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("90s", NOW - timedelta(seconds=90)),
        ("1.5h", NOW - timedelta(minutes=90)),
        ("7d", NOW - timedelta(days=7)),
        ("2026-01-30T08:00:00Z", datetime(2026, 1, 30, 8, tzinfo=UTC)),
        ("2026-01-30T08:00:00", datetime(2026, 1, 30, 8, tzinfo=UTC)),  # no zone: UTC
        ("2026-01-30T09:00:00+01:00", datetime(2026, 1, 30, 8, tzinfo=UTC)),
    ],
)
def test_times_are_durations_back_or_iso(text: str, expected: datetime) -> None:
    assert parse_time(text, NOW) == expected


@pytest.mark.parametrize(
    ("since", "until", "bucket"),
    [("yesterday", None, "5m"), ("1h", "2h", "5m"), ("1h", None, "0s"), ("1h", None, "5x")],
)
def test_bad_ranges_are_refused(since: str, until: str | None, bucket: str) -> None:
    with pytest.raises(QueryError):
        ReportQuery.parse(since, until, bucket=bucket, now=NOW)


def test_long_ranges_get_wider_buckets() -> None:
    assert ReportQuery.parse("1h", now=NOW).bucket_width() == 300
    assert ReportQuery.parse("30d", bucket="1m", now=NOW).bucket_width() == 30 * 86400 / 500


def test_percentiles_and_histograms() -> None:
    assert percentile([], 50) is None
    assert [percentile([4.0, 1.0, 3.0, 2.0], p) for p in (1, 50, 95, 100)] == [1, 2, 4, 4]
    # [0, 10), [10, 100), [100, ...): outside values fall into the end buckets
    assert histogram([-1, 0, 9.9, 10, 99, 100, 5000], [0, 10, 100, 1000]) == [3, 2, 2]


def scale(ts: float, ready: int) -> dict[str, Any]:
    return {"ts": ts, "backend": "big", "ready": ready}


@pytest.mark.parametrize(
    ("events", "expected"),
    [
        ([], (0, 0)),  # nothing known
        ([scale(0, 0)], (100, 0)),  # at zero all along (since before the range)
        ([scale(150, 0)], (50, 0)),  # unknown until the first event
        ([scale(0, 0), scale(130, 1), scale(170, 0)], (60, 40)),
        ([scale(50, 1), scale(120, 0), scale(250, 1)], (80, 20)),  # later events ignored
    ],
)
def test_time_at_zero_follows_scale_events(
    events: list[dict[str, Any]], expected: tuple[float, float]
) -> None:
    spent = split_time(events, since=100, until=200)
    assert (spent["zero"], spent["warm"]) == expected and spent["asleep"] == 0


def test_phases_of_a_start_with_staging_and_a_crash() -> None:
    at = itertools.count(100.0, 0.5)
    names = ["request_arrived", "staging_begun", "staging_done", "process_started"]
    names += ["crashed", "process_started", "ready", "first_byte"]
    record = {"events": [{"event": name, "at": next(at)} for name in names]}
    phases, ttft = phases_of(record)
    # process_start runs to the first launch; weight_load from the last one, after the crash
    assert phases == {
        "staging": 0.5,
        "process_start": 0.5,
        "weight_load": 0.5,
        "first_byte": 0.5,
    }
    assert ttft == 3.5


CACHE_KEYS = {
    "kind",
    "range",
    "filters",
    "totals",
    "latency_ms",
    "latency_histogram",
    "over_time",
    "top_namespaces",
    "similarity",
    "by_tenant_model",
}
TOTALS = {"requests", "hits", "exact_hits", "semantic_hits", "misses", "bypassed", "hit_rate"}
TOTALS |= {"exact_hit_rate", "semantic_hit_rate", "saved_tokens", "saved_cost_usd"}
COLD_ROW = {"model", "backend", "cold_starts", "failed", "ttft_s", "phases_s", "wait_s"}
COLD_ROW |= {"waited_requests", "shed_while_cold", "time_at_zero_s", "time_warm_s"}
COLD_ROW |= {"gpu_hours_saved", "start_estimate_s"}


def test_reports_keep_the_keys_the_html_page_and_admin_api_read() -> None:
    settings = settings_for({"url": "memory", "path": "/nonexistent/state.json"})
    query = ReportQuery.parse("1h", now=NOW)
    hit = dataclasses.asdict(event(NOW.timestamp() - 1, "exact", saved_tokens=3))
    cache = cache_report([hit], query, {})
    assert set(cache) >= CACHE_KEYS and set(cache["totals"]) >= TOTALS
    assert set(cache["latency_ms"]["hit"]) == {"count", "p50", "p95", "p99"}
    assert set(cache["latency_histogram"]) == {"edges_ms", "hit", "miss"}
    assert set(cache["over_time"][0]) >= {"start", "requests", "hits", "hit_rate"}
    assert set(cache["similarity"]) == {"edges", "hits", "near_misses"}
    namespace = {"namespace", "tenant", "model", "requests", "hits", "hit_rate", "saved_tokens"}
    assert set(cache["top_namespaces"][0]) >= namespace
    assert set(cache["by_tenant_model"][0]) >= namespace - {"namespace"} | {"saved_cost_usd"}
    record = {"backend": "big", "outcome": "served", "begun_at": NOW.timestamp() - 9}
    record["events"] = [{"event": "ready", "at": NOW.timestamp() - 5}]
    cold = cold_start_report(settings, query, [record], [], [], now=NOW.timestamp())
    assert set(cold) >= {"kind", "range", "filters", "phases", "models", "starts"}
    assert set(cold["models"][0]) >= COLD_ROW
    assert set(cold["starts"][0]) >= {"at", "model", "ttft_s", "phases_s"}
    assert cold["starts"][0]["at"] == "2026-01-31T11:59:51Z"


async def test_empty_stores_give_zeros_and_nulls(redis_url: str, redis_prefix: str) -> None:
    query = ReportQuery.parse("1h")
    for state in ({"url": "memory", "path": "/nonexistent/state.json"}, {"url": redis_url}):
        settings = settings_for({**state, "prefix": redis_prefix})
        cache = await build_report("cache", settings, RedisFactory(settings.state.url), query)
        assert cache["totals"]["requests"] == 0 and cache["totals"]["hit_rate"] is None
        assert cache["latency_ms"]["hit"] == {"count": 0, "p50": None, "p95": None, "p99": None}
        assert sum(b["requests"] for b in cache["over_time"]) == 0
        cold = await build_report("cold_start", settings, RedisFactory(settings.state.url), query)
        [row] = cold["models"]  # the scale-to-zero backend, with nothing recorded yet
        assert (row["model"], row["cold_starts"], row["time_at_zero_s"]) == ("llama", 0, 0)
        assert row["ttft_s"] == {"p50": None, "p95": None, "max": None}
        assert cold["starts"] == []
        out = io.StringIO()
        console = Console(file=out, width=120)
        render(console, cache)
        render(console, cold)
        assert "Cache report" in out.getvalue() and "llama" in out.getvalue()


def event(ts: float, cache: str, **fields: Any) -> RequestEvent:
    return RequestEvent(
        ts=ts,
        request_id="req_1",
        tenant="t",
        model="echo",
        backend="fake",
        status=200,
        latency_ms=5.0,
        cache=cache,
        namespace="ns1",
        **fields,
    )


async def test_events_and_timelines_written_to_files_are_reported(tmp_path: Path) -> None:
    settings = settings_for({"url": "memory", "path": str(tmp_path / "state.json")})
    now = datetime.now(UTC).timestamp()
    requests = EventLog(JsonLinesEvents(jsonl_path(settings, REQUESTS)))
    requests.record(event(now - 30, "miss", prompt_tokens=10, completion_tokens=20))
    saved = {"saved_tokens": 30, "saved_prompt_tokens": 10, "saved_completion_tokens": 20}
    requests.record(event(now - 20, "semantic", similarity=0.93, **saved))
    requests.record(event(now - 10, "normalized", **saved))
    requests.record(event(now - 5, "miss", similarity=0.81))
    waited = RequestEvent(
        ts=now - 60,
        request_id="req_2",
        tenant="t",
        model="llama",
        backend="big",
        status=200,
        latency_ms=9000.0,
        cache="none",
    )
    waited.cold_wait_ms = 8000.0
    requests.record(waited)
    await requests.close()
    scale = EventLog(JsonLinesEvents(jsonl_path(settings, "scale")))
    scale.record(ScaleEvent(now - 100, "big", ["llama"], 0))
    scale.record(ScaleEvent(now - 52, "big", ["llama"], 1))
    await scale.close()
    # begin, request_arrived, process_started, ready, first_byte; begin of a failed start
    clock = iter([now - 61, now - 61, now - 60.5, now - 52, now - 51.9, now - 40])
    walls = iter([now - 61, now - 40])  # read at each begin
    sink = JsonLinesSink(tmp_path / "cold_starts.jsonl")  # where the gateway puts it
    timeline = ColdStartTimeline(sink, clock=lambda: next(clock), wall=lambda: next(walls))
    start = timeline.begin("big", "big", "request")
    for name in ("request_arrived", "process_started", "ready", "first_byte"):
        timeline.mark(start, name)
    failed = timeline.begin("big", "big", "autoscaler")
    timeline.finish(failed, "failed", "no GPU")

    query = ReportQuery.parse("5m")
    cache = await build_report("cache", settings, RedisFactory(settings.state.url), query)
    totals = cache["totals"]
    assert (totals["requests"], totals["hits"], totals["exact_hits"]) == (5, 2, 1)
    assert (totals["semantic_hits"], totals["misses"], totals["not_cacheable"]) == (1, 2, 1)
    assert totals["hit_rate"] == 0.5 and totals["saved_tokens"] == 60
    assert totals["saved_cost_usd"] == pytest.approx(2 * (10 * 1.0 + 20 * 4.0) / 1e6)
    assert sum(cache["similarity"]["hits"]) == sum(cache["similarity"]["near_misses"]) == 1
    assert cache["top_namespaces"][0]["requests"] == 4

    cold = await build_report("cold_start", settings, RedisFactory(settings.state.url), query)
    [row] = cold["models"]
    assert (row["cold_starts"], row["failed"], row["waited_requests"]) == (2, 1, 1)
    assert row["wait_s"] == {"p50": 8.0, "p95": 8.0, "max": 8.0}
    assert row["ttft_s"]["max"] == pytest.approx(9.1, abs=1e-3)
    assert row["phases_s"]["weight_load"] == pytest.approx(8.5, abs=1e-3)
    assert row["time_at_zero_s"] == pytest.approx(48, abs=0.01)
    assert row["time_warm_s"] == pytest.approx(52, abs=1)  # until now
    assert [s["outcome"] for s in cold["starts"]] == ["served", "failed"]

    only = await build_report(
        "cold_start",
        settings,
        RedisFactory(settings.state.url),
        ReportQuery.parse("5m", model="echo"),
    )
    assert [(m["backend"], m["cold_starts"]) for m in only["models"]] == [("fake", 0)]


async def test_a_failing_sink_loses_lines_not_requests() -> None:
    log = EventLog(
        RedisStreamEvents(RedisFactory(f"redis://127.0.0.1:{free_port()}"), "{x}:requests", 10)
    )
    log.record(event(0, "miss"))
    await log.flush()  # nobody listens on that port: the batch is dropped, nothing raised
    assert (log.written, log.dropped) == (0, 1)
    await log.close()


async def test_batches_go_out_when_full_or_on_time(tmp_path: Path) -> None:
    path = tmp_path / "requests.jsonl"
    log = EventLog(JsonLinesEvents(path), flush_s=60, max_batch=3)
    async with asyncio.timeout(10):
        task = asyncio.get_running_loop().create_task(log.run())
        for i in range(3):
            log.record(event(i, "miss"))  # the third fills the batch: written without waiting
        while log.written < 3:
            await asyncio.sleep(0.01)
        task.cancel()
    assert len(path.read_text().splitlines()) == 3


def test_requests_answered_404_are_not_cache_lookups() -> None:
    """A chat request to an embedding-only model looks up the cache, misses, and the model
    server answers 404: no answer could ever have been found for it, so it is counted as
    not cacheable, like a 404 for a model the gateway does not know, and not as a miss."""
    query = ReportQuery.parse("1h", now=NOW)
    at = NOW.timestamp() - 60
    events = [event(at, "exact", saved_tokens=3), event(at, "exact", saved_tokens=3)]
    events.append(event(at, "miss", similarity=0.9))
    for _ in range(2):  # probed and missed (with a near miss), then 404 from the model server
        events.append(
            RequestEvent(
                ts=at,
                request_id="r",
                tenant="t",
                model="embed",
                backend="fake",
                status=404,
                latency_ms=2.0,
                cache="miss",
                namespace="ns2",
                similarity=0.85,
            )
        )
    events.append(
        RequestEvent(
            ts=at,
            request_id="r",
            tenant="t",
            model="nope",
            backend=None,
            status=404,
            latency_ms=1.0,
            cache="none",
        )
    )  # unknown model
    report = cache_report([dataclasses.asdict(e) for e in events], query, {})
    totals = report["totals"]
    assert (totals["requests"], totals["lookups"], totals["misses"]) == (6, 3, 1)
    assert totals["not_cacheable"] == 3
    assert totals["hit_rate"] == round(2 / 3, 4)
    assert report["latency_ms"]["miss"]["count"] == 1
    assert sum(report["latency_histogram"]["miss"]) == 1
    assert sum(report["similarity"]["near_misses"]) == 1  # the 404s' candidates are not misses
    rows = {row["model"]: row for row in report["by_tenant_model"]}
    assert (rows["embed"]["requests"], rows["embed"]["hits"], rows["embed"]["hit_rate"]) == (
        2,
        0,
        None,
    )
    assert rows["echo"]["hit_rate"] == round(2 / 3, 4)
    [embed] = [n for n in report["top_namespaces"] if n["model"] == "embed"]
    assert embed["hit_rate"] is None


def test_similarity_buckets_start_at_the_search_floor() -> None:
    """The semantic tier sees no candidate under its floor: the buckets start there, on
    round steps, and a near miss just above the floor lands in the first one."""
    floor = DecisionSettings().similarity_floor
    query = ReportQuery.parse("1h", now=NOW)
    at = NOW.timestamp() - 60
    events = [event(at, "miss", similarity=floor + 0.001), event(at, "semantic", similarity=0.99)]
    similarity = cache_report([dataclasses.asdict(e) for e in events], query, {})["similarity"]
    edges = similarity["edges"]
    assert edges[0] == pytest.approx(floor) and edges[-1] == 1.0
    steps = {round(b - a, 6) for a, b in itertools.pairwise(edges)}
    assert len(steps) == 1 and steps.pop() in (0.01, 0.02, 0.05)
    assert similarity["near_misses"][0] == 1 and similarity["hits"][-1] == 1


def test_rows_say_whether_their_model_has_a_price() -> None:
    query = ReportQuery.parse("1h", now=NOW)
    at = NOW.timestamp() - 60
    saved = {"saved_tokens": 30, "saved_prompt_tokens": 10, "saved_completion_tokens": 20}
    echo = event(at, "exact", **saved)
    free = dataclasses.replace(echo, model="free")
    pricing = settings_for({"url": "memory", "path": "/nonexistent/state.json"}).pricing
    report = cache_report([dataclasses.asdict(e) for e in (echo, free)], query, pricing)
    # echo: (10 prompt x $1 + 20 completion x $4) per million tokens
    assert report["totals"]["unpriced_models"] == ["free"]
    rows = {
        row["model"]: (row["priced"], row["saved_cost_usd"]) for row in report["by_tenant_model"]
    }
    assert rows == {"echo": (True, pytest.approx(90e-6)), "free": (False, 0.0)}


def test_misses_are_counted_by_why_and_budget_fail_opens_apart() -> None:
    query = ReportQuery.parse("1h", now=NOW)
    at = NOW.timestamp() - 1
    events = [
        dataclasses.asdict(event(at, "miss", miss_reason="budget")),
        dataclasses.asdict(event(at, "miss", miss_reason="budget")),
        dataclasses.asdict(event(at, "miss", miss_reason="store")),
        dataclasses.asdict(event(at, "miss", miss_reason="embedder_busy")),
        dataclasses.asdict(event(at, "miss", miss_reason="no_candidate")),
        dataclasses.asdict(event(at, "miss", miss_reason="refused:verifier")),
        dataclasses.asdict(event(at, "exact", saved_tokens=3)),
    ]
    totals = cache_report(events, query, {})["totals"]
    assert totals["misses"] == 6
    assert totals["miss_reasons"] == {
        "budget": 2,
        "embedder_busy": 1,
        "no_candidate": 1,
        "refused:verifier": 1,
        "store": 1,
    }
    assert (totals["failed_open"], totals["failed_open_budget"]) == (4, 2)


def test_bad_hit_reports_are_counted_apart_from_requests() -> None:
    """A client's report of a bad hit (POST /v1/cache/feedback) is not a request: it counts
    in `reported_bad_hits` where it deleted an entry (200), and nowhere when it found none."""
    query = ReportQuery.parse("1h", now=NOW)
    at = NOW.timestamp() - 1
    reported = [
        RequestEvent(
            ts=at,
            request_id="r",
            tenant="t",
            model="echo",
            backend=None,
            status=200,
            latency_ms=1.0,
            cache="reported",
            namespace="ns1",
        ),
        RequestEvent(
            ts=at,
            request_id="r",
            tenant="t",
            model=None,
            backend=None,
            status=404,
            latency_ms=1.0,
            cache="reported",
        ),
    ]
    events = [dataclasses.asdict(e) for e in (event(at, "exact", saved_tokens=3), *reported)]
    report = cache_report(events, query, {})
    totals = report["totals"]
    assert (totals["requests"], totals["hits"], totals["reported_bad_hits"]) == (1, 1, 1)
    assert totals["hit_rate"] == 1.0 and totals["not_cacheable"] == 0
    assert [n["reported_bad_hits"] for n in report["top_namespaces"]] == [1]
    assert [r["reported_bad_hits"] for r in report["by_tenant_model"]] == [1]
