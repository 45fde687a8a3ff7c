"""A client that leaves before its answer: under the gateway's own server the protocol
cancels the request (tests/traffic/test_traffic_e2e.py); under any other ASGI server a
watcher task does. This one serves the app with plain uvicorn, in process."""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Iterator
from pathlib import Path

import httpx
import orjson
import pytest
import uvicorn

from bench.processes import OPERATOR, OPERATOR_KEY, free_port, start_fake_upstream
from gateway.app import create_app
from gateway.config_file import parse_settings
from gateway.tenancy.operators import OPERATOR_KEY_ENV
from tests.conftest import fake_backend

KEY = "sk-test-plain-uvicorn-0123456789"


@pytest.fixture
def upstream(tmp_path: Path) -> Iterator[str]:
    server, base_url = start_fake_upstream(tmp_path)
    yield base_url
    server.stop()


async def test_a_client_that_leaves_is_cancelled_under_another_server(
    upstream: str, tmp_path: Path
) -> None:
    config = {
        "state": {"url": "memory", "path": str(tmp_path / "state.json")},
        "cache": {"enabled": False},
        "backends": [fake_backend(upstream)],
        "tenants": [{"name": "a", "keys": [{"sha256": hashlib.sha256(KEY.encode()).hexdigest()}]}],
    }
    settings = parse_settings(orjson.dumps(config).decode(), "test.yaml", {})
    port = free_port()
    # In process, the app reads no environment: it is given the test operator key.
    app = create_app(settings, {OPERATOR_KEY_ENV: OPERATOR_KEY})
    server = uvicorn.Server(uvicorn.Config(app, port=port, log_level="warning", lifespan="on"))
    serving = asyncio.create_task(server.serve())
    base = f"http://127.0.0.1:{port}"
    try:
        while not server.started:
            await asyncio.sleep(0.05)
        body = {"model": "slow", "x_delay": 2, "messages": [{"role": "user", "content": "hi"}]}
        async with httpx.AsyncClient(timeout=0.5) as client:
            with pytest.raises(httpx.ReadTimeout):
                await client.post(
                    base + "/v1/chat/completions",
                    json=body,
                    headers={"Authorization": f"Bearer {KEY}"},
                )
            await asyncio.sleep(0.5)
            text = (await client.get(base + "/metrics", headers=OPERATOR)).text
        # Recorded at once (the upstream would answer only after 2 s): it was cancelled.
        assert 'gateway_requests_total{model="slow",status="499",tenant="a"} 1.0' in text
    finally:
        server.should_exit = True
        await serving
