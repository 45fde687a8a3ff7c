"""Shared fixtures: a real Redis, the fake upstream, gateways as real processes."""

from __future__ import annotations

import os
import re
import shutil
import sys
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from bench.fake_upstream import fake_backend
from bench.processes import (
    Gateway,
    RedisServer,
    ServerProcess,
    free_port,
    redis_answers,
    start_fake_upstream,
    start_gateway,
)

GatewayFactory = Callable[..., Gateway]


# What must never appear in any log a test process wrote: API keys (the gateway's `sk-gw-`
# keys and the tests' `sk-test-` keys), the fake upstream's credential, the test S3 secret.
SECRETS = re.compile(rb"sk-(?:gw|test)-[A-Za-z0-9_-]{6,}|upstream-secret-xyz|test-secret")
# The one exception: a key the gateway generated for an unset `{env: NAME}` is printed once,
# on purpose, to the operator's terminal (`make run`), as `export NAME=KEY`.
GENERATED = re.compile(rb"\n    export [A-Z][A-Z0-9_]*=\Z")


SHARED_ENGINE = pytest.StashKey[Path]()


def pytest_configure(config: pytest.Config) -> None:
    """Under pytest-xdist, the controller: a folder where the workers it spawns share one
    real engine (tests/engine/shared.py)."""
    if getattr(config.option, "numprocesses", None) and not hasattr(config, "workerinput"):
        from tests.engine.shared import share_with_workers

        config.stash[SHARED_ENGINE] = share_with_workers()


def pytest_unconfigure(config: pytest.Config) -> None:
    folder = config.stash.get(SHARED_ENGINE, None)
    if folder is not None:  # every worker is done: the engine one of them started stops
        from tests.engine.shared import stop_shared

        stop_shared(folder)
        shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture(scope="session", autouse=True)
def no_secret_in_any_log(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """After the whole run, scan every log the gateways, workers and upstreams wrote."""
    yield
    leaks = []
    for path in tmp_path_factory.getbasetemp().rglob("*"):
        if path.is_file() and path.suffix in {".log", ".jsonl"}:
            data = path.read_bytes()
            for match in SECRETS.finditer(data):
                if not GENERATED.search(data, 0, match.start()):
                    leaks.append(f"{path}: {match.group().decode(errors='replace')}")
    assert not leaks, "secrets in logs:\n" + "\n".join(leaks[:20])


@pytest.fixture(scope="session")
def redis_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """REDIS_URL if a Redis answers there; otherwise a redis-server started for the session."""
    url = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379")
    if redis_answers(url):
        yield url
        return
    binary = shutil.which("redis-server")
    if binary is None:
        pytest.fail(
            f"no Redis answers at {url} and redis-server is not installed: "
            "install it (Debian/Ubuntu: apt install redis-server) or set REDIS_URL"
        )
    try:
        server = RedisServer(tmp_path_factory.mktemp("redis"), binary)
    except RuntimeError as exc:
        pytest.fail(str(exc))
    yield server.url
    server.kill()


@pytest.fixture(scope="session")
def fake_upstream(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """Base URL (…/v1) of the fake OpenAI-style upstream."""
    server, base_url = start_fake_upstream(tmp_path_factory.mktemp("upstream"))
    yield base_url
    server.stop()


@pytest.fixture(scope="module")
def rich_upstream(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """Base URL (…/v1) of the upstream that streams reasoning, tool calls and refusals
    (tests/support/rich_upstream.py), one per test module (its request count is the
    module's)."""
    port = free_port()
    server = ServerProcess(
        [sys.executable, "-m", "tests.support.rich_upstream", "--port", str(port)],
        f"http://127.0.0.1:{port}/v1/models",
        tmp_path_factory.mktemp("rich") / "rich-upstream.log",
    ).start()
    yield f"http://127.0.0.1:{port}/v1"
    server.stop()


@pytest.fixture
def redis_prefix() -> str:
    return "test-" + uuid.uuid4().hex[:12]


@pytest.fixture
def gateway_factory(tmp_path: Path) -> Iterator[GatewayFactory]:
    started: list[Gateway] = []

    def start(config: dict[str, Any], env: dict[str, str] | None = None, **kw: Any) -> Gateway:
        gateway = start_gateway(config, tmp_path, env, **kw)
        started.append(gateway)
        return gateway

    yield start
    for gateway in started:
        gateway.stop()


def rich_backend(base_url: str) -> dict[str, Any]:
    """The backend of the rich upstream (`rich_upstream`): reasoning, tool calls, refusals."""
    from tests.support.rich_upstream import MODELS

    return {"name": "rich", "kind": "http", "base_url": base_url, "models": list(MODELS)}


def uncached_config(
    upstream: str, state: dict[str, Any], tenants: list[dict[str, Any]], **extra: Any
) -> dict[str, Any]:
    """A gateway in front of the fake upstream with its cache off: for the tests of keys,
    tenants and the rest, which a cached answer would only get in the way of."""
    return {
        "state": state,
        "backends": [fake_backend(upstream)],
        "cache": {"enabled": False},
        "tenants": tenants,
        **extra,
    }


def hash_of(key: str) -> str:
    import hashlib

    return hashlib.sha256(key.encode()).hexdigest()


__all__ = ["ServerProcess", "fake_backend", "hash_of"]
