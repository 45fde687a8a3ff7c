"""The request path's defects found in review, each driven through a real gateway (or the
real part): retries from config, the deadline and queue-wait label of the class a
request actually runs in, retired replicas' clients closed."""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Iterator
from pathlib import Path

import anyio
import httpx
import pytest

from backends.http import HttpTimeouts, HttpUpstream
from backends.providers.replicas import Replica
from bench.processes import OPERATOR, start_fake_upstream
from gateway.traffic.breaker import BreakerCounts, CircuitBreaker
from gateway.traffic.capacity import fixed_capacity
from gateway.traffic.replica_set import ReplicaSet
from tests.conftest import GatewayFactory, fake_backend, hash_of

KEY = "sk-test-path-batch-0123456789"


@pytest.fixture
def upstream(tmp_path: Path) -> Iterator[str]:
    server, base_url = start_fake_upstream(tmp_path)
    yield base_url
    server.stop()


def upstream_count(upstream: str, model: str) -> int:
    stats = httpx.get(upstream.removesuffix("/v1") + "/_stats").json()
    return int(stats.get(f"model:{model}", 0))


def config(upstream: str, backend: dict[str, object], **traffic: object) -> dict[str, object]:
    return {
        "state": {"url": "memory"},
        "cache": {"enabled": False},
        "backends": [fake_backend(upstream, **backend)],
        "tenants": [
            {
                "name": "nightly",
                "priority": "batch",
                "priority_header": True,
                "keys": [{"sha256": hash_of(KEY)}],
            }
        ],
        "traffic": traffic,
    }


def post(base_url: str, body: dict[str, object], **headers: str) -> httpx.Response:
    return httpx.post(
        base_url + "/chat/completions",
        json=body,
        headers={"Authorization": f"Bearer {KEY}", **headers},
        timeout=30,
    )


def chat(model: str, **extra: object) -> dict[str, object]:
    return {"model": model, "messages": [{"role": "user", "content": "hi"}], **extra}


@pytest.mark.parametrize(
    ("backend_retry", "traffic_retry", "attempts"),
    [(None, None, 3), (None, {"max_attempts": 2}, 2), ({"max_attempts": 1}, {}, 1)],
)
def test_retry_attempts_come_from_the_config(
    gateway_factory: GatewayFactory,
    upstream: str,
    backend_retry: dict[str, object] | None,
    traffic_retry: dict[str, object] | None,
    attempts: int,
) -> None:
    backend = {"retry": backend_retry} if backend_retry is not None else {}
    traffic: dict[str, object] = {"breaker": False}
    if traffic_retry is not None:
        traffic["retry"] = {"base_s": 0.01, **traffic_retry}
    gw = gateway_factory(config(upstream, backend, **traffic))
    answer = post(gw.base_url, chat("always-503"))
    assert answer.status_code == 503
    assert upstream_count(upstream, "always-503") == attempts


def queue_waits(base_url: str) -> dict[str, float]:
    text = httpx.get(base_url.removesuffix("/v1") + "/metrics", headers=OPERATOR).text
    pattern = r'^gateway_queue_wait_seconds_count\{backend="fake",class="(\w+)"\} (\S+)$'
    return {m[1]: float(m[2]) for m in re.finditer(pattern, text, re.M)}


def test_the_class_a_request_runs_in_sets_its_deadline_and_its_queue_wait_label(
    gateway_factory: GatewayFactory, upstream: str
) -> None:
    """A batch tenant's request sent as interactive (x-priority) gets the interactive
    deadline (1 s here, not batch's 30 s), and its queue wait is observed once, as
    interactive."""
    traffic = {"deadline_s": {"interactive": 1.5, "batch": 30}}
    gw = gateway_factory(config(upstream, {}, **traffic))
    started = time.monotonic()
    late = post(gw.base_url, chat("slow", x_delay=5), **{"x-priority": "interactive"})
    assert late.status_code == 504, late.text
    assert late.json()["error"]["code"] == "deadline_exceeded"
    assert time.monotonic() - started < 4
    assert post(gw.base_url, chat("echo")).status_code == 200  # batch, its default
    assert post(gw.base_url, chat("echo"), **{"x-priority": "interactive"}).status_code == 200
    assert queue_waits(gw.base_url) == {"interactive": 2.0, "batch": 1.0}


async def test_a_retired_replicas_client_is_closed_once_its_requests_are_done(
    tmp_path: Path,
) -> None:
    def client(url: str) -> HttpUpstream:
        return HttpUpstream(url, None, HttpTimeouts(1.0, 5.0, None), 4)

    async with anyio.create_task_group() as tasks:
        replicas = ReplicaSet(client, lambda counts: None, tasks, lambda: fixed_capacity(4))
        replicas.update([Replica("a", "http://127.0.0.1:9/v1"), Replica("b", "http://x/v1")])
        a, b = replicas.handles["a"], replicas.handles["b"]
        a.in_flight = 1  # a request is still reading from `a`
        replicas.update([])  # both leave the ready set (scaled down)
        await asyncio.sleep(0)
        assert (replicas.retired, a.upstream.closed, b.upstream.closed) == (1, False, True)
        a.done()
        await asyncio.sleep(0)
        assert (replicas.retired, a.upstream.closed, a.served) == (0, True, 1)


async def test_requests_turned_away_by_open_circuits_are_counted_once_all_are_open() -> None:
    def client(url: str) -> HttpUpstream:
        return HttpUpstream(url, None, HttpTimeouts(1.0, 5.0, None), 4)

    def breaker(counts: BreakerCounts) -> CircuitBreaker:
        return CircuitBreaker(failure_threshold=1, open_s=60, counts=counts)

    async with anyio.create_task_group() as tasks:
        replicas = ReplicaSet(client, breaker, tasks, lambda: fixed_capacity(4))
        replicas.update([Replica("a", "http://127.0.0.1:9/v1"), Replica("b", "http://x/v1")])
        a, b = replicas.handles["a"], replicas.handles["b"]
        assert a.breaker is not None and b.breaker is not None
        a.breaker.record(False)
        assert replicas.pick(set()) is b  # routed around the open circuit: not turned away
        b.breaker.record(False)
        assert replicas.pick(set()) is None
        replicas.update([])  # the counts outlive the replicas
        assert (replicas.breakers.opened, replicas.breakers.rejected) == (2, 1)
