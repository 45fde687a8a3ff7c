"""The cold-start report from a real scale-to-zero run: the gateway starts the fake upstream
as a `process` backend on the first requests, with state in a real Redis (cold-start
timelines, scale and request events on its streams)."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import httpx
import openai

from bench.fake_upstream import on_demand_backend
from common.redis_client import RedisFactory
from gateway.admin.reports import ReportQuery, build_report
from gateway.config_file import load_settings
from tests.conftest import GatewayFactory, hash_of

KEY = "sk-test-report-cold-0123456789"
WAITERS = 3


def scale_to_zero_config(redis_url: str, prefix: str) -> dict[str, Any]:
    return {
        "state": {"url": redis_url, "prefix": prefix},
        "cache": {"enabled": False},
        "traffic": {"deadline_s": {"interactive": 300}},
        "backends": [on_demand_backend(["echo"], {"last_replica_idle_s": 300})],
        "tenants": [{"name": "t", "keys": [{"sha256": hash_of(KEY)}]}],
    }


async def cold_burst(base_url: str) -> tuple[list[Any], httpx.Response]:
    """WAITERS requests that wait for the start, and one whose deadline (1 s) is shorter
    than the start: dropped at its deadline (no start measured yet, so not refused at once),
    while the backend is at zero."""
    async with (
        openai.AsyncOpenAI(base_url=base_url, api_key=KEY, max_retries=0) as client,
        httpx.AsyncClient(timeout=30) as raw,
    ):
        waiters = [
            client.chat.completions.with_raw_response.create(
                model="echo", messages=[{"role": "user", "content": f"wake up {i}"}]
            )
            for i in range(WAITERS)
        ]
        impatient = raw.post(
            base_url + "/chat/completions",
            headers={"Authorization": f"Bearer {KEY}", "x-request-timeout": "1"},
            json={"model": "echo", "messages": [{"role": "user", "content": "now"}]},
        )
        answers, shed = await asyncio.gather(asyncio.gather(*waiters), impatient)
    return answers, shed


def test_cold_start_report_from_a_real_start(
    gateway_factory: GatewayFactory, redis_url: str, redis_prefix: str, tmp_path: Path
) -> None:
    gw = gateway_factory(scale_to_zero_config(redis_url, redis_prefix))
    answers, shed = asyncio.run(cold_burst(gw.base_url))
    assert all("x-cold-start-ms" in a.headers for a in answers)
    assert shed.status_code == 503, shed.text

    settings = load_settings(gw.config_path, {})
    deadline = time.monotonic() + 15
    while True:  # events and the finished timeline are written in the background
        report = asyncio.run(
            build_report(
                "cold_start", settings, RedisFactory(settings.state.url), ReportQuery.parse("10m")
            )
        )
        [row] = report["models"]
        done = row["cold_starts"] == 1 and row["waited_requests"] == WAITERS
        done = done and row["time_warm_s"] > 0  # the 0 -> 1 scale event is in too
        if done or time.monotonic() > deadline:
            break
        time.sleep(0.1)

    assert (row["model"], row["backend"]) == ("echo", "on-demand")
    assert (row["cold_starts"], row["failed"]) == (1, 0)
    assert (row["waited_requests"], row["shed_while_cold"]) == (WAITERS, 1)
    assert 0 < row["wait_s"]["p50"] <= row["wait_s"]["max"]
    assert 0 < row["ttft_s"]["p50"] == row["ttft_s"]["max"]
    assert 0 < row["start_estimate_s"] < row["ttft_s"]["max"]  # time to ready, learned
    phases = row["phases_s"]
    assert phases["staging"] is None  # no weights to stage for this backend
    assert phases["wake"] is None  # a start, no wake from sleep
    started = [p for p in report["phases"][1:] if p != "wake"]
    assert all(phases[p] is not None and phases[p] >= 0 for p in started)
    assert row["time_at_zero_s"] > 0 and row["time_warm_s"] > 0
    assert row["gpu_hours_saved"] == round(row["time_at_zero_s"] / 3600, 4)
    [start] = report["starts"]
    assert (start["model"], start["outcome"], start["trigger"]) == ("echo", "served", "request")
    # A request's own wait ends at dispatch, before its first byte: it cannot exceed TTFT.
    assert row["wait_s"]["max"] <= start["ttft_s"]

    printed = gw.cli("report", "cold-start", "--since", "10m", "--format", "json")
    assert printed.returncode == 0, printed.stderr
    assert json.loads(printed.stdout)["models"][0]["cold_starts"] == 1
    table = gw.cli("report", "cold-start", "--model", "echo")
    assert table.returncode == 0, table.stderr
    assert "Cold-start report" in table.stdout and "on-demand" not in table.stderr
