"""Report events when their store goes away: lines lost are counted and logged once per
kind of error, requests are unaffected, and closing surfaces programming errors."""

from __future__ import annotations

import logging
import re
import time
from pathlib import Path

import httpx
import pytest
from redis.exceptions import ConnectionError as RedisConnectionError

from bench.fake_upstream import on_demand_backend
from bench.processes import OPERATOR, RedisServer
from gateway.events import EventLog, JsonLinesEvents
from tests.conftest import GatewayFactory, hash_of

KEY = "sk-test-events-0123456789abcdef"
LOST = re.compile(r'gateway_events_dropped_total\{kind="(\w+)",reason="(\w+)"\} (\S+)')


def dropped(gateway_url: str) -> dict[tuple[str, str], float]:
    text = httpx.get(gateway_url + "/metrics", headers=OPERATOR).text
    return {(kind, reason): float(n) for kind, reason, n in LOST.findall(text)}


def test_events_lost_while_redis_is_gone_are_counted_and_logged_once(
    gateway_factory: GatewayFactory, tmp_path: Path
) -> None:
    redis_server = RedisServer(tmp_path)
    try:
        gw = gateway_factory(
            {
                "state": {"url": redis_server.url, "prefix": "events"},
                "cache": {"enabled": False},
                "backends": [on_demand_backend(["echo"], {"last_replica_idle_s": 300})],
                "tenants": [{"name": "t", "keys": [{"sha256": hash_of(KEY)}]}],
            }
        )
        redis_server.kill()
        url, headers = gw.base_url + "/chat/completions", {"Authorization": f"Bearer {KEY}"}
        body = {"model": "echo", "messages": [{"role": "user", "content": "hi"}]}
        for _ in range(3):  # the first waits for a cold start, whose record is lost too
            assert httpx.post(url, json=body, headers=headers, timeout=60).status_code == 200
        deadline = time.monotonic() + 10
        while not _all_counted(lost := dropped(gw.url)) and time.monotonic() < deadline:
            time.sleep(0.2)  # events are written in batches, every 0.5 s
        assert lost.get(("requests", "store_unavailable"), 0) >= 3, lost
        assert lost.get(("cold_starts", "store_unavailable")) == 1, lost
        assert lost.get(("scale", "store_unavailable"), 0) >= 1, lost  # zero, then warm
    finally:
        redis_server.kill()
    log = (tmp_path / f"gateway-{gw.port}.log").read_text()
    for kind in ("requests", "cold_starts", "scale"):
        assert log.count(f"{kind} events lost") == 1, log


def _all_counted(lost: dict[tuple[str, str], float]) -> bool:
    return lost.get(("requests", "store_unavailable"), 0) >= 3 and len(lost) >= 3


class ClosingFails(JsonLinesEvents):
    def __init__(self, path: Path, error: Exception) -> None:
        super().__init__(path)
        self.error = error

    async def close(self) -> None:
        raise self.error


async def test_closing_suppresses_a_lost_connection_only(tmp_path: Path) -> None:
    gone = EventLog(ClosingFails(tmp_path / "a.jsonl", RedisConnectionError("gone")))
    await gone.close()
    broken = EventLog(ClosingFails(tmp_path / "b.jsonl", AttributeError("a bug")))
    with pytest.raises(AttributeError, match="a bug"):
        await broken.close()


async def test_a_full_buffer_is_counted_and_logged_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    lost: list[tuple[str, str, int]] = []
    log = EventLog(
        JsonLinesEvents(tmp_path / "requests.jsonl"),
        max_buffer=2,
        on_drop=lambda kind, reason, n: lost.append((kind, reason, n)),
        kind="requests",
    )
    with caplog.at_level(logging.WARNING, "gateway.events"):
        for i in range(5):
            log.record({"i": i})
    assert lost == [("requests", "buffer_full", 1)] * 3 and log.dropped == 3
    assert caplog.text.count("requests events lost") == 1
    await log.close()
    assert len((tmp_path / "requests.jsonl").read_text().splitlines()) == 2
