"""A report over many events keeps the gateway's event loop free: decoding, filtering and
aggregating run in a worker thread, while the loop goes on serving requests."""

from __future__ import annotations

import asyncio
import gc
import time
from collections.abc import AsyncIterator, Callable, Iterable
from contextlib import asynccontextmanager

import anyio.to_thread
import orjson
import pytest

from common.redis_client import RedisFactory
from gateway.admin.reports import ReportKind, ReportQuery, build_report
from gateway.events import COLD_STARTS, REQUESTS, RequestEvent, jsonl_path
from gateway.settings import Settings

# As many as keep the test within a few seconds on two cores (a million events: 350 MB of
# JSON lines). Built on the loop, these reports held it 1.7-3.2 s (cache) and 0.6-1.1 s
# (cold starts, which read the request events too); in a worker thread, 20-100 ms, with
# three CPU burners beside the test as well as without (2026-12-04).
EVENTS = 150_000
STARTS = 1_000
MAX_LAG_SHARE = 0.25  # of the time the same report holds the loop when built on it
TIERS = ("exact", "semantic", "miss", "none", "bypass")


class LoopLag:
    """How late the loop wakes a task that sleeps 10 ms at a time: its worst overshoot."""

    def __init__(self) -> None:
        self.worst_s = 0.0

    async def watch(self) -> None:
        while True:
            asked = time.perf_counter()
            await asyncio.sleep(0.01)
            self.worst_s = max(self.worst_s, time.perf_counter() - asked - 0.01)


@asynccontextmanager
async def watched() -> AsyncIterator[LoopLag]:
    lag = LoopLag()
    task = asyncio.get_running_loop().create_task(lag.watch())
    await asyncio.sleep(0.02)
    try:
        yield lag
        await asyncio.sleep(0.02)  # the watcher sees the last stretch the loop was held
    finally:
        task.cancel()


def request(i: int, at: float) -> RequestEvent:
    backend = "fake" if i % 2 else "big"
    return RequestEvent(
        ts=at,
        request_id=f"r{i}",
        tenant=f"t{i % 7}",
        model="echo",
        backend=backend,
        status=200,
        latency_ms=12.5,
        cache=TIERS[i % len(TIERS)],
        namespace=f"ns{i % 50}",
        similarity=0.9,
        prompt_tokens=10,
        completion_tokens=20,
        cold_wait_ms=5.0 if i % 100 == 0 else None,
    )


def cold_start(i: int, at: float) -> dict[str, object]:
    events = [("request_arrived", 0.0), ("process_started", 0.5), ("ready", 9.0)]
    return {
        "id": f"big-{i}",
        "backend": "big",
        "model": "llama",
        "trigger": "request",
        "outcome": "served",
        "events": [{"event": name, "at": at + s} for name, s in [*events, ("first_byte", 9.1)]],
        "phases": {"engine_weights": 1.0},
        "begun_at": at,
    }


def lines(items: Iterable[object]) -> bytes:
    return b"".join(orjson.dumps(item) + b"\n" for item in items)


@pytest.fixture(scope="module")
def settings(tmp_path_factory: pytest.TempPathFactory) -> Settings:
    """A memory state whose files hold the last 50 minutes' events (the Redis streams'
    pages are decoded and freed by the same code, `Fetched.records` and `release`)."""
    folder = tmp_path_factory.mktemp("many-events")
    settings = Settings.model_validate(
        {
            "state": {"url": "memory", "path": str(folder / "state.json")},
            "backends": [
                {"name": "fake", "base_url": "http://127.0.0.1:9/v1", "models": ["echo"]},
                {"name": "big", "kind": "process", "command": ["true"], "models": ["llama"]},
            ],
        }
    )
    first = time.time() - 3000
    requests = [request(i, first + i * 3000 / EVENTS) for i in range(EVENTS)]
    jsonl_path(settings, REQUESTS).write_bytes(lines(requests))
    starts = [cold_start(i, first + i * 3000 / STARTS) for i in range(STARTS)]
    jsonl_path(settings, COLD_STARTS).write_bytes(lines(starts))
    del requests, starts
    gc.collect()  # their garbage is not the report's: a full collection of it holds the loop
    return settings


@pytest.mark.parametrize("kind", ["cache", "cold_start"])
async def test_a_report_over_many_events_leaves_the_loop_free(
    kind: ReportKind, settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Against the same report built on the loop, in the same run (this machine's speed
    varies 2x, and another process on its two cores stretches any absolute figure)."""
    query = ReportQuery.parse("1h")
    async with watched() as lag:
        report = await build_report(kind, settings, RedisFactory(settings.state.url), query)
    if kind == "cache":
        assert report["totals"]["requests"] == EVENTS
    else:
        [big] = [row for row in report["models"] if row["backend"] == "big"]
        assert (big["cold_starts"], big["waited_requests"]) == (STARTS, EVENTS // 100)

    async def on_the_loop(work: Callable[..., object], *args: object) -> object:
        return work(*args)

    monkeypatch.setattr(anyio.to_thread, "run_sync", on_the_loop)
    async with watched() as held:
        assert await build_report(kind, settings, RedisFactory(settings.state.url), query) == report
    worst, baseline = lag.worst_s * 1000, held.worst_s * 1000
    assert worst < baseline * MAX_LAG_SHARE, f"the loop was held {worst:.0f} ms ({baseline:.0f})"
