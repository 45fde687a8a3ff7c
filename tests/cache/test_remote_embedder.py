"""The cache's embedder served by the deployment (cache/remote_embedder.py): the bundled
worker serving the packaged MiniLM as an OpenAI embeddings endpoint (a real subprocess),
calibrated with `gateway cache calibrate` on a small labelled fixture, then behind a real
gateway: a paraphrase is a hit at the calibrated threshold, a guard still refuses, and
with the endpoint gone lookups fail open and requests are answered."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import orjson
import pytest
import yaml

from bench.processes import ServerProcess, free_port, start_gateway
from cache.calibration import Calibration, read_pairs
from cache.remote_embedder import RemoteEmbedderError, RemoteEncoder, embedder_identity
from tests.conftest import fake_backend, hash_of

PAIRS = Path(__file__).parent / "fixtures" / "calibration-pairs.jsonl"
KEY = "sk-test-remote-embedder-0123456789"
MODEL = "minilm"


def _worker(folder: Path) -> ServerProcess:
    port = free_port()
    command = [sys.executable, "-m", "backends.worker", "--host", "127.0.0.1"]
    command += ["--port", str(port), "--embedding-model", MODEL]
    server = ServerProcess(command, f"http://127.0.0.1:{port}/health", folder / "worker.log")
    return server.start(timeout_s=120)


def _base_url(server: ServerProcess) -> str:
    return server.ready_url.removesuffix("/health") + "/v1"


@pytest.fixture(scope="module")
def embeddings(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    server = _worker(tmp_path_factory.mktemp("worker"))
    yield _base_url(server)
    server.stop()


def test_vectors_come_back_unit_length_in_order(embeddings: str) -> None:
    encoder = RemoteEncoder(embeddings, MODEL, timeout_s=30)
    try:
        texts = ["How do I reset my password?", "How can I reset my password?", "Why salt?"]
        vectors = [e.vector for e in encoder.encode(texts)]
        assert encoder.dimension == 384 and encoder.identity == embedder_identity(embeddings, MODEL)
        assert all(abs(float(np.linalg.norm(v)) - 1) < 1e-5 for v in vectors)
        assert float(vectors[0] @ vectors[1]) > float(vectors[0] @ vectors[2])
    finally:
        encoder.close()
    with pytest.raises(RemoteEmbedderError, match="status"):
        RemoteEncoder(embeddings, "no-such-model")
    with pytest.raises(RemoteEmbedderError, match="ConnectError"):
        RemoteEncoder(f"http://127.0.0.1:{free_port()}/v1", MODEL)


def _config(work: Path, embeddings: str, fake_upstream: str) -> dict[str, Any]:
    return {
        "state": {"url": "memory", "path": str(work / "state.json")},
        "backends": [fake_backend(fake_upstream)],
        "cache": {
            "path": str(work / "cache"),
            "lookup_budget_ms": 3000,
            "embedder_endpoint": {"base_url": embeddings, "model": MODEL, "timeout_s": 5},
        },
        "tenants": [{"name": "t", "keys": [{"sha256": hash_of(KEY)}]}],
    }


def _calibrate(config_path: Path) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "gateway.cli", "cache", "calibrate"]
    command += ["--config", str(config_path), "--pairs", str(PAIRS), "--precision", "0.95"]
    return subprocess.run(command, capture_output=True, text=True, timeout=120)


def _ask(url: str, prompt: str) -> httpx.Response:
    body = {"model": "echo", "messages": [{"role": "user", "content": prompt}], "temperature": 0}
    headers = {"authorization": f"Bearer {KEY}"}
    return httpx.post(f"{url}/v1/chat/completions", json=body, headers=headers, timeout=30)


def test_calibrated_hits_guards_and_failing_open(tmp_path: Path, fake_upstream: str) -> None:
    server = _worker(tmp_path)
    config = _config(tmp_path, _base_url(server), fake_upstream)
    config_path = tmp_path / "gateway.yaml"
    config_path.write_text(yaml.safe_dump(config))
    done = _calibrate(config_path)
    assert done.returncode == 0, done.stdout + done.stderr
    calibration = Calibration.load(tmp_path / "cache" / "calibration.json")
    assert calibration is not None and calibration.threshold is not None
    assert calibration.pairs == len(read_pairs(PAIRS)) and calibration.precision >= 0.95
    gateway = start_gateway(config, tmp_path, timeout_s=120)
    try:
        assert _ask(gateway.url, "How do I reset my password?").headers["x-cache"] == "miss"
        hit = _ask(gateway.url, "How can I reset my password?")
        assert hit.headers["x-cache"] == "hit" and hit.headers["x-cache-tier"] == "semantic"
        assert float(hit.headers["x-cache-similarity"]) >= calibration.threshold
        assert orjson.loads(hit.content)["choices"][0]["message"]["content"] == (
            "echo: How do I reset my password?"
        )
        other = _ask(gateway.url, "How do I reset my 2 passwords?")  # the numbers guard
        assert other.headers["x-cache"] == "miss"
        server.stop()  # the embedder goes away: lookups fail open, answers still come
        gone = _ask(gateway.url, "How could I reset my password?")
        assert gone.status_code == 200 and gone.headers["x-cache"] == "miss"
    finally:
        gateway.stop()
        server.stop()


def test_without_a_calibration_no_semantic_hit_is_served(
    embeddings: str, fake_upstream: str, tmp_path: Path
) -> None:
    gateway = start_gateway(_config(tmp_path, embeddings, fake_upstream), tmp_path, timeout_s=120)
    try:
        assert _ask(gateway.url, "What is the capital of France?").headers["x-cache"] == "miss"
        again = _ask(gateway.url, "What's the capital city of France?")
        assert again.headers["x-cache"] == "miss"
        assert again.headers.get("x-cache-miss-reason") == "refused:semantic_tier_off"
        assert _ask(gateway.url, "What is the capital of France?").headers["x-cache"] == "hit"
    finally:
        gateway.stop()
