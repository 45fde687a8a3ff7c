"""A request that outlives its quota lease is still charged what the engine counted (#37,
item 6): real gateway processes over loopback, the fake upstream streaming slowly, the
lease made short (`state.quota_lease_s`), both quota stores (in process, and Redis)."""

from __future__ import annotations

import concurrent.futures
import time
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from bench.processes import Gateway
from tests.conftest import GatewayFactory, hash_of, uncached_config

ADMIN_KEY = "sk-test-admin-leases-5e2c8a4f1b9d7e3a6c0f"
TENANT_KEY = "sk-test-acme-leases-0a9b8c7d6e"
LEASE_S = 1.0
BUDGET = 1_000_000


@pytest.fixture(params=["memory", "redis"])
def gateway(
    request: pytest.FixtureRequest,
    gateway_factory: GatewayFactory,
    fake_upstream: str,
    tmp_path: Path,
    redis_url: str,
    redis_prefix: str,
) -> Gateway:
    state: dict[str, Any] = {"quota_lease_s": LEASE_S}
    if request.param == "memory":
        state |= {"url": "memory", "path": str(tmp_path / "state.json")}
    else:
        state |= {"url": redis_url, "prefix": redis_prefix}
    tenant = {
        "name": "acme",
        "keys": [{"sha256": hash_of(TENANT_KEY)}],
        "quotas": {"tokens_per_day": BUDGET, "max_concurrent": 4},
    }
    config = uncached_config(
        fake_upstream,
        state,
        [tenant],
        admin={"keys": [{"sha256": hash_of(ADMIN_KEY)}]},
        batches={"enabled": False},
    )
    return gateway_factory(config)


def stream(gateway: Gateway, chunk_delay_s: float) -> tuple[dict[str, int], float]:
    """Streams a chat answer, a chunk every `chunk_delay_s`; its usage, and how long it took."""
    body = {
        "model": "echo",
        "messages": [{"role": "user", "content": "one two three four five six"}],
        "max_tokens": 4000,  # reserved at admission: far more than the answer uses
        "stream": True,
        "stream_options": {"include_usage": True},
        "x_chunk_delay": chunk_delay_s,
    }
    headers = {"Authorization": f"Bearer {TENANT_KEY}"}
    usage: dict[str, int] | None = None
    started = time.monotonic()
    with httpx.stream(
        "POST", gateway.base_url + "/chat/completions", json=body, headers=headers, timeout=30
    ) as response:
        assert response.status_code == 200, response.read()
        for line in response.iter_lines():
            if line.startswith("data: {"):
                event = orjson.loads(line[len("data: ") :])
                usage = event.get("usage") or usage
    assert usage is not None, "no usage event in the stream"
    return usage, time.monotonic() - started


def tokens_today(gateway: Gateway) -> dict[str, Any]:
    answer = httpx.get(
        gateway.url + "/admin/tenants/acme/usage",
        headers={"Authorization": f"Bearer {ADMIN_KEY}"},
        timeout=10,
    )
    assert answer.status_code == 200, answer.text
    body: dict[str, Any] = answer.json()
    return body


def test_a_stream_that_outlives_its_lease_is_charged_what_it_used(gateway: Gateway) -> None:
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        slow = pool.submit(stream, gateway, 0.4)
        # Past the slow stream's lease, the tenant's next request is admitted (its
        # admission is where expired leases are swept) and settled while the slow one runs.
        time.sleep(1.5 * LEASE_S)
        quick, _ = stream(gateway, chunk_delay_s=0.0)
        assert not slow.done(), "the slow stream ended too early"
        usage, took_s = slow.result(timeout=30)
    assert took_s > 2 * LEASE_S, f"the stream took {took_s:.1f}s: not past its lease"
    standing = tokens_today(gateway)
    # Not the reservation (prompt + 4000) that admission charged: what the engine counted.
    used = standing["tokens_today"]["used"]
    assert used == usage["total_tokens"] + quick["total_tokens"], standing
    assert standing["tokens_today"]["remaining"] == BUDGET - used
    assert standing["in_flight"] == 0
