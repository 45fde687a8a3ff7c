"""The real engine: vLLM's CPU build (`make engine`, backends/local_vllm.py), started once
for the whole session (60-90 s here, most of it compiling; launched at collection, so that
the start overlaps the rest of the suite), and a gateway in front of it.

The engine runs with `--max-num-seqs 4`, so that a handful of requests fills its batch and
the rest wait in its own queue: what its priority scheduling and its metrics are tested on.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from backends.local_vllm import (
    ENGINE_NAME,
    command_line,
    default_model,
    engine_python,
    environment,
)
from backends.worker.tiny_model import VLLM, write_tiny_chat_model
from tests.conftest import hash_of
from tests.support.processes import Gateway, ServerProcess, free_port, start_gateway

MODEL = "tiny-vllm"
MAX_NUM_SEQS = 4
START_TIMEOUT_S = 360.0
INTERACTIVE_KEY = "sk-test-engine-interactive-0123456789"
BATCH_KEY = "sk-test-engine-batch-0123456789abcdef"
OTHER_KEY = "sk-test-engine-other-0123456789abcdef"
OPERATOR_KEY = "sk-test-engine-operator-0123456789abcdef"  # reads /metrics


@dataclass(frozen=True)
class Engine:
    url: str  # server root: /metrics, /health
    base_url: str  # .../v1
    process: ServerProcess


ENGINE_KEY = pytest.StashKey[Engine]()


def pytest_collection_modifyitems(
    session: pytest.Session, config: pytest.Config, items: list[pytest.Item]
) -> None:
    """When the run holds real-engine tests, the engine starts now, in the background, and
    those tests go last: its 60-90 s start overlaps the rest of the suite instead of
    adding to it (most of the suite waits on sockets, not on the cores)."""
    here = Path(__file__).parent
    engine_items = [item for item in items if here in item.path.parents]
    if not engine_items or ENGINE_KEY in config.stash:
        return
    items[:] = [item for item in items if item not in engine_items] + engine_items
    if any("vllm_engine" in getattr(item, "fixturenames", ()) for item in engine_items):
        config.stash[ENGINE_KEY] = _launch(Path(config.rootpath))


def pytest_unconfigure(config: pytest.Config) -> None:
    """However the run ended (an earlier failure under -x, Ctrl-C), the engine stops."""
    engine = config.stash.get(ENGINE_KEY, None)
    if engine is not None:
        engine.process.stop()


def _launch(root: Path) -> Engine:
    python = engine_python(root)
    if not python.exists():
        pytest.exit(f"{python} is missing: `make test` installs it (`make engine`)", 2)
    folder = Path(tempfile.mkdtemp(prefix="vllm-engine-"))
    # The model `make engine` writes, at the same path every run: vLLM keys its cache of
    # compiled graphs (~/.cache/vllm) by it, and a start that finds them skips half its
    # compilation (12 s instead of 29 here).
    model = write_tiny_chat_model(default_model(root), shape=VLLM)
    port = free_port()
    extra = ["--max-num-seqs", str(MAX_NUM_SEQS)]
    server = ServerProcess(
        command_line(python, model, port, name=MODEL, extra=extra),
        f"http://127.0.0.1:{port}/health",
        folder / "vllm.log",
        env=environment(),
    )
    server.launch()
    return Engine(f"http://127.0.0.1:{port}", f"http://127.0.0.1:{port}/v1", server)


@pytest.fixture(scope="session")
def vllm_engine(pytestconfig: pytest.Config) -> Iterator[Engine]:
    engine = pytestconfig.stash.get(ENGINE_KEY, None)
    if engine is None:  # collected in some other way: start it now
        engine = pytestconfig.stash[ENGINE_KEY] = _launch(Path(pytestconfig.rootpath))
    engine.process.wait_ready(START_TIMEOUT_S)
    yield engine
    engine.process.stop()
    shutil.rmtree(engine.process.log_path.parent, ignore_errors=True)


def vllm_backend(engine: Engine, **overrides: Any) -> dict[str, Any]:
    backend: dict[str, Any] = {
        "name": "vllm",
        "kind": "http",
        "base_url": engine.base_url,
        "models": [MODEL],
        "engine": "vllm",
        "priority_scheduling": True,
    }
    backend.update(overrides)
    return backend


def tenants() -> list[dict[str, Any]]:
    return [
        {
            "name": "interactive",
            "priority": "interactive",
            "keys": [{"sha256": hash_of(INTERACTIVE_KEY)}],
        },
        {"name": "batch", "priority": "batch", "keys": [{"sha256": hash_of(BATCH_KEY)}]},
        {"name": "other", "priority": "interactive", "keys": [{"sha256": hash_of(OTHER_KEY)}]},
    ]


@pytest.fixture(scope="module")
def vllm_gateway(
    vllm_engine: Engine, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Gateway]:
    """The gateway in front of the engine, its semantic cache off (every request must reach
    the engine), its limit fixed above the engine's batch (requests queue in vLLM)."""
    config = {
        "state": {"url": "memory", "path": str(tmp_path_factory.mktemp("state") / "s.json")},
        "backends": [vllm_backend(vllm_engine, max_concurrency=32, concurrency={"mode": "fixed"})],
        "cache": {"enabled": False},
        "tenants": tenants(),
    }
    env = {"GATEWAY_OPERATOR_KEY": OPERATOR_KEY}
    gateway = start_gateway(config, tmp_path_factory.mktemp("gateway"), env)
    yield gateway
    gateway.stop()


__all__ = ["ENGINE_NAME", "Engine"]
