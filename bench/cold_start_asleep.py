"""The `asleep` scenario of bench/cold_start.py: time to first token from a replica whose
engine sleeps (vLLM's sleep mode, level 1), beside the engine's own wake time.

A fresh gateway with one `process` backend, `engine: vllm` and `sleep: true`, running
bench.fake_engine with `--enable-sleep-mode --wake-s WAKE_S`: one request starts it, the
gateway puts it to sleep once it is idle (`idle_s`), and then one streaming request
(max_tokens 1) is timed to the chunk that carries its token, held while the gateway wakes
the engine. The fake engine's /_stats says how long its own wake took in the same run.

    ttft_s {scenario: asleep}   request sent -> the token's chunk, at the client
    wake_s                      the fake engine's own wake: its /wake_up call, start to end
    phase_s {scenario: asleep, phase: wake, first_byte, total}   the gateway's timeline
    gateway_wake_overhead_s     ttft_s - wake_s: noticing the request, the wake and
                                readiness calls, releasing it, forwarding, one engine step
    target_met                  ttft_s <= 1.5 x wake_s + 0.05 s

No GPU runs: the engine is the fake (bench/fake_engine.py; 0.26 s is vLLM's wake time for
a small model), so what is measured is the gateway around a wake, not a real wake.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import orjson

from bench.processes import OPERATOR, Gateway, start_gateway

WAKE_S = 0.26
MODEL = "asleep-llm"
KEY = "bench-" + "s" * 40
IDLE_S = 0.5  # until the gateway puts the idle replica to sleep
TARGET = "asleep ttft_s <= 1.5 x wake_s + 0.05"
Emit = Callable[..., None]


def config(state_dir: Path) -> dict[str, Any]:
    command = ["{python}", "-m", "bench.fake_engine", "--port", "{port}", "--model", MODEL]
    command += ["--enable-sleep-mode", "--wake-s", str(WAKE_S)]
    return {
        "state": {"url": "memory", "path": str(state_dir / "state.json")},
        "cache": {"enabled": False},
        "backends": [
            {
                "name": "asleep",
                "kind": "process",
                "command": command,
                "models": [MODEL],
                "engine": "vllm",
                "sleep": True,
                "scaling": {
                    **{"idle_s": IDLE_S, "sleep_s": 600, "stable_window_s": IDLE_S},
                    "panic_window_s": 0.1,
                },
            }
        ],
        "tenants": [
            {"name": "bench", "keys": [{"sha256": hashlib.sha256(KEY.encode()).hexdigest()}]}
        ],
    }


def run(
    work_dir: Path, common: dict[str, Any], emit: Emit, progress: Callable[[str], None]
) -> bool:
    """The scenario, its figures emitted; True when it failed."""
    state_dir = work_dir / "gateway-asleep"
    state_dir.mkdir()
    gateway = start_gateway(config(state_dir), state_dir, timeout_s=120)
    try:
        progress("asleep: gateway up; one request to start the engine")
        first, _ = first_token(gateway)
        engine = engine_url(gateway)
        if first is None or engine is None:
            return _failed(emit, progress, common, "the first request failed", gateway)
        wait_asleep(engine)
        time.sleep(0.2)  # settled, as it would be long after
        progress("asleep: engine asleep; timing one request")
        ttft, cold_ms = first_token(gateway)
        stats = httpx.get(engine + "/_stats", timeout=5).json()
        if ttft is None or stats.get("last_wake_s") is None or stats["wakes"] != 1:
            return _failed(emit, progress, common, f"no wake: {stats}", gateway)
        _report(emit, common, ttft, cold_ms, float(stats["last_wake_s"]), state_dir)
        return False
    finally:
        gateway.stop()


def first_token(gateway: Gateway) -> tuple[float | None, int | None]:
    """One streaming request: seconds to its token's chunk, and `x-cold-start-ms`."""
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Hello"}], "max_tokens": 1}
    headers = {"Authorization": f"Bearer {KEY}"}
    started = time.perf_counter()
    url = gateway.base_url + "/chat/completions"
    with httpx.stream("POST", url, json={**body, "stream": True}, headers=headers, timeout=60) as r:
        cold = r.headers.get("x-cold-start-ms")
        for line in r.iter_lines() if r.status_code == 200 else ():
            if line.startswith("data: {") and _has_token(line):
                return time.perf_counter() - started, int(cold) if cold else None
    return None, None


def _has_token(line: str) -> bool:
    choice = (orjson.loads(line[6:]).get("choices") or [{}])[0]
    return bool((choice.get("delta") or {}).get("content") or choice.get("finish_reason"))


def engine_url(gateway: Gateway) -> str | None:
    ready = httpx.get(gateway.url + "/readyz", timeout=5, headers=OPERATOR).json()
    urls = ready.get("replicas", {}).get("asleep") or []
    return str(urls[0]).removesuffix("/v1") if urls else None


def wait_asleep(engine: str, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not httpx.get(engine + "/is_sleeping", timeout=5).json()["is_sleeping"]:
        if time.monotonic() > deadline:
            raise RuntimeError(f"the engine at {engine} was not put to sleep in {timeout_s} s")
        time.sleep(0.05)


def _report(
    emit: Emit,
    common: dict[str, Any],
    ttft: float,
    cold_ms: int | None,
    wake: float,
    state_dir: Path,
) -> None:
    scenario = {"scenario": "asleep", **common}
    emit("ttft_s", round(ttft, 4), "s", cold_start_ms=cold_ms, **scenario)
    emit("wake_s", round(wake, 4), "s", source="fake engine /_stats: its /wake_up", **common)
    for phase, seconds in _wake_phases(state_dir).items():
        emit("phase_s", round(seconds, 4), "s", phase=phase, source="gateway timeline", **scenario)
    emit("gateway_wake_overhead_s", round(ttft - wake, 4), "s", **scenario)
    limit = 1.5 * wake + 0.05
    emit(
        "target_met",
        int(ttft <= limit),
        "bool",
        target=TARGET,
        observed=round(ttft, 4),
        limit=round(limit, 4),
        **common,
    )


def _wake_phases(state_dir: Path) -> dict[str, float]:
    path = state_dir / "cold_starts.jsonl"
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        lines = path.read_text().splitlines() if path.exists() else []
        wakes = [r for r in map(orjson.loads, lines) if r.get("kind") == "wake"]
        if wakes:
            return {k: float(v) for k, v in wakes[-1]["phases"].items()}
        time.sleep(0.05)
    return {}


def _failed(
    emit: Emit, progress: Callable[[str], None], common: dict[str, Any], why: str, gateway: Gateway
) -> bool:
    emit("ttft_s", -1, "s", error=why, scenario="asleep", **common)
    progress(f"asleep: {why}; gateway log (tail):\n{gateway.server.log()[-3000:]}")
    return True
