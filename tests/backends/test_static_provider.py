"""StaticProvider: always-on upstreams, optionally probed (a real mini server as the upstream)."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from backends.providers.errors import ReplicaNotFound
from backends.providers.replicas import Replica
from backends.providers.static import StaticProvider
from bench.processes import ServerProcess, free_port
from tests.backends.support import MINI_SERVER, phases, record, running, wait_until


@pytest.fixture
def upstream(tmp_path: Path) -> Iterator[ServerProcess]:
    port = free_port()
    command = [sys.executable, str(MINI_SERVER), "--port", str(port), "--state-dir", str(tmp_path)]
    server = ServerProcess(command, f"http://127.0.0.1:{port}/health", tmp_path / "mini.log")
    yield server.start(timeout_s=10)
    server.stop()


async def test_unprobed_upstreams_are_always_ready() -> None:
    provider = StaticProvider("up", ["http://a.invalid/v1", "http://b.invalid/v1"])
    async with running(provider):
        await provider.ensure(0)  # not ours to stop
        assert provider.ready() == [
            Replica("up/0", "http://a.invalid/v1"),
            Replica("up/1", "http://b.invalid/v1"),
        ]
        assert provider.starting() == 0
        await provider.stop_replica("up/0")
        assert len(provider.ready()) == 2
        with pytest.raises(ReplicaNotFound):
            await provider.stop_replica("up/9")


async def test_probed_upstreams_are_ready_while_their_probe_passes(
    upstream: ServerProcess,
) -> None:
    live = upstream.ready_url.removesuffix("/health") + "/v1"
    dead = f"http://127.0.0.1:{free_port()}/v1"
    provider = StaticProvider("up", [live, dead], ready_path="/health", probe_interval_s=0.05)
    events = record(provider)
    async with running(provider):
        assert provider.ready() == [Replica("up/0", live)]
        upstream.kill()
        await wait_until(lambda: "crashed" in phases(events), "the failed probe")
        assert provider.ready() == []
    assert phases(events) == ["ready", "crashed"]
    assert events[1].detail == "/health probe failed"
