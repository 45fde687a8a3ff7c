"""The real engine: vLLM's CPU build (`make engine`, backends/local_vllm.py), started once
for the whole session (35-50 s here, most of it imports; launched at collection, so that
the start overlaps the rest of the suite), and a gateway in front of it.

The engine runs with `--max-num-seqs 4`, so that a handful of requests fills its batch and
the rest wait in its own queue: what its priority scheduling and its metrics are tested on.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import openai
import pytest

from backends.local_vllm import ENGINE_NAME
from bench.processes import Gateway, start_gateway
from tests.conftest import hash_of
from tests.engine.shared import MAX_NUM_SEQS, MODEL, Engine, EngineMissing, engine_for_this_run

START_TIMEOUT_S = 360.0
INTERACTIVE_KEY = "sk-test-engine-interactive-0123456789"
BATCH_KEY = "sk-test-engine-batch-0123456789abcdef"
OTHER_KEY = "sk-test-engine-other-0123456789abcdef"
OPERATOR_KEY = "sk-test-engine-operator-0123456789abcdef"  # reads /metrics

# The run's engine, and whether this process stops it (under xdist the controller does).
ENGINE_KEY = pytest.StashKey[tuple[Engine, bool]]()


@pytest.hookimpl(trylast=True)  # after `-m` deselected: no engine for a run without its tests
def pytest_collection_modifyitems(
    session: pytest.Session, config: pytest.Config, items: list[pytest.Item]
) -> None:
    """When the run holds real-engine tests, the engine starts now, in the background, and
    those tests go last (under xdist, `--dist loadscope`: each module on one worker): its
    35-50 s start overlaps the rest of the suite instead of adding to it (most of the suite
    waits on sockets, not on the cores)."""
    here = Path(__file__).parent
    engine_items = [item for item in items if here in item.path.parents]
    if not engine_items:
        return
    items[:] = [item for item in items if item not in engine_items] + engine_items
    needed = any("vllm_engine" in getattr(item, "fixturenames", ()) for item in engine_items)
    if needed and ENGINE_KEY not in config.stash:
        config.stash[ENGINE_KEY] = _started(Path(config.rootpath))


def _started(root: Path) -> tuple[Engine, bool]:
    try:
        return engine_for_this_run(root)
    except EngineMissing as exc:
        pytest.exit(str(exc), 2)


def pytest_unconfigure(config: pytest.Config) -> None:
    """However the run ended (an earlier failure under -x, Ctrl-C), the engine stops."""
    engine, owned = config.stash.get(ENGINE_KEY, (None, False))
    if engine is not None and owned:
        engine.stop()
        shutil.rmtree(Path(engine.log_path).parent, ignore_errors=True)


@pytest.fixture(scope="session")
def vllm_engine(pytestconfig: pytest.Config) -> Engine:
    if ENGINE_KEY not in pytestconfig.stash:  # collected in some other way: start it now
        pytestconfig.stash[ENGINE_KEY] = _started(Path(pytestconfig.rootpath))
    engine, _ = pytestconfig.stash[ENGINE_KEY]
    engine.wait_ready(START_TIMEOUT_S)
    return engine


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


@pytest.fixture(scope="module")
def agent_gateway(vllm_gateway: Gateway) -> Gateway:
    """The gateway `claude` and `codex` talk to; a module overrides it for its own."""
    return vllm_gateway


def claude_of(gateway: Gateway) -> anthropic.Anthropic:
    """The official Anthropic client for `gateway`, with the interactive tenant's key."""
    return anthropic.Anthropic(
        base_url=gateway.url, api_key=INTERACTIVE_KEY, max_retries=0, timeout=120
    )


@pytest.fixture(scope="module")
def claude(agent_gateway: Gateway) -> Iterator[anthropic.Anthropic]:
    """The official Anthropic client, with the interactive tenant's key."""
    with claude_of(agent_gateway) as client:
        yield client


@pytest.fixture(scope="module")
def codex(agent_gateway: Gateway) -> Iterator[openai.OpenAI]:
    """The official OpenAI client, with the interactive tenant's key."""
    with openai.OpenAI(
        base_url=agent_gateway.base_url, api_key=INTERACTIVE_KEY, max_retries=0, timeout=120
    ) as client:
        yield client


__all__ = ["ENGINE_NAME", "MAX_NUM_SEQS", "MODEL", "Engine"]
