"""Scale to zero with the real engine: the gateway starts vLLM's CPU build itself (a real
start of 35-50 s), holds a streamed request with keep-alives meanwhile and then
answers it, says where the start went (from vLLM's own log), and refuses at once a request
whose deadline is shorter than what a start takes, with `Retry-After`."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from backends.local_vllm import command_line, engine_python, environment
from backends.vllm_startup import phases
from bench.processes import Gateway
from tests.conftest import GatewayFactory, hash_of
from tests.engine.conftest import INTERACTIVE_KEY, MODEL, OPERATOR_KEY
from tests.engine.shared import ENGINE_FLAGS, engine_model

pytestmark = [pytest.mark.timeout(600), pytest.mark.serial]
HEADERS = {"authorization": f"Bearer {INTERACTIVE_KEY}"}
STARTS = 'gateway_cold_starts_total{backend="vllm-on-demand"}'
READY = 'gateway_backend_ready_replicas{backend="vllm-on-demand"}'


def on_demand(model: Path) -> dict[str, Any]:
    engine_env = environment({})
    return {
        "name": "vllm-on-demand",
        "kind": "process",
        "command": command_line(engine_python(), model, "{port}", name=MODEL, extra=ENGINE_FLAGS),
        "env": engine_env,
        "ready_path": "/health",
        "models": [MODEL],
        "engine": "vllm",
        "priority_scheduling": True,
        "scaling": {
            "min_replicas": 0,
            "max_replicas": 1,
            "idle_s": 0.5,
            "last_replica_idle_s": 1.0,
            "stable_window_s": 1.0,
            "ready_timeout_s": 400,
        },
    }


def metric(gateway: Gateway, name: str) -> float:
    headers = {"authorization": f"Bearer {OPERATOR_KEY}"}
    for line in httpx.get(gateway.url + "/metrics", headers=headers).text.splitlines():
        if line.startswith(name + " "):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def test_a_request_at_zero_is_held_through_a_real_vllm_start_and_answered(
    gateway_factory: GatewayFactory, tmp_path: Path
) -> None:
    # The shared engine's model and flags.
    model = engine_model()
    config = {
        "state": {"url": "memory", "path": str(tmp_path / "state.json")},
        "cache": {"enabled": False},
        "backends": [on_demand(model)],
        "tenants": [{"name": "t", "keys": [{"sha256": hash_of(INTERACTIVE_KEY)}]}],
    }
    gateway = gateway_factory(config, {"GATEWAY_OPERATOR_KEY": OPERATOR_KEY})
    assert metric(gateway, READY) == 0
    launched = time.time()
    body = {"model": MODEL, "prompt": "hello", "max_tokens": 4, "stream": True}
    gaps: list[float] = []
    # The first start has no learned estimate to set the held deadline from, and a real
    # one can outlast the class's default 60 s on a busy machine: the client says so.
    long_wait = {**HEADERS, "x-request-timeout": "400"}
    with httpx.stream(
        "POST", gateway.base_url + "/completions", json=body, headers=long_wait, timeout=400
    ) as answer:
        assert answer.status_code == 200
        cold_start_ms = answer.headers.get("x-cold-start-ms")
        last = time.monotonic()
        events = []
        for line in answer.iter_lines():
            now = time.monotonic()
            gaps.append(now - last)
            last = now
            events.append(line)
    held_s = time.time() - launched
    assert held_s > 10, "the engine cannot have started this fast: no real start was seen"
    assert max(gaps) < 16, gaps  # keep-alives kept the stream alive through the start
    assert any(line.startswith(":") for line in events)  # SSE comments: the keep-alives
    assert events[-2:] == ["data: [DONE]", ""] or "data: [DONE]" in events
    assert cold_start_ms is None or int(cold_start_ms) > 0
    assert metric(gateway, STARTS) == 1
    # Where the start went, in the cold-start record the report reads: vLLM's own phases
    # (from its log, which goes to engine-logs/ beside the state file), not one "loading".
    record = _served_start(tmp_path / "cold_starts.jsonl")
    engine = {k: v for k, v in record["phases"].items() if k.startswith("engine_")}
    # No compile phase: the CPU build starts with `-O0` (backends/local_vllm.py).
    expected = {"imports_and_processes", "weights", "kv_cache", "api_server"}
    assert {f"engine_{name}" for name in expected} <= set(engine), record
    assert "engine_compile_and_warmup" not in engine, record
    assert engine["engine_weights"] < 5  # the weights are not what takes a start its minute
    [log_file] = (tmp_path / "engine-logs").glob("*.log")
    log = log_file.read_text()
    assert phases(log, launched)["weights"] == engine["engine_weights"]

    # Back at zero, the learned start (35-50 s) outlasts a 3 s deadline: the request
    # that finds no replica is refused at once, with when to come back; the start it
    # asked for goes on (the gateway is stopped before it is over).
    _until(lambda: metric(gateway, READY) == 0, 60)
    sent = time.monotonic()
    refused = httpx.post(
        gateway.base_url + "/completions",
        json={"model": MODEL, "prompt": "x", "max_tokens": 1},
        headers={**HEADERS, "x-request-timeout": "3"},
        timeout=30,
    )
    assert time.monotonic() - sent < 1.0
    assert refused.status_code in (429, 503), refused.text
    assert int(refused.headers["retry-after"]) >= 5  # what the first start took, about
    assert refused.json()["error"]["message"]


def _served_start(path: Path) -> dict[str, Any]:
    _until(path.exists, 30)
    records = [json.loads(line) for line in path.read_text().splitlines() if line]
    served = [r for r in records if r["outcome"] == "served"]
    assert served, records
    return dict(served[0])


def _until(check: Any, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.2)
    pytest.fail(f"not within {timeout_s} s")
