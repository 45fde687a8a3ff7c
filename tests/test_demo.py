"""The demo as a user meets it: `config/demo.yaml` with its worker, and the README's snippet."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator

import httpx
import pytest

from backends.worker.tiny_model import write_tiny_chat_model
from bench.processes import OPERATOR, OPERATOR_KEY, ROOT, ServerProcess, free_port


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ServerProcess, int]]:
    data = tmp_path_factory.mktemp("demo")
    write_tiny_chat_model(data / "tiny-chat")
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k != "GATEWAY_DEMO_KEY"}
    env.update(GATEWAY_DATA_DIR=str(data), PORT=str(port), GATEWAY_OPERATOR_KEY=OPERATOR_KEY)
    server = ServerProcess(
        [sys.executable, "-m", "gateway.cli", "serve", "--config", "config/demo.yaml"],
        f"http://127.0.0.1:{port}/readyz",
        data / "gateway.log",
    )
    server.env = env
    server.start(timeout_s=180)
    yield server, port
    assert server.stop() == 0
    assert not list(data.glob("*.tmp*")), "left temporary files behind"


def _readme_python() -> str:
    readme = (ROOT / "README.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", readme, re.S)
    assert blocks, "README has no python example"
    return str(blocks[0])


def test_readme_openai_snippet_answers(demo: tuple[ServerProcess, int]) -> None:
    server, port = demo
    printed = re.search(r"export GATEWAY_DEMO_KEY=(sk-gw-\S+)", server.log())
    assert printed, "the generated demo key was not printed"
    key = printed.group(1)
    snippet = _readme_python().replace("127.0.0.1:8080", f"127.0.0.1:{port}")
    result = subprocess.run(
        [sys.executable, "-c", snippet],
        capture_output=True,
        text=True,
        env={**os.environ, "GATEWAY_DEMO_KEY": key},
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert "embedding dimension: 384" in result.stdout
    answer = re.search(r"^answer: (.*)$", result.stdout, re.M)
    assert answer and answer.group(1).strip()
    usage = re.search(r"completion_tokens=(\d+).*prompt_tokens=(\d+)", result.stdout)
    assert usage and 1 <= int(usage.group(1)) <= 8 and int(usage.group(2)) > 0
    # The key was printed once for the operator, and is not in any access-log line.
    assert server.log().count(key) == 1


def test_demo_is_ready_and_lists_its_models(demo: tuple[ServerProcess, int]) -> None:
    server, port = demo
    key = re.search(r"export GATEWAY_DEMO_KEY=(sk-gw-\S+)", server.log())
    assert key
    models = httpx.get(
        f"http://127.0.0.1:{port}/v1/models", headers={"Authorization": f"Bearer {key.group(1)}"}
    ).json()
    assert sorted(m["id"] for m in models["data"]) == ["all-MiniLM-L6-v2", "tiny-chat"]
    ready = httpx.get(f"http://127.0.0.1:{port}/readyz", headers=OPERATOR).json()
    assert ready["backends"] == {"local-worker": True}
