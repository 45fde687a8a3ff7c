"""Traffic control through real gateway processes: quotas shared over a real Redis, the
fair queue, load shedding, retry budget and circuit breaker, against the fake upstream."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from bench.processes import OPERATOR, Gateway, RedisServer, start_fake_upstream
from tests.conftest import GatewayFactory, fake_backend, hash_of

KEYS = {name: f"sk-test-{name}-0123456789" for name in ("a", "b", "inter", "batch")}


def tenant(name: str, **extra: Any) -> dict[str, Any]:
    return {"name": name, "keys": [{"sha256": hash_of(KEYS[name])}], **extra}


def config(
    upstream: str,
    tenants: list[dict[str, Any]],
    state: dict[str, Any],
    backend: dict[str, Any] | None = None,
    **traffic: Any,
) -> dict[str, Any]:
    return {
        "state": state,
        "cache": {"enabled": False},
        "backends": [fake_backend(upstream, **(backend or {}))],
        "tenants": tenants,
        "traffic": traffic,
    }


def chat(model: str = "echo", **extra: Any) -> dict[str, Any]:
    return {"model": model, "messages": [{"role": "user", "content": "hi"}], **extra}


async def post(
    client: httpx.AsyncClient,
    gw: Gateway,
    key: str,
    body: dict[str, Any],
    headers: dict[str, str] | None = None,
) -> httpx.Response:
    return await client.post(
        gw.base_url + "/chat/completions",
        json=body,
        headers={"Authorization": f"Bearer {KEYS[key]}", **(headers or {})},
    )


@pytest.fixture
def upstream(tmp_path: Path) -> Iterator[str]:
    """A fake upstream of the test's own, so its request counts are the test's alone."""
    server, base_url = start_fake_upstream(tmp_path)
    yield base_url
    server.stop()


def stats(upstream: str) -> dict[str, int]:
    return dict(httpx.get(upstream.removesuffix("/v1") + "/_stats").json())


def test_two_replicas_share_one_request_limit(
    gateway_factory: GatewayFactory, upstream: str, redis_url: str, redis_prefix: str
) -> None:
    cfg = config(
        upstream,
        [tenant("a", quotas={"requests_per_minute": 20})],
        {"url": redis_url, "prefix": redis_prefix},
    )
    replicas = [gateway_factory(cfg), gateway_factory(cfg)]

    async def flood() -> list[httpx.Response]:
        async with httpx.AsyncClient(timeout=10) as client:
            return await asyncio.gather(
                *(post(client, replicas[i % 2], "a", chat()) for i in range(60))
            )

    answers = asyncio.run(flood())
    ok = [r for r in answers if r.status_code == 200]
    refused = [r for r in answers if r.status_code == 429]
    assert len(ok) + len(refused) == 60
    assert 18 <= len(ok) <= 20, f"{len(ok)} admitted against a shared limit of 20"
    sample = refused[0]
    assert sample.json()["error"]["code"] == "rate_limit_exceeded"
    assert int(sample.headers["retry-after"]) >= 1
    assert sample.headers["x-ratelimit-limit-requests"] == "20"
    assert sample.headers["x-ratelimit-remaining-requests"] == "0"
    assert ok[0].headers["x-ratelimit-limit-requests"] == "20"


def test_tokens_are_reserved_then_reconciled_from_real_usage(
    gateway_factory: GatewayFactory, upstream: str, redis_url: str, redis_prefix: str
) -> None:
    # Each request reserves ~300 tokens (max_tokens) but uses ~8: without refunds only 3
    # would fit in 1000 tokens per minute; with them, all 10 sequential ones do.
    cfg = config(
        upstream,
        [tenant("a", quotas={"tokens_per_minute": 1000})],
        {"url": redis_url, "prefix": redis_prefix},
    )
    gw = gateway_factory(cfg)

    async def run() -> list[httpx.Response]:
        async with httpx.AsyncClient(timeout=10) as client:
            return [await post(client, gw, "a", chat(max_tokens=300)) for _ in range(10)]

    answers = asyncio.run(run())
    assert [r.status_code for r in answers] == [200] * 10
    remaining = [int(r.headers["x-ratelimit-remaining-tokens"]) for r in answers]
    assert min(remaining) > 1000 - 300 - 10 * 20, remaining

    async def concurrent() -> list[httpx.Response]:
        async with httpx.AsyncClient(timeout=10) as client:
            slow = chat("slow", max_tokens=300, x_delay=0.5)
            return await asyncio.gather(*(post(client, gw, "a", slow) for _ in range(8)))

    # Concurrent requests cannot overrun the limit: reservations count before answers.
    codes = [r.status_code for r in asyncio.run(concurrent())]
    assert codes.count(200) <= 3 and codes.count(429) >= 5, codes


def test_flooding_tenant_does_not_delay_another_beyond_its_share(
    gateway_factory: GatewayFactory, upstream: str, tmp_path: Path
) -> None:
    cfg = config(
        upstream,
        [tenant("a"), tenant("b")],
        {"url": "memory", "path": str(tmp_path / "s.json")},
        backend={"max_concurrency": 2, "concurrency": {"mode": "fixed"}},
    )
    gw = gateway_factory(cfg)
    slow = chat("slow", x_delay=0.2, max_tokens=10)

    async def run() -> tuple[float, list[float]]:
        async with httpx.AsyncClient(timeout=30) as client:
            flood_started = time.monotonic()
            flood = [asyncio.create_task(post(client, gw, "a", slow)) for _ in range(24)]
            await asyncio.sleep(0.3)
            b_times = []
            for _ in range(3):
                started = time.monotonic()
                assert (await post(client, gw, "b", slow)).status_code == 200
                b_times.append(time.monotonic() - started)
            await asyncio.gather(*flood)
            return time.monotonic() - flood_started, b_times

    flood_s, b_times = asyncio.run(run())
    # Served FIFO, B's first request would wait behind A's ~22 queued ones: most of the
    # flood's 12 service rounds. Fairly, it waits about one round for a slot, plus its own.
    # Compared with the flood's own duration, so a slow machine slows both alike.
    assert max(b_times) < 0.35 * flood_s, (b_times, flood_s)


def test_interactive_overtakes_batch(
    gateway_factory: GatewayFactory, upstream: str, tmp_path: Path
) -> None:
    cfg = config(
        upstream,
        [tenant("batch", priority="batch"), tenant("inter")],
        {"url": "memory", "path": str(tmp_path / "s.json")},
        backend={"max_concurrency": 1, "concurrency": {"mode": "fixed"}},
    )
    gw = gateway_factory(cfg)
    slow = chat("slow", x_delay=0.15, max_tokens=10)

    async def run() -> tuple[list[float], float]:
        async with httpx.AsyncClient(timeout=30) as client:

            async def timed(key: str) -> float:
                assert (await post(client, gw, key, slow)).status_code == 200
                return time.monotonic()

            batch = [asyncio.create_task(timed("batch")) for _ in range(8)]
            await asyncio.sleep(0.25)
            interactive_done = await timed("inter")
            return list(await asyncio.gather(*batch)), interactive_done

    batch_done, interactive_done = asyncio.run(run())
    later = [t for t in batch_done if t > interactive_done]
    assert len(later) >= 5, "the interactive request waited behind the batch backlog"


def test_request_that_cannot_meet_its_deadline_is_refused_fast(
    gateway_factory: GatewayFactory, upstream: str, tmp_path: Path
) -> None:
    cfg = config(
        upstream,
        [tenant("a")],
        {"url": "memory", "path": str(tmp_path / "s.json")},
        backend={"max_concurrency": 1, "concurrency": {"mode": "fixed"}},
    )
    gw = gateway_factory(cfg)
    slow = chat("slow", x_delay=0.5, max_tokens=10)

    async def run() -> list[tuple[int, float, str | None]]:
        async with httpx.AsyncClient(timeout=30) as client:
            # Teach the scheduler the service time, then queue several in front.
            await post(client, gw, "a", slow)
            backlog = [asyncio.create_task(post(client, gw, "a", slow)) for _ in range(4)]
            await asyncio.sleep(0.1)
            results = []
            for _ in range(2):
                started = time.monotonic()
                answer = await post(client, gw, "a", slow, {"x-request-timeout": "1.2"})
                results.append(
                    (
                        answer.status_code,
                        time.monotonic() - started,
                        answer.headers.get("retry-after"),
                    )
                )
            await asyncio.gather(*backlog)
            return results

    for status, seconds, retry_after in asyncio.run(run()):
        assert status == 503 and seconds < 0.5 and retry_after is not None and int(retry_after) >= 1


def test_failing_upstream_is_not_hammered_by_retries(
    gateway_factory: GatewayFactory, upstream: str, tmp_path: Path
) -> None:
    cfg = config(
        upstream,
        [tenant("a")],
        {"url": "memory", "path": str(tmp_path / "s.json")},
        breaker=False,  # here the budget alone must hold attempts down
    )
    gw = gateway_factory(cfg)

    async def run() -> list[int]:
        async with httpx.AsyncClient(timeout=30) as client:
            answers = await asyncio.gather(
                *(post(client, gw, "a", chat("always-503")) for _ in range(100))
            )
            return [a.status_code for a in answers]

    assert set(asyncio.run(run())) == {503}
    attempts = stats(upstream)["model:always-503"]
    # Budget: 0.2 retries per request, plus a reserve of a few per second.
    assert attempts / 100 <= 1.35, f"{attempts} upstream attempts for 100 requests"
    assert attempts > 100, "no retry at all"


def test_breaker_opens_then_closes(
    gateway_factory: GatewayFactory, upstream: str, tmp_path: Path
) -> None:
    cfg = config(
        upstream,
        [tenant("a")],
        {"url": "memory", "path": str(tmp_path / "s.json")},
        breaker_failures=3,
        breaker_open_s=0.5,
    )
    gw = gateway_factory(cfg)
    headers = {"Authorization": f"Bearer {KEYS['a']}"}
    url = gw.base_url + "/chat/completions"
    for _ in range(3):
        assert httpx.post(url, json=chat("error-500"), headers=headers).status_code == 502
    before = stats(upstream)["requests"]
    fast = httpx.post(url, json=chat("echo"), headers=headers)
    assert fast.status_code == 503 and fast.json()["error"]["code"] == "backend_unavailable"
    assert stats(upstream)["requests"] == before, "an open breaker still sent upstream"
    text = httpx.get(gw.url + "/metrics", headers=OPERATOR).text
    assert 'gateway_breaker_open{backend="fake"} 1.0' in text
    assert 'gateway_breaker_opened_total{backend="fake"} 1.0' in text
    assert 'gateway_breaker_rejected_total{backend="fake"} 1.0' in text
    time.sleep(0.6)
    assert httpx.post(url, json=chat("echo"), headers=headers).status_code == 200
    assert httpx.post(url, json=chat("echo"), headers=headers).status_code == 200
    assert (
        'gateway_breaker_open{backend="fake"} 0.0'
        in httpx.get(gw.url + "/metrics", headers=OPERATOR).text
    )


def test_redis_stopped_mid_test_falls_back_to_local_share(
    gateway_factory: GatewayFactory, upstream: str, tmp_path: Path
) -> None:
    redis_server = RedisServer(tmp_path)
    try:
        cfg = config(
            upstream,
            [tenant("a", quotas={"requests_per_minute": 10})],
            {"url": redis_server.url, "prefix": "fallback"},
        )
        gw = gateway_factory(cfg)
        headers = {"Authorization": f"Bearer {KEYS['a']}"}
        url = gw.base_url + "/chat/completions"
        assert httpx.post(url, json=chat(), headers=headers).status_code == 200
        redis_server.kill()
        codes = [
            httpx.post(url, json=chat(), headers=headers, timeout=10).status_code for _ in range(15)
        ]
        # One live replica last seen: the local share is the whole limit (10 per minute).
        assert codes.count(200) == 10 and codes.count(429) == 5, codes
        text = httpx.get(gw.url + "/metrics", headers=OPERATOR).text
        assert 'gateway_quota_fallbacks_total{decision="local_allowed"}' in text
        assert 'gateway_quota_fallbacks_total{decision="local_refused"}' in text
    finally:
        redis_server.kill()


def test_client_that_leaves_while_queued_is_never_sent_upstream(
    gateway_factory: GatewayFactory, upstream: str, tmp_path: Path
) -> None:
    cfg = config(
        upstream,
        [tenant("a")],
        {"url": "memory", "path": str(tmp_path / "s.json")},
        backend={"max_concurrency": 1, "concurrency": {"mode": "fixed"}},
    )
    gw = gateway_factory(cfg)
    slow = chat("slow", x_delay=1.0, max_tokens=10)

    async def run() -> None:
        async with httpx.AsyncClient(timeout=30) as client:
            first = asyncio.create_task(post(client, gw, "a", slow))
            await asyncio.sleep(0.2)
            async with httpx.AsyncClient(timeout=0.3) as impatient:
                with pytest.raises(httpx.ReadTimeout):
                    await post(impatient, gw, "a", slow)
            assert (await first).status_code == 200
            await asyncio.sleep(0.3)

    asyncio.run(run())
    assert stats(upstream)["model:slow"] == 1, "the abandoned request still went upstream"
    text = httpx.get(gw.url + "/metrics", headers=OPERATOR).text
    assert 'gateway_requests_total{model="slow",status="499",tenant="a"} 1.0' in text
