"""The worker's output stays readable: probes never logged, requests at debug level only,
no progress bars."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from bench.processes import ServerProcess, free_port
from tests.worker.conftest import CHAT_MODEL, worker_command
from tests.worker.test_worker import MESSAGES

PROBES = ["/health", "/startup", "/v1/models"]


def probe(base_url: str, times: int = 3) -> None:
    for _ in range(times):
        for path in PROBES:
            assert httpx.get(base_url + path).status_code == 200


def assert_no_probe_lines(log: str) -> None:
    for path in PROBES:
        assert path not in log, f"a probe of {path} was logged:\n{log}"


def test_default_level_logs_neither_probes_nor_requests(
    worker_process: ServerProcess, client: openai.OpenAI
) -> None:
    base_url = worker_process.ready_url.removesuffix("/health")
    probe(base_url)
    client.chat.completions.create(model=CHAT_MODEL, messages=MESSAGES, max_tokens=2)
    time.sleep(0.2)  # the line, if any, is written once the answer has gone out
    log = worker_process.log()
    # The start-up polled /health many times, and these probes came after it.
    assert_no_probe_lines(log)
    assert "/v1/chat/completions" not in log and '"GET ' not in log, log
    assert "Loading weights" not in log, "a progress bar in the log"


@pytest.fixture
def debug_worker(tmp_path: Path, tiny_model_dir: Path) -> Iterator[ServerProcess]:
    port = free_port()
    command = worker_command(port, tiny_model_dir, "--log-level", "debug")
    server = ServerProcess(command, f"http://127.0.0.1:{port}/health", tmp_path / "worker.log")
    server.start(timeout_s=120)
    yield server
    assert server.stop() == 0, server.log()


def test_debug_level_logs_each_request_once_answered_but_no_probe(
    debug_worker: ServerProcess,
) -> None:
    base_url = debug_worker.ready_url.removesuffix("/health")
    probe(base_url)
    with openai.OpenAI(base_url=base_url + "/v1", api_key="unused", max_retries=0) as client:
        client.chat.completions.create(
            model=CHAT_MODEL,
            messages=MESSAGES,
            max_tokens=2,
            extra_headers={"x-request-id": "trace-whole"},
        )
        chunks = client.completions.create(
            model=CHAT_MODEL,
            prompt="Hello",
            max_tokens=3,
            stream=True,
            extra_headers={"x-request-id": "trace-stream"},
        )
        assert len(list(chunks)) > 1
    invalid = httpx.post(base_url + "/v1/completions", json={"model": CHAT_MODEL, "prompt": []})
    assert invalid.status_code == 400
    probe(base_url)

    expected = [
        r"DEBUG backends\.worker\.access POST /v1/chat/completions 200 [\d.]+ ms "
        r"request_id=trace-whole$",
        r"DEBUG backends\.worker\.access POST /v1/completions 200 [\d.]+ ms "
        r"request_id=trace-stream$",
        r"DEBUG backends\.worker\.access POST /v1/completions 400 [\d.]+ ms request_id=-$",
    ]
    log = wait_for_lines(debug_worker, expected)
    assert_no_probe_lines(log)
    assert log.count("backends.worker.access") == 3, log


def wait_for_lines(server: ServerProcess, patterns: list[str], timeout_s: float = 10) -> str:
    deadline = time.monotonic() + timeout_s
    while True:
        log = server.log()
        missing = [p for p in patterns if not re.search(p, log, re.MULTILINE)]
        if not missing:
            return log
        if time.monotonic() > deadline:
            raise AssertionError(f"no line matches {missing}:\n{log}")
        time.sleep(0.05)
