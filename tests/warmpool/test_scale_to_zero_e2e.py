"""Scale to zero through the gateway: `process` backends started by a real request (held,
then answered), idle scale-down, one start for concurrent first requests, crash restart,
and the bundled worker cold-started from weights staged out of moto's S3."""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import time
from pathlib import Path
from typing import Any

import boto3
import httpx
import openai

from backends.worker.tiny_model import write_tiny_chat_model
from bench.fake_upstream import on_demand_backend
from bench.processes import OPERATOR, Gateway
from tests.conftest import GatewayFactory, hash_of

KEY = "sk-test-coldstart-0123456789"


def process_config(tmp_path: Path, backend: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {
        "state": {"url": "memory", "path": str(tmp_path / "state.json")},
        "cache": {"enabled": False},
        "backends": [backend],
        "tenants": [{"name": "t", "keys": [{"sha256": hash_of(KEY)}]}],
        **extra,
    }


def fake_process_backend(**scaling: Any) -> dict[str, Any]:
    """The fake upstream as a model server the gateway starts on demand."""
    quick = {"idle_s": 0.5, "last_replica_idle_s": 1.0, "stable_window_s": 1.0}
    return on_demand_backend(["echo", "slow"], {**quick, **scaling}, max_concurrency=4)


def metric(gw: Gateway, name: str) -> float:
    text = httpx.get(gw.url + "/metrics", headers=OPERATOR).text
    found = re.search(rf"^{re.escape(name)} ([0-9.e+-]+)$", text, re.M)
    return float(found.group(1)) if found else 0.0


READY = 'gateway_backend_ready_replicas{backend="on-demand"}'
STARTS = 'gateway_cold_starts_total{backend="on-demand"}'


def test_first_requests_are_held_then_answered_by_one_new_replica(
    gateway_factory: GatewayFactory, tmp_path: Path
) -> None:
    gw = gateway_factory(process_config(tmp_path, fake_process_backend()))
    assert metric(gw, READY) == 0
    assert (
        httpx.get(gw.url + "/readyz", headers=OPERATOR).status_code == 200
    )  # it can start on demand

    async def burst() -> list[Any]:
        async with openai.AsyncOpenAI(base_url=gw.base_url, api_key=KEY, max_retries=0) as client:
            calls = [
                client.chat.completions.with_raw_response.create(
                    model="echo", messages=[{"role": "user", "content": f"hello {i}"}]
                )
                for i in range(8)
            ]
            return list(await asyncio.gather(*calls))

    answers = asyncio.run(burst())
    assert [a.parse().choices[0].message.content for a in answers] == [
        f"echo: hello {i}" for i in range(8)
    ]
    assert all(int(a.headers["x-cold-start-ms"]) > 0 for a in answers)
    assert metric(gw, STARTS) == 1, "concurrent first requests started more than one replica"
    assert metric(gw, READY) == 1

    # Idle: scaled back to zero after last_replica_idle_s, then started again on demand.
    deadline = time.monotonic() + 10
    while metric(gw, READY) != 0:
        assert time.monotonic() < deadline, "the idle replica was not stopped"
        time.sleep(0.2)
    again = httpx.post(
        gw.base_url + "/chat/completions",
        timeout=60,
        headers={"Authorization": f"Bearer {KEY}"},
        json={"model": "echo", "messages": [{"role": "user", "content": "back"}]},
    )
    assert again.status_code == 200 and "x-cold-start-ms" in again.headers
    assert metric(gw, STARTS) == 2
    timelines = [
        json.loads(line) for line in (tmp_path / "cold_starts.jsonl").read_text().splitlines()
    ]
    assert len(timelines) >= 2 and all(
        "total" in t["phases"] for t in timelines if t["outcome"] == "served"
    )


def test_busy_replica_is_not_stopped_while_it_serves(
    gateway_factory: GatewayFactory, tmp_path: Path
) -> None:
    gw = gateway_factory(process_config(tmp_path, fake_process_backend()))
    slow = httpx.post(
        gw.base_url + "/chat/completions",
        timeout=60,
        headers={"Authorization": f"Bearer {KEY}"},
        json={
            "model": "slow",
            "x_delay": 2.5,
            "messages": [{"role": "user", "content": "take your time"}],
        },
    )
    # last_replica_idle_s is 1 s, the request took 2.5 s after the start: it was not cut off.
    assert slow.status_code == 200


def test_crashed_replica_is_restarted_and_its_request_fails_clearly(
    gateway_factory: GatewayFactory, tmp_path: Path
) -> None:
    gw = gateway_factory(
        process_config(tmp_path, fake_process_backend(min_replicas=1, last_replica_idle_s=60))
    )
    headers = {"Authorization": f"Bearer {KEY}"}
    url = gw.base_url + "/chat/completions"

    def ask(model: str = "echo", **extra: Any) -> httpx.Response:
        body = {"model": model, "messages": [{"role": "user", "content": "x"}], **extra}
        return httpx.post(url, json=body, headers=headers, timeout=60)

    deadline = time.monotonic() + 30
    while metric(gw, READY) != 1:  # min_replicas: 1 is started with the gateway
        assert time.monotonic() < deadline
        time.sleep(0.1)
    assert ask().status_code == 200

    async def crash_during_request() -> httpx.Response:
        async with httpx.AsyncClient(timeout=60) as client:
            body = {"model": "slow", "x_delay": 3, "messages": [{"role": "user", "content": "x"}]}
            pending = asyncio.create_task(client.post(url, json=body, headers=headers))
            await asyncio.sleep(0.5)
            replica = await _replica_url(gw)
            with contextlib.suppress(httpx.HTTPError):  # it dies before answering
                await client.get(replica + "/_crash")
            return await pending

    failed = asyncio.run(crash_during_request())
    # Its connection broke; the retry found no ready replica (the crashed one is out):
    # a clear 503 with Retry-After, not a hang.
    assert failed.status_code == 503, failed.text
    assert "no replica" in failed.json()["error"]["message"]
    assert failed.headers["retry-after"] == "1"
    # The provider restarts it; the next request is held until it is ready, then served.
    assert ask().status_code == 200


async def _replica_url(gw: Gateway) -> str:
    async with httpx.AsyncClient() as client:
        ready = (await client.get(gw.url + "/readyz", headers=OPERATOR)).json()
    (base_url,) = ready["replicas"]["on-demand"]
    return str(base_url).removesuffix("/v1")


def test_bundled_worker_cold_starts_from_weights_staged_out_of_s3(
    gateway_factory: GatewayFactory, tmp_path: Path, s3_endpoint: str
) -> None:
    model_dir = write_tiny_chat_model(tmp_path / "tiny-chat")
    s3 = boto3.client(
        "s3",
        endpoint_url=s3_endpoint,
        region_name="us-east-1",
        aws_access_key_id="testing",
        aws_secret_access_key="moto-secret-abc",
    )
    s3.create_bucket(Bucket="coldstart")
    for file in sorted(model_dir.iterdir()):
        s3.put_object(Bucket="coldstart", Key=f"tiny/{file.name}", Body=file.read_bytes())
    s3.close()
    backend = {
        "name": "tiny",
        "kind": "process",
        "command": [
            "{python}",
            "-m",
            "backends.worker",
            "--port",
            "{port}",
            "--chat-model",
            "tiny-chat={weights}",
        ],
        "models": ["tiny-chat"],
        "weights": {"uri": "s3://coldstart/tiny/"},
        "scaling": {"min_replicas": 0, "max_replicas": 1},
    }
    staging = {
        "cache_dir": str(tmp_path / "weights"),
        "s3": {
            "endpoint_url": s3_endpoint,
            "access_key_id": "testing",
            "secret_access_key": "moto-secret-abc",
        },
    }
    gw = gateway_factory(process_config(tmp_path, backend, staging=staging))
    client = openai.OpenAI(base_url=gw.base_url, api_key=KEY, max_retries=0, timeout=180)
    raw = client.chat.completions.with_raw_response.create(
        model="tiny-chat", messages=[{"role": "user", "content": "hi"}], max_tokens=4
    )
    answer = raw.parse()
    assert answer.choices[0].message.content and answer.usage is not None
    assert int(raw.headers["x-cold-start-ms"]) > 0
    staged = list((tmp_path / "weights").glob("tiny-*/model.safetensors"))
    assert staged and staged[0].read_bytes() == (model_dir / "model.safetensors").read_bytes()
    record = json.loads((tmp_path / "cold_starts.jsonl").read_text().splitlines()[-1])
    assert {"staging", "loading", "total"} <= set(record["phases"])
    text = httpx.get(gw.url + "/metrics", headers=OPERATOR).text
    assert 'gateway_cold_start_seconds_bucket{backend="tiny",le=' in text
    assert "moto-secret-abc" not in gw.server.log()
