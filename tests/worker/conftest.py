"""The worker as a real subprocess on a free loopback port, serving MiniLM and a tiny LM."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest

from backends.worker.synthetic_model import write_synthetic_model
from backends.worker.tiny_model import write_tiny_chat_model
from bench.processes import ServerProcess, free_port

EMBEDDING_MODEL = "minilm"
CHAT_MODEL = "tiny-chat"
# Big enough to be sharded and to take measurable time to read; small enough to write fast.
SYNTHETIC_GB = 0.06
SYNTHETIC_SHARD_GB = 0.025


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_chat_model(tmp_path_factory.mktemp("models") / "tiny-chat")


@pytest.fixture(scope="session")
def synthetic_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("models") / "synthetic"
    return write_synthetic_model(folder, SYNTHETIC_GB, shard_gb=SYNTHETIC_SHARD_GB)


def worker_command(port: int, tiny_model_dir: Path, *extra: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "backends.worker",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--chat-model",
        f"{CHAT_MODEL}={tiny_model_dir}",
        "--max-tokens",
        "64",
        *extra,
    ]


@pytest.fixture(scope="session")
def worker_process(
    tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: Path
) -> Iterator[ServerProcess]:
    """A worker serving both models, at the default log level."""
    port = free_port()
    command = worker_command(port, tiny_model_dir, "--embedding-model", EMBEDDING_MODEL)
    log_path = tmp_path_factory.mktemp("worker") / "worker.log"
    server = ServerProcess(command, f"http://127.0.0.1:{port}/health", log_path)
    server.start(timeout_s=120)
    yield server
    assert server.stop() == 0, server.log()


@pytest.fixture(scope="session")
def worker(worker_process: ServerProcess) -> str:
    """Base URL (…/v1) of a worker serving both models."""
    return worker_process.ready_url.removesuffix("/health") + "/v1"


@pytest.fixture
def client(worker: str) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=worker, api_key="unused", max_retries=0, timeout=60) as client:
        yield client
